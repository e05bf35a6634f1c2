"""Regressions for bugs the scenario suite found in the first session implementation:
supply routing after finish/abort/failure and across two PD rounds of one id, round
memory horizons, fail-fast fetches of ended rounds, deaths that tell the peer, lookups
after a producer finish, and lookup answers matched to the live retry."""

from __future__ import annotations

import pytest
from helpers.world import (
    World,
    key,
    keys,
    of_type,
    only,
    ready_driver,
    ready_world,
    sent,
    snapshot,
)

from p2pfsm.errors import LocalProtocolError
from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, Lookup, TransferDone
from p2pfsm.session import (
    CancelWrite,
    FrameIgnored,
    HostAnswerLookup,
    HostFinish,
    HostSupply,
    LookupRequest,
    ProtocolViolation,
    StartWrite,
    StoreResult,
    TimerId,
    WriteFinished,
)


def test_supply_after_host_finish_of_a_serving_round_is_refused() -> None:
    # A finished request takes no more supply (docs/explanation/reliability.md, Findings): the round
    # keeps finishing with what it had, the late supply raises and changes nothing.
    d = ready_driver()
    d.recv(Fetch("r1", keys([1, 2]), (5, 6), 0))
    only(of_type(d(HostSupply(10, "r1", keys([1]), (1,))), StartWrite))
    d(HostFinish("r1"))
    before = snapshot(d.s)
    with pytest.raises(LocalProtocolError, match="finished by this host"):
        d(HostSupply(11, "r1", keys([2]), (2,)))
    assert snapshot(d.s) == before
    assert d.s.open_counts()["server_round"] == 1


def test_supply_after_a_write_failure_fails_at_once() -> None:
    # models/server_round.toml: host_supply from "draining" -> reject_supply.
    d = ready_driver()
    d.recv(Fetch("r1", keys([1, 2, 3]), (5, 6, 7), 0))
    x1 = only(of_type(d(HostSupply(10, "r1", keys([1]), (1,))), StartWrite)).xfer
    x2 = only(of_type(d(HostSupply(11, "r1", keys([2]), (2,))), StartWrite)).xfer
    assert of_type(d(WriteFinished(x1, False)), CancelWrite) == [CancelWrite(x2)]
    out = d(HostSupply(12, "r1", keys([3]), (3,)))
    assert not of_type(out, StartWrite)
    assert of_type(out, StoreResult) == [StoreResult(12, False)]


def test_supply_after_abort_fails_at_once() -> None:
    d = ready_driver()
    d.recv(Fetch("r1", keys([1, 2]), (5, 6), 0))
    only(of_type(d(HostSupply(10, "r1", keys([1]), (1,))), StartWrite))
    d.recv(AbortFetch("r1", 0))
    out = d(HostSupply(11, "r1", keys([2]), (2,)))
    assert of_type(out, StoreResult) == [StoreResult(11, False)]


def test_pd_supply_goes_to_the_round_that_demands_it() -> None:
    # Two PD loads of one id in flight (rounds 0 and 1). Supply for round 0's key must
    # serve round 0 (protocol §3.3: the round whose demand contains the key).
    w = ready_world()
    job0 = w.load("a", "r1", [8])
    job1 = w.load("a", "r1", [9])
    w.deliver_all("a")
    w.supply("b", "r1", [8])
    assert len(w.xfers("b")) == 1, "key 8 was not written for round 0"
    w.supply("b", "r1", [9])
    w.stabilize()
    assert w.result("a", job0).success
    assert w.result("a", job1).success


def test_a_round_that_ended_with_an_abort_is_not_reused_for_a_frame_lifetime() -> None:
    # Its re-sent abort may still draw a late abort_ack; within `tombstone` seconds of
    # the round's end a reused id skips past it (after that, round 0 comes back).
    w = ready_world()
    job = w.load("a", "r1", [8])
    w.deliver("a")
    w.fire_next("a", "load")
    w.deliver_all("a")
    w.deliver_all("b")
    assert not w.result("a", job).success
    w.now += 100.0
    w.load("a", "r1", [9])
    fetch = only(w.wire("a"))
    assert isinstance(fetch, Fetch)
    assert fetch.round_seq == 1


def test_reused_id_is_served_when_the_peer_remembers_the_old_round_longer() -> None:
    # The consumer forgets the id's counter `tombstone` seconds after it allocated the
    # round; the producer remembers "round 0 ended" `tombstone` seconds after the round
    # ended (later). Reusing the id in between sends a fresh fetch for round 0 that the
    # producer drops as stale: the load can only fail at its deadline.
    w = ready_world()
    old = w.load("a", "r1", [8])
    w.deliver("a")
    w.now = 25.0  # the prefiller supplies late
    w.supply("b", "r1", [8])
    w.stabilize()
    assert w.result("a", old).success
    w.now = 130.0
    new = w.load("a", "r1", [9])
    w.deliver("a")
    assert not isinstance(w.outputs["b"][-1], FrameIgnored), w.outputs["b"][-1]
    w.supply("b", "r1", [9])
    w.stabilize()
    assert w.result("a", new).success


def test_fetch_after_the_lookup_pins_expired_fails_fast() -> None:
    # The lookup pinned key 8 for round 0; the pins hit the 30 s store deadline before the
    # consumer fetched. The fetch can never be served: it should get transfer_done(false)
    # at once (protocol P7, §3.3 fail-fast), not be dropped until the 30 s load timeout.
    w = ready_world()
    w.lookup("a", "r1", [8])
    w.stabilize()
    w.fire_next("b", "store")
    job = w.load("a", "r1", [8])
    w.deliver("a")
    assert w.wire("b") == [TransferDone("r1", False, 0)]
    w.deliver("b")
    assert job in w.hosts["a"].load_results


def test_round_memory_outlives_the_last_frame_of_a_long_abort() -> None:
    # A load aborts at t=30 while the producer's write hangs; the abort is re-sent every
    # 10 s until the write ends at t=110; the producer then acks twice (the last re-send
    # arrives after the round ended). The consumer forgets the id's round counter 120 s
    # after it *allocated* round 0, not after the round's last frame: at t=125 a new load
    # of the id reuses round 0 while the second abort_ack(0) (15 s old) is still in flight.
    w = ready_world()
    old = w.load("a", "r1", [8, 9])
    w.deliver("a")
    w.supply("b", "r1", [8])
    (xfer,) = w.xfers("b")
    w.fire_next("a", "load")
    w.deliver("a")
    for _ in range(7):
        w.fire_next("a", "abort_ack")
        w.deliver("a")
    assert w.wire("b") == []  # draining: no ack while the write may land
    w.fire_next("a", "abort_ack")  # t=110: one more abort on its way
    w.finish_write("b", xfer, land=False)  # the write ends: ack #1
    w.deliver("a")  # the last abort reaches b after the round ended: ack #2
    assert w.wire("b") == [AbortAck("r1", 0), AbortAck("r1", 0)]
    w.deliver("b")
    assert w.result("a", old).released
    w.now = 125.0
    w.load("a", "r1", [10])
    fetch = only(w.wire("a"))
    assert isinstance(fetch, Fetch)
    assert fetch.round_seq != 0, "round 0 reused while its abort_ack is still in flight"
    w.deliver("b")
    assert not w.hosts["a"].violations


def test_a_session_dying_at_its_handshake_deadline_tells_a_peer_that_became_ready() -> None:
    # b's registration of a takes longer than a's handshake deadline (cold registrations of
    # 13.6 s are reported upstream, #55179). a had already acked b, so b becomes ready just
    # after a died. a dies silently (no disconnect), ignores every later frame, and b's
    # load can never end: its abort is re-sent forever (by design it is never given up).
    w = World()
    w.start()
    w.deliver("a")
    w.deliver("b")
    w.register("a")  # a acks b
    w.deliver("a")  # b holds a's ack while still registering a
    w.fire_timer("a", TimerId("handshake"))
    assert w.sessions["a"].state == "ended"  # it sent b its disconnect
    w.register("b")
    assert w.sessions["b"].ready
    job = w.load("b", "r1", [1])
    for _ in range(50):
        w.stabilize()
        if not w.advance():
            break
    assert job in w.hosts["b"].load_results or not w.sessions["b"].alive


def test_lookup_after_the_producer_host_finished_the_request_is_not_a_violation() -> None:
    # The producer's host finished r1 (HostFinish: done with the id on both roles) after
    # answering a lookup of round 0. A further lookup of the same open round from a
    # conformant consumer is reported as "lookup ... after its fetch" (no fetch was sent)
    # and never answered; the consumer waits for its lookup deadline.
    d = ready_driver()
    req = only(of_type(d.recv(Lookup("r1", (key(1),), 0)), LookupRequest))
    d(HostAnswerLookup(req.token, {key(1): 1}, 70))
    d(HostFinish("r1"))
    out = d.recv(Lookup("r1", (key(2),), 0))
    assert not of_type(out, ProtocolViolation)
    assert of_type(out, LookupRequest) or sent(out)


def test_an_expired_unanswered_lookup_does_not_swallow_the_answer_to_its_retry() -> None:
    # The producer drops lookup L1 unanswered (its host finished the id). L1 expires on the
    # consumer (MISS) but stays "expired" for another deadline, still matching responses
    # by keys. The host retries the same keys (L2, same round); the producer answers HIT
    # and pins; the answer is matched to L1 and discarded, L2 expires 30 s later as MISS
    # and the producer's pin is held for nothing.
    w = ready_world(auto_answer=False)
    w.lookup("a", "r1", [8])
    w.deliver("a")
    w.finish("b", "r1")
    w.fire_next("a", "lookup")
    w.lookup("a", "r1", [8])
    w.deliver("a")
    w.answer("b", w.held["b"][1].token, [8])
    w.deliver("b")
    assert w.hosts["a"].lookup_results[-1].hits == (True,)
