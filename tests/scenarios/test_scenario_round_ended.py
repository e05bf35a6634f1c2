"""The producer's host hears when a round it was asked to supply ends (RoundEnded).

One RoundEnded per round a FetchArrived told the host of, when the round stops taking
supply: served, or why not. Rounds the host never heard of (supply parked for a fetch
that never came, a fetch that failed at once) are not reported. The test plays the
consumer of one bare session.
"""

from __future__ import annotations

from helpers.world import key, of_type, only, ready_driver

from p2pfsm.protocol import AbortFetch, Fetch, TransferDone
from p2pfsm.session import (
    FetchArrived,
    HostDecline,
    HostFinish,
    HostSupply,
    RoundEnded,
    StartWrite,
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
