"""The producer's host hears when a round it was asked to supply ends (RoundEnded).

One RoundEnded per round a FetchArrived told the host of, when the round stops taking
supply: served, or why not. Rounds the host never heard of (supply parked for a fetch
that never came, a fetch that failed at once) are not reported. A supply the host gives
after the peer finished the request (its terminal fetch) or after the session ended fails
at once, its pins released; after an abort it waits for a later round of the request.
The test plays the consumer of one bare session.
"""

from __future__ import annotations

from helpers.world import key, of_type, only, ready_driver

from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, Lookup, TransferDone
from p2pfsm.session import (
    FailReason,
    FetchArrived,
    HostAnswerLookup,
    HostDecline,
    HostFinish,
    HostSupply,
    LookupRequest,
    RoundEnded,
    SendFrame,
    StartWrite,
    StoreResult,
    TransportLost,
    WriteFinished,
)

FETCH = Fetch("r1", (key(1), key(2)), (0, 1), 0)


def ended(out: list[object]) -> list[RoundEnded]:
    return of_type(out, RoundEnded)


def test_a_served_round_is_reported_served_once() -> None:
    d = ready_driver()
    assert only(of_type(d.recv(FETCH), FetchArrived)).round_seq == 0
    write = only(of_type(d(HostSupply(5, "r1", (key(1), key(2)), (3, 4))), StartWrite))
    out = d(WriteFinished(write.xfer, True))
    assert TransferDone("r1", True, 0) in [getattr(o, "message", None) for o in out]
    assert ended(out) == [RoundEnded("r1", 0, True, "served")]
    assert ended(d.log).count(RoundEnded("r1", 0, True, "served")) == 1


def test_each_way_a_round_ends_unserved_says_why() -> None:
    cases = {
        "aborted": lambda d: d.recv(AbortFetch("r1", 0)),
        "peer_finished": lambda d: d.recv(Fetch("r1", (), (), 0)),
        "session_ended": lambda d: d(TransportLost("gone")),
        "declined": lambda d: d(HostDecline("r1", 0)),
        "demand_timeout": lambda d: d.fire(d.armed("demand")[0]),
    }
    for why, end in cases.items():
        d = ready_driver()
        d.recv(FETCH)
        out = end(d)
        assert ended(out) == [RoundEnded("r1", 0, False, why)], (why, out)


def test_a_host_finish_before_supplying_all_ends_the_round_failed() -> None:
    d = ready_driver()
    d.recv(FETCH)
    write = only(of_type(d(HostSupply(5, "r1", (key(1),), (3,))), StartWrite))
    d(HostFinish("r1"))  # key 2 will never come
    out = d(WriteFinished(write.xfer, True))
    assert ended(out) == [RoundEnded("r1", 0, False, "failed")]


def test_a_write_failure_is_told_once_even_if_the_peer_aborts_later() -> None:
    d = ready_driver()
    d.recv(FETCH)
    first = only(of_type(d(HostSupply(5, "r1", (key(1),), (3,))), StartWrite))
    out = d(WriteFinished(first.xfer, False))
    assert ended(out) == [RoundEnded("r1", 0, False, "write_failed")]
    d.recv(AbortFetch("r1", 0))
    assert len(ended(d.log)) == 1


def test_rounds_the_host_never_heard_of_are_not_reported() -> None:
    d = ready_driver()
    d(HostSupply(5, "r2", (key(1),), (3,)))  # parked: no fetch ever names it
    d.fire(d.armed("store")[0])
    d.recv(Fetch("r3", (), (), 0))           # a terminal fetch of a request never served
    assert ended(d.log) == []


TERMINAL = Fetch("r1", (), (), 0)


def refused(out: list[object], job: int) -> StoreResult:
    """The job's one StoreResult, failed, in these outputs."""
    result = only(of_type(out, StoreResult))
    assert result.job_id == job and not result.success, result
    return result


def test_a_supply_after_the_peer_finished_the_request_fails_at_once() -> None:
    d = ready_driver()
    d.recv(FETCH)
    assert ended(d.recv(TERMINAL)) == [RoundEnded("r1", 0, False, "peer_finished")]
    out = d(HostSupply(5, "r1", (key(1), key(2)), (3, 4)))
    result = refused(out, 5)
    assert result.reason is FailReason.NOT_SERVED
    assert "'r1'" in result.detail and "terminal fetch" in result.detail
    assert of_type(out, StartWrite) == [] and of_type(out, SendFrame) == []
    assert d.armed("store") == [] and d.s.open_counts()["server_round"] == 0
    # Only that request: another one's supply still waits for its fetch.
    assert of_type(d(HostSupply(6, "r2", (key(1),), (3,))), StoreResult) == []
    assert len(d.armed("store")) == 1


def test_a_terminal_fetch_after_a_lookup_refuses_the_supply_that_follows() -> None:
    d = ready_driver()  # symmetric: the peer looked up, got a miss, finished
    ask = only(of_type(d.recv(Lookup("r1", (key(1),), 0)), LookupRequest))
    d(HostAnswerLookup(ask.token))
    d.recv(TERMINAL)
    refused(d(HostSupply(5, "r1", (key(1),), (3,))), 5)
    assert d.s.open_counts()["server_round"] == 0


def test_a_fetch_or_lookup_naming_the_request_again_takes_supply_as_before() -> None:
    d = ready_driver()  # the peer reuses the id: a new fetch, then the supply
    d.recv(TERMINAL)
    assert only(of_type(d.recv(FETCH), FetchArrived)).round_seq == 0
    write = only(of_type(d(HostSupply(5, "r1", (key(1), key(2)), (3, 4))), StartWrite))
    out = d(WriteFinished(write.xfer, True))
    assert of_type(out, StoreResult) == [StoreResult(5, True)]
    d = ready_driver()  # a lookup names the request again: supply parks for its fetch
    d.recv(TERMINAL)
    d.recv(Lookup("r1", (key(1),), 0))
    assert of_type(d(HostSupply(5, "r1", (key(1),), (3,))), StoreResult) == []
    assert len(d.armed("store")) == 1


def test_the_peer_finish_is_forgotten_after_a_frame_lifetime() -> None:
    d = ready_driver()
    d.recv(TERMINAL)
    d.now += d.s.config.timeouts.tombstone + 1
    assert of_type(d(HostSupply(5, "r1", (key(1),), (3,))), StoreResult) == []
    assert len(d.armed("store")) == 1


def test_a_supply_after_the_session_ended_fails_at_once() -> None:
    d = ready_driver()
    d.recv(FETCH)
    assert ended(d(TransportLost("gone"))) == [RoundEnded("r1", 0, False, "session_ended")]
    assert refused(d(HostSupply(5, "r1", (key(1),), (3,))), 5).reason is FailReason.SESSION_ENDED


def test_a_supply_after_an_abort_waits_for_a_later_round_of_the_request() -> None:
    # An abort ends a round, not the request: the consumer's load deadline aborts a
    # round, and its host may fetch the request again (test_scenario_aba.py).
    d = ready_driver()
    d.recv(FETCH)
    out = d.recv(AbortFetch("r1", 0))
    assert ended(out) == [RoundEnded("r1", 0, False, "aborted")]
    assert AbortAck("r1", 0) in [getattr(o, "message", None) for o in out]
    assert of_type(d(HostSupply(5, "r1", (key(1), key(2)), (3, 4))), StoreResult) == []
    only(of_type(d.recv(Fetch("r1", (key(1), key(2)), (0, 1), 1)), StartWrite))
