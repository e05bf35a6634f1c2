"""``p2pfsm conform``: a conformance suite for any implementation of the protocol.

A tester peer speaks the protocol over real ZeroMQ and real NIXL to the implementation
under test, in the role opposite to the one tested, and holds every frame the target
sends to what p2pfsm's machines allow at that point: the tester's own side is p2pfsm's
sans-IO :class:`~p2pfsm.session.Session`, so a frame it would reject is a failure. One
module per job: :mod:`~p2pfsm.tools.conform.verdict` (results), :mod:`~p2pfsm.tools.conform.target`
(what the target is), :mod:`~p2pfsm.tools.conform.tester` (the wire peer and its oracle),
:mod:`~p2pfsm.tools.conform.registry` (cases by id), :mod:`~p2pfsm.tools.conform.producer_cases`,
:mod:`~p2pfsm.tools.conform.producer_lookup_cases`,
:mod:`~p2pfsm.tools.conform.consumer_cases` and
:mod:`~p2pfsm.tools.conform.consumer_session_cases` (the directed cases of each role),
:mod:`~p2pfsm.tools.conform.runner` (runs them), the randomized mode
(:mod:`~p2pfsm.tools.conform.walk_tester`: a tester that records its session's calls and
faults its side; :mod:`~p2pfsm.tools.conform.walk_run`: one walk, drawn or replayed, checked
online; :mod:`~p2pfsm.tools.conform.shrink`: delta debugging;
:mod:`~p2pfsm.tools.conform.counterexample`: the case in the models' terms and its replay file;
:mod:`~p2pfsm.tools.conform.spec_check`: TLC trace validation of a walk;
:mod:`~p2pfsm.tools.conform.random_walk` and
:mod:`~p2pfsm.tools.conform.walk_command`: the mode end to end),
:mod:`~p2pfsm.tools.conform.report`
(JSON and Markdown), :mod:`~p2pfsm.tools.conform.command` (the CLI driver).
"""

from __future__ import annotations

from p2pfsm.tools.conform.verdict import CaseFailure, CaseResult, NotApplicable, Verdict

__all__ = ["CaseFailure", "CaseResult", "NotApplicable", "Verdict"]
