"""Hypothesis drives two sessions over the simulated network with host calls, timers and
faults, and checks the protocol's properties after every step (tests/stateful/machine.py).

Checked on every step (the world raises SafetyViolation inside the step), over FIFO
channels that may lose frames or be cut:
* each job gets at most one result; successful loads carry the right bytes;
* no load is reported released while a write into its destination is in flight; no
  write lands in a destination after its job was reported released, and a released
  block still holds its canary when it is given to a new load;
* no pinned source is released while a write reads it; no write before registration;
* rounds are isolated: a frame about (kv_request_id, round) fires only that round's
  machines, and a transfer_done or abort_ack completes only the load it answers;
* no load round reuses a number while an older round of that number has a frame on
  the wire (the consumer's fetch or abort, the producer's reply);
* two conformant peers never reject each other's frames unless a frame was lost;
* a supply for a request whose consumer finished it (its terminal fetch arrived) has its
  result in that step, its pins released, instead of waiting for the store deadline;
* a malformed frame changes nothing.
* the oracle (tests/stateful/oracle.py), on every session call: each result, its
  reason and whether it is released, each round notice and how often, the frames that
  go out, and how a session ends when its peer connects again, as a reference model
  written from the models' tables predicts them.
Checked once the run is quiet (faults off, everything delivered, timers fired):
* every job has exactly one result, every pin is released, no machine is left open.

The must-fail mutants (tests/mutants) must each make this test fail in the CI profile.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from .machine import HostileNetwork, TwoSessions

TestTwoSessions = TwoSessions.TestCase
TestHostileNetwork = HostileNetwork.TestCase



def _contended_machine() -> TwoSessions:
    """The machine after its setup rule: handshake done, a load with writes in flight.
    (Called inside a hypothesis test: the rule records notes.)"""
    machine = TwoSessions()
    machine.setup(faults=0, fatal=False, handshake_first=True, swarm=frozenset(), requests=1,
                  late_cancel=False, retries=0, contended=["writing"])
    return machine


@settings(max_examples=1, database=None)
@given(st.none())
def test_the_quiet_checks_pass_once_every_job_has_its_result(_: None) -> None:
    machine = _contended_machine()
    machine.teardown()  # stabilizes the world, then checks it
    assert machine.world.hosts["a"].loads  # the contended load was there to be checked
    for host in machine.world.hosts.values():
        assert host.quiet, host.name


@settings(max_examples=1, database=None)
@given(st.none())
def test_the_quiet_checks_see_a_job_left_without_its_result(_: None) -> None:
    """The teardown's check has teeth: a lookup the host sent that never got its result
    (injected here) fails the run."""
    machine = _contended_machine()
    machine.world.hosts["a"].lookups_sent += 1
    with pytest.raises(AssertionError):
        machine.teardown()


@settings(max_examples=1, database=None)
@given(st.none())
def test_the_parts_family_reaches_split_answers(_: None) -> None:
    """With "parts", the producer's first lookup_resp carries the key its host found at
    once; the consumer's lookup takes it and keeps probing (client_lookup probing ->
    probing) until the deferred keys' part ends it with every hit."""
    machine = TwoSessions()
    machine.setup(faults=0, fatal=False, handshake_first=True,
                  swarm=frozenset({"lookup", "parts"}), requests=1, late_cancel=False,
                  retries=0, contended=["writing"])
    world = machine.world
    world.stabilize()
    world.lookup("a", "r1", [6, 7, 13])  # b holds 6 and 7; 13 is held nowhere
    world.stabilize()
    fired = {(r.machine, r.trigger, r.source, r.dest) for r in machine.tracer.records}
    assert ("client_lookup", "recv_lookup_resp", "probing", "probing") in fired
    assert [r.hits for r in world.hosts["a"].lookup_results] == []
    assert len(world.deferred) == 1
    world.resolve_deferred(0)
    world.stabilize()
    assert [r.hits for r in world.hosts["a"].lookup_results] == [(True, True, False)]
    machine.teardown()


class _Draws:
    """Stands in for hypothesis' ``data``: hands out the draws of a recorded run."""

    def __init__(self, *values: object) -> None:
        self.values = list(values)

    def draw(self, strategy: object, label: str | None = None) -> object:
        return self.values.pop(0)


@settings(max_examples=1, database=None)
@given(st.none())
def test_a_peer_heard_restarting_writes_nothing_after(_: None) -> None:
    """A run the search found: ``a`` hears ``b`` connect with a new incarnation while
    ``b`` holds demand for a round of ``a``'s (fetched into blocks 10 and 11); ``a``
    releases those blocks (ReleaseCause.PEER_RESTARTED: the process that could write is
    gone), and then ``b``'s host supplies the round. The world models the restart (no
    write of the gone process lands), so the run passes its checks; before, the
    stand-in session's write was taken for a write into released blocks."""
    m = TwoSessions()
    m.setup(contended=["two rounds"], faults=2, requests=1, handshake_first=True, retries=5,
            swarm=frozenset({"parts", "malformed", "timers", "races"}), incarnations=True,
            fatal=True, late_cancel=True)
    steps = [
        lambda: m.give_up_while_writing(data=_Draws(("b", 0, "a", ("r1", 0))),
                                        how="host finishes", lost="cut", then="abort arrives"),
        m.progress, m.progress,
        lambda: m.supply(data=_Draws("r1"), node="b", picks=[8]),
        lambda: m.fetch_beyond_the_region(beyond=1, node="b", offsets=[1, 3, 0], position=1,
                                          round_seq=0),
        lambda: m.supply(data=_Draws("r1"), node="a", picks=[9, 7, 5]),
        lambda: m.time_passes_idly(share=0.5), lambda: m.time_passes_idly(share=1.0),
        lambda: m.deliver(count=3, data=_Draws("b")),
        lambda: m.lookup_answered_after_it_ended(data=_Draws("a", "r1"), how="session lost",
                                                 lost="producer's link down", picks=[0]),
        lambda: m.peer_connects_again(node="a", restarted=True),
        lambda: m.deliver(count=1, data=_Draws("b")),
        lambda: m.supply(data=_Draws("r1"), node="b", picks=[1]),
    ]
    for step in steps:
        step()
        m.at_most_one_result_per_job()
        m.no_protocol_error_between_conformant_peers()
        m.watch_the_windows()
    assert m.world.gone == {"b"}  # the restart was heard, b's write came after it
    m.teardown()
