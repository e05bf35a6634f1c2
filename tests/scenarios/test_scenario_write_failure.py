"""Write failures: the round fails with transfer_done(false), sent only once every
sibling write of the round is quiescent; the pins only a failed write read are released at
once, the others then."""

from __future__ import annotations

from helpers.world import ready_world

from p2pfsm.protocol import AbortAck, TransferDone
from p2pfsm.session import CancelWrite, LoadResult, StoreResult


def test_write_failure_sends_transfer_done_false() -> None:
    w = ready_world()
    store = w.supply("b", "r1", [8, 9])
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    (xfer,) = w.xfers("b")
    w.complete("b", xfer)  # never landed: the write failed
    assert w.wire("b") == [TransferDone("r1", False, 0)]
    assert w.hosts["b"].store_results[store] == StoreResult(store, False)
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)


def test_write_failure_replies_only_after_sibling_writes_are_quiescent() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9, 10])
    w.deliver("a")
    first = w.supply("b", "r1", [8])
    second = w.supply("b", "r1", [9])
    x1, x2 = w.xfers("b")
    w.complete("b", x1, fail=True)
    assert w.out("b", CancelWrite) == [CancelWrite(x2)]
    assert w.wire("b") == []  # the sibling may still land
    # Only the failed write read the first job's pins: its result now; the sibling's
    # job stays pinned while its write may still read it.
    assert w.hosts["b"].store_results[first] == StoreResult(first, False)
    assert second not in w.hosts["b"].store_results
    w.land("b", x2)
    w.complete("b", x2)
    assert w.wire("b") == [TransferDone("r1", False, 0)]
    assert w.hosts["b"].store_results[second].success is False
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)
    assert len(w.sent_of("b", TransferDone)) == 1


def test_write_failure_of_a_finishing_round_waits_for_its_siblings() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    w.supply("b", "r1", [8])
    w.supply("b", "r1", [9])
    w.finish("b", "r1")  # the round is finishing with two writes in flight
    x1, x2 = w.xfers("b")
    w.complete("b", x2, fail=True)
    assert w.wire("b") == []
    w.finish_write("b", x1)
    assert w.wire("b") == [TransferDone("r1", False, 0)]
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)


def test_a_landed_write_reported_failed_still_fails_the_round() -> None:
    w = ready_world()
    store = w.supply("b", "r1", [8])
    job = w.load("a", "r1", [8])
    w.deliver("a")
    (xfer,) = w.xfers("b")
    w.finish_write("b", xfer, fail=True)  # bytes landed but the transfer reported an error
    assert w.wire("b") == [TransferDone("r1", False, 0)]
    assert w.hosts["b"].store_results[store] == StoreResult(store, False)
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)


def test_each_failed_write_of_a_draining_round_releases_its_pins_at_once() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9, 10])
    w.deliver("a")
    first, second, third = (w.supply("b", "r1", [k]) for k in (8, 9, 10))
    x1, x2, x3 = w.xfers("b")
    w.complete("b", x2, fail=True)
    w.complete("b", x3, fail=True)  # cancelled: its pins go too, x1 still runs
    stores = w.hosts["b"].store_results
    assert stores[second] == StoreResult(second, False)
    assert stores[third] == StoreResult(third, False)
    assert first not in stores and w.wire("b") == []
    w.finish_write("b", x1)
    assert stores[first] == StoreResult(first, False)
    assert w.wire("b") == [TransferDone("r1", False, 0)]
    assert len(w.sent_of("b", TransferDone)) == 1
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)


def test_an_abort_releases_at_once_the_pins_no_running_write_reads() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    read = w.supply("b", "r1", [8])  # its write starts
    unread = w.supply("b", "r1", [12])  # a key the fetch did not name: nothing reads it
    (xfer,) = w.xfers("b")
    w.fire_next("a", "load")
    w.deliver("a")  # the abort_fetch
    stores = w.hosts["b"].store_results
    assert stores[unread] == StoreResult(unread, False)
    assert read not in stores and w.wire("b") == []  # the write may still land
    w.complete("b", xfer, fail=True)  # cancelled
    assert stores[read] == StoreResult(read, False)
    assert w.wire("b") == [AbortAck("r1", 0)]
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)


def test_a_host_finish_while_an_abort_drains_still_owes_the_abort_ack() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    read = w.supply("b", "r1", [8])
    (xfer,) = w.xfers("b")
    w.fire_next("a", "load")
    w.deliver("a")  # the abort_fetch: b's round drains
    w.finish("b", "r1")  # b's host finishes the request meanwhile
    assert w.wire("b") == []
    w.complete("b", xfer, fail=True)  # cancelled
    assert w.wire("b") == [AbortAck("r1", 0)]  # the abort's reply, never a transfer_done
    assert w.hosts["b"].store_results[read] == StoreResult(read, False)
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)
