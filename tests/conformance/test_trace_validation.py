"""Trace validation: runs of the real sessions (SimWorld, seeded) are behaviours of the spec.

Each ``Session.handle`` call is logged as (spec action, peer, machine steps taken); one
TLC run of ``tla/TraceP2P.tla`` must explain every trace, with frame contents, keys and
the hosts' answers hidden, and must reject a trace whose steps were tampered with.
"""

from __future__ import annotations

import pytest

from p2pfsm.fsm import machines
from p2pfsm.verify.traces import TraceEvent, TraceValidation, random_trace, validate

SEEDS = range(10)


def _corrupt(trace: list[TraceEvent]) -> list[TraceEvent]:
    """The first call that settled a round, claimed to have left the round as it was."""
    bad = list(trace)
    i = next(i for i, e in enumerate(bad)
             if any(step[1] == "settle" and step[2] != step[3] for step in e.steps))
    event = bad[i]
    bad[i] = TraceEvent(event.action, event.peer,
                        frozenset(s for s in event.steps if s[1] != "settle"))
    return bad


@pytest.fixture(scope="module")
def traces() -> list[list[TraceEvent]]:
    return [random_trace(seed) for seed in SEEDS]


@pytest.fixture(scope="module")
def validation(require_tlc: None, traces: list[list[TraceEvent]]) -> TraceValidation:
    corrupted = next(_corrupt(t) for t in traces
                     if any(s[1] == "settle" and s[2] != s[3] for e in t for s in e.steps))
    return validate([*traces, corrupted])


def test_traces_are_not_trivial(traces: list[list[TraceEvent]]) -> None:
    assert all(len(t) >= 10 for t in traces)
    actions = {e.action for t in traces for e in t}
    assert {"ClientRoundHostFetch", "ServerRoundRecvFetch", "ClientRoundRecvTransferDone",
            "ServerRoundWriteDone"} <= actions


def test_every_recorded_trace_is_explained(
    validation: TraceValidation, traces: list[list[TraceEvent]],
) -> None:
    recorded = set(range(1, len(traces) + 1))
    missing = sorted(recorded - validation.accepted)
    assert not missing, f"no behaviour of the spec explains traces {missing}"


def test_a_corrupted_trace_is_rejected(
    validation: TraceValidation, traces: list[list[TraceEvent]],
) -> None:
    assert len(traces) + 1 in validation.rejected


def test_traces_exercise_most_transitions(traces: list[list[TraceEvent]]) -> None:
    seen = {(m, (s, t, d)) for tr in traces for e in tr for m, t, s, d in e.steps}
    declared = {(name, edge) for name, spec in machines().items() for edge in spec.edges()}
    assert seen <= declared
    assert len(seen) >= len(declared) // 2, f"{len(seen)}/{len(declared)} transitions"
