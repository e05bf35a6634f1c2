"""Lookup answers split over several lookup_resp frames, or coalesced into one.

The protocol lets a producer split its answer to one lookup, or answer several
lookups of a request in one frame; the consumer matches each (key, hit) pair on its
own (models/client_lookup.toml). These drive the two client_lookup edges the gate's
producer never takes (p2pfsm/tools/verify/unreachable.py: BEYOND_GATE) and p2pfsm's own
splitting producer (SessionConfig.answer_lookups_in_parts).
"""

from __future__ import annotations

from helpers.world import key, local_config, of_type, only, ready_driver, sent

from p2pfsm.protocol import Fetch, Lookup, LookupResp
from p2pfsm.session import (
    FrameIgnored,
    HostAnswerLookup,
    HostFetch,
    HostLookup,
    LookupRequest,
    LookupResult,
    ProtocolViolation,
    StartWrite,
    TimerId,
)


def lookup_timer(d: object) -> TimerId:
    armed = d.armed("lookup")  # type: ignore[attr-defined]
    assert len(armed) == 1, armed
    return armed[0]  # type: ignore[no-any-return]


def test_an_answer_split_in_two_is_reported_once_whole() -> None:
    d = ready_driver()
    d(HostLookup("r1", (key(1), key(2), key(3))))
    out = d.recv(LookupResp("r1", (key(2),), (True,)))
    assert of_type(out, LookupResult) == []  # a part: keys 1 and 3 still unanswered
    assert not of_type(out, ProtocolViolation) and not of_type(out, FrameIgnored)
    out = d.recv(LookupResp("r1", (key(3), key(1)), (False, True)))
    assert of_type(out, LookupResult) == [
        LookupResult("r1", (key(1), key(2), key(3)), (True, True, False), True)]
    assert d.armed("lookup") == []


def test_a_part_of_the_answer_starts_the_deadline_again() -> None:
    """The peer made progress: the lookup waits one more full period from the part."""
    d = ready_driver()
    d(HostLookup("r1", (key(1), key(2))))
    timer = lookup_timer(d)
    period = d.timers[timer] - d.now
    d.now += period - 1.0
    d.recv(LookupResp("r1", (key(1),), (True,)))
    assert d.timers[timer] == d.now + period
    out = d.fire(timer)
    assert of_type(out, LookupResult) == [
        LookupResult("r1", (key(1), key(2)), (True, False), False)]


def test_two_lookups_answered_in_one_frame_each_get_their_keys() -> None:
    d = ready_driver()
    d(HostLookup("r1", (key(1),)))
    d(HostLookup("r1", (key(2), key(1))))  # key 1 asked twice: two lookups wait for it
    out = d.recv(LookupResp("r1", (key(1), key(2), key(1)), (True, False, False)))
    assert of_type(out, LookupResult) == [
        LookupResult("r1", (key(1),), (True,), True),
        LookupResult("r1", (key(2), key(1)), (False, False), True)]
    assert d.s.open_counts()["client_lookup"] == 0


def test_a_deadline_keeps_the_hits_answered_so_far() -> None:
    d = ready_driver()
    d(HostLookup("r1", (key(1), key(2))))
    d.recv(LookupResp("r1", (key(1),), (True,)))
    out = d.fire(lookup_timer(d))
    assert of_type(out, LookupResult) == [
        LookupResult("r1", (key(1), key(2)), (True, False), False)]
    # A late part is absorbed by the expired lookup (expired -> expired), the last one
    # ends it (expired -> discarded): neither reports again.
    out = d.recv(LookupResp("r1", (key(2),), (True,)))
    assert of_type(out, LookupResult) == [] and not of_type(out, FrameIgnored)
    assert d.s.open_counts()["client_lookup"] == 0
    out = d.recv(LookupResp("r1", (key(2),), (True,)))
    assert only(of_type(out, FrameIgnored)).message_type == "lookup_resp"


def test_a_late_part_of_an_expired_lookup_never_answers_the_next_round() -> None:
    # Lookup L1 of round 0 expires (MISS); the host fetches round 0 and looks up key 1
    # again, now in round 1. The producer's late answer to L1 arrives: it is round 0's
    # (pinned for round 0), so it ends L1 and leaves L2 waiting for its own answer.
    d = ready_driver()
    d(HostLookup("r1", (key(1),)))
    d.fire(lookup_timer(d))
    out = d(HostFetch(7, "r1", (key(1),), (3,)))
    assert only(sent(out)) == Fetch("r1", (key(1),), (3,), 0)
    out = d(HostLookup("r1", (key(1),)))
    assert only(sent(out)) == Lookup("r1", (key(1),), 1)
    out = d.recv(LookupResp("r1", (key(1),), (True,)))
    assert of_type(out, LookupResult) == []
    out = d.recv(LookupResp("r1", (key(1),), (False,)))
    assert of_type(out, LookupResult) == [LookupResult("r1", (key(1),), (False,), True)]


def test_a_splitting_producer_answers_resolved_keys_at_once() -> None:
    d = ready_driver(local_config(answer_lookups_in_parts=True))
    req = only(of_type(d.recv(Lookup("r1", (key(1), key(2), key(3)), 0)), LookupRequest))
    out = d(HostAnswerLookup(req.token, {key(3): 5}, 70, frozenset({key(1), key(2)})))
    assert sent(out) == [LookupResp("r1", (key(3),), (True,))]
    out = d(HostAnswerLookup(req.token, {key(1): 6}, 71, frozenset({key(2)})))
    assert sent(out) == [LookupResp("r1", (key(1),), (True,))]
    out = d.fire(TimerId("lookup_pending", (req.token,)))
    assert sent(out) == [LookupResp("r1", (key(2),), (False,))]
    out = d.recv(Fetch("r1", (key(1), key(3)), (0, 1), 0))  # served from both pins
    assert sorted(i for w in of_type(out, StartWrite) for i in w.local_indexes) == [5, 6]


def test_a_splitting_producer_keeps_arrival_order_across_lookups() -> None:
    # A second lookup's resolved keys wait until the first lookup is answered whole, so
    # the consumer can match every pair to the lookup that asked it.
    d = ready_driver(local_config(answer_lookups_in_parts=True))
    first = only(of_type(d.recv(Lookup("r1", (key(1),), 0)), LookupRequest))
    out = d.recv(Lookup("r1", (key(1), key(2)), 0))
    second = only(of_type(out, LookupRequest))
    d(HostAnswerLookup(first.token, {}, None, frozenset({key(1)})))
    out = d(HostAnswerLookup(second.token, {key(1): 4}, 72, frozenset({key(2)})))
    assert sent(out) == []  # the first lookup is still unanswered
    out = d(HostAnswerLookup(first.token, {}, None, frozenset()))
    assert sent(out) == [LookupResp("r1", (key(1),), (False,)),
                         LookupResp("r1", (key(1),), (True,))]
