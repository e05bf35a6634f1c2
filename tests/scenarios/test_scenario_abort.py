"""Abort scenarios: load timeout, abort-ack timeout (re-send, never give up), races with
transfer_done, unknown and repeated aborts, and aborts with a write in flight."""

from __future__ import annotations

from helpers.world import World, of_type, only, ready_driver, ready_world, sent

from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, TransferDone
from p2pfsm.session import (
    CancelWrite,
    FrameIgnored,
    HostFetch,
    LoadResult,
    ProtocolViolation,
    StoreResult,
    TimerId,
)


def abort_on_the_wire(w: World) -> AbortFetch:
    msg = w.wire("a")[-1]
    assert isinstance(msg, AbortFetch)
    return msg


def test_load_timeout_sends_abort_and_abort_ack_fails_the_load_released() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8])  # b never supplies key 8
    w.deliver("a")
    w.fire_next("a", "load")
    assert only(w.wire("a")) == AbortFetch("r1", 0)
    assert job not in w.hosts["a"].load_results
    w.deliver("a")
    assert only(w.wire("b")) == AbortAck("r1", 0)
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)
    assert w.counts("a")["timers"] == 0
    assert not w.sessions["a"].has_pending_work and not w.sessions["b"].has_pending_work


def test_abort_ack_timeout_resends_the_abort_and_reports_nothing() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8])
    w.deliver("a")
    w.fire_next("a", "load")
    for _ in range(3):
        assert w.drop_all("a") == 1  # the abort (or its re-send) is lost
        w.fire_next("a", "abort_ack")
        assert only(w.wire("a")) == AbortFetch("r1", 0)
        assert job not in w.hosts["a"].load_results
        assert w.hosts["a"].owner  # the destination is still owned by the job
    w.deliver("a")
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)
    assert len(w.sent_of("a", AbortFetch)) == 4


def test_transfer_done_racing_the_abort_wins() -> None:
    w = ready_world()
    w.supply("b", "r1", [8])
    job = w.load("a", "r1", [8])
    w.deliver("a")
    (xfer,) = w.xfers("b")
    w.fire_next("a", "load")
    assert abort_on_the_wire(w) == AbortFetch("r1", 0)
    w.finish_write("b", xfer)
    assert only(w.wire("b")) == TransferDone("r1", True, 0)
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", True, True)
    # The abort reaches b after the round ended: it is acked at once, and the ack ignored.
    w.deliver("a")
    assert only(w.wire("b")) == AbortAck("r1", 0)
    w.deliver("b")
    assert w.out("a", FrameIgnored)[-1].message_type == "abort_ack"
    assert len(w.out("a", LoadResult)) == 1


def test_abort_of_an_unknown_round_is_acked_at_once() -> None:
    d = ready_driver()
    out = d.recv(AbortFetch("never-seen", 7))
    assert len(out) == 1 and sent(out) == [AbortAck("never-seen", 7)]
    assert d.s.open_counts()["server_round"] == 0


def test_repeated_abort_while_draining_gives_one_abort_ack() -> None:
    w = ready_world()
    w.supply("b", "r1", [8])
    job = w.load("a", "r1", [8])
    w.deliver("a")
    (xfer,) = w.xfers("b")
    w.fire_next("a", "load")
    w.fire_next("a", "abort_ack")  # re-sent: two aborts on the wire
    assert w.types("a") == ["abort_fetch", "abort_fetch"]
    w.deliver_all("a")
    assert w.wire("b") == []
    assert len(w.out("b", CancelWrite)) == 1
    w.finish_write("b", xfer, land=False)
    assert w.wire("b") == [AbortAck("r1", 0)]
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)


def test_abort_with_a_write_in_flight_is_acked_only_after_the_write_completes() -> None:
    w = ready_world()
    store = w.supply("b", "r1", [8])
    job = w.load("a", "r1", [8])
    w.deliver("a")
    (xfer,) = w.xfers("b")
    w.fire_next("a", "load")
    w.deliver("a")
    assert w.out("b", CancelWrite) == [CancelWrite(xfer)]
    assert w.wire("b") == []
    assert store not in w.hosts["b"].store_results  # the source is still read
    w.land("b", xfer)  # a cancelled write may still land: the destination is still owned
    assert w.wire("b") == []
    w.complete("b", xfer)
    assert w.wire("b") == [AbortAck("r1", 0)]
    assert store in w.hosts["b"].store_results
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)


def test_host_finish_aborts_the_load_and_keeps_the_job_until_the_ack() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8])
    w.deliver("a")
    w.finish("a", "r1")
    assert w.wire("a") == [AbortFetch("r1", 0)]
    assert job not in w.hosts["a"].load_results
    w.finish("a", "r1")  # a repeated finish sends no second abort
    assert w.wire("a") == [AbortFetch("r1", 0)]
    w.deliver("a")
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)


def test_transfer_done_after_the_abort_ack_is_ignored() -> None:
    d = ready_driver()
    d(HostFetch(1, "r1", (b"k" * 36,), (4,)))
    d.fire(TimerId("load", ("r1", 0)))
    out = d.recv(AbortAck("r1", 0))
    assert of_type(out, LoadResult) == [LoadResult(1, "r1", False, True)]
    out = d.recv(TransferDone("r1", True, 0))
    assert of_type(out, FrameIgnored) and not of_type(out, LoadResult)


def test_abort_ack_for_a_round_we_did_not_abort_is_a_violation() -> None:
    d = ready_driver()
    out = d(HostFetch(1, "r1", (b"k" * 36,), (4,)))
    assert sent(out) == [Fetch("r1", (b"k" * 36,), (4,), 0)]
    before = d.s.open_counts()
    out = d.recv(AbortAck("r1", 0))
    assert len(out) == 1 and isinstance(out[0], ProtocolViolation)
    assert d.s.open_counts() == before
    out = d.recv(TransferDone("r1", True, 0))
    assert of_type(out, LoadResult) == [LoadResult(1, "r1", True, True)]


def test_abort_of_a_partly_served_round_is_acked_at_once_and_fails_its_supply() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    store = w.supply("b", "r1", [8])  # key 8 is written, key 9 never comes
    (xfer,) = w.xfers("b")
    w.finish_write("b", xfer)
    w.fire_next("a", "load")
    w.deliver("a")
    assert w.wire("b") == [AbortAck("r1", 0)]  # nothing in flight: acked at once
    assert w.hosts["b"].store_results[store] == StoreResult(store, False)
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)
