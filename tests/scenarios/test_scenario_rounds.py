"""Round isolation: the regression set of vLLM issue #49820 / PR #49877 (protocol §6.2)."""

from __future__ import annotations

from helpers.world import World, keys, of_type, only, ready_driver, ready_world, sent

from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, Lookup, TransferDone
from p2pfsm.session import (
    CancelWrite,
    HostSupply,
    LoadResult,
    LookupClosed,
    LookupResult,
    ProtocolViolation,
    StartWrite,
    StoreResult,
    WriteFinished,
)


def pins_of(w: World, node: str) -> set[int]:
    host = w.hosts[node]
    return set(host.store_jobs) - set(host.store_results)


def round_0_in_flight_and_round_1_pinned(w: World) -> tuple[int, int, int, int]:
    """Fetch A (round 0) has a write in flight; lookup B (round 1) has pinned key 9.

    Returns (load job of round 0, its write, pin job of round 0, pin job of round 1).
    """
    w.lookup("a", "r1", [8])
    w.stabilize()
    (pin0,) = pins_of(w, "b")
    job0 = w.load("a", "r1", [8])
    w.deliver("a")
    (xfer0,) = w.xfers("b")
    w.lookup("a", "r1", [9])
    assert only(w.wire("a")) == Lookup("r1", keys([9]), 1)
    w.deliver("a")
    w.deliver("b")
    (pin1,) = pins_of(w, "b") - {pin0}
    return job0, xfer0, pin0, pin1


def test_completing_round_0_does_not_destroy_round_1_supply() -> None:
    w = ready_world()
    job0, xfer0, pin0, pin1 = round_0_in_flight_and_round_1_pinned(w)
    w.finish_write("b", xfer0)
    assert only(w.wire("b")) == TransferDone("r1", True, 0)
    assert w.hosts["b"].store_results[pin0].success
    assert pin1 not in w.hosts["b"].store_results  # round 1's pin survives
    assert w.counts("b")["server_round"] == 1
    w.deliver("b")
    assert w.result("a", job0).success


def test_round_1_fetch_is_served_after_round_0_finalized() -> None:
    w = ready_world()
    job0, xfer0, _pin0, pin1 = round_0_in_flight_and_round_1_pinned(w)
    w.finish_write("b", xfer0)
    w.deliver_all("b")
    job1 = w.load("a", "r1", [9])
    fetch = only(w.wire("a"))
    assert isinstance(fetch, Fetch) and fetch.round_seq == 1
    w.deliver("a")
    w.finish_writes("b")
    w.deliver_all("b")
    dones = w.sent_of("b", TransferDone)
    assert dones == [TransferDone("r1", True, 0), TransferDone("r1", True, 1)]
    assert w.result("a", job0).success and w.result("a", job1).success
    assert w.hosts["b"].store_results[pin1].success
    assert not w.hosts["b"].violations


def test_terminal_empty_fetch_leaves_no_zombie_round() -> None:
    w = ready_world()
    w.lookup("a", "r1", [1, 2])  # b holds neither: all MISS
    w.stabilize()
    assert w.hosts["a"].lookup_results[0].hits == (False, False)
    w.finish("a", "r1")
    assert only(w.wire("a")) == Fetch("r1", (), (), 0)
    w.deliver("a")
    assert w.wire("b") == []
    assert not w.sessions["b"].has_pending_work
    # The id goes on (e.g. a new turn): its next round is served, not rejected as a duplicate.
    w.lookup("a", "r1", [8])
    assert only(w.wire("a")) == Lookup("r1", keys([8]), 0)  # nothing open: round 0 again
    w.stabilize()
    job = w.load("a", "r1", [8])
    w.stabilize()
    assert w.result("a", job).success
    assert not w.hosts["b"].violations


def test_abort_of_round_0_preserves_round_1_supply() -> None:
    w = ready_world()
    job0, xfer0, pin0, pin1 = round_0_in_flight_and_round_1_pinned(w)
    w.fire_next("a", "load")
    assert only(w.wire("a")) == AbortFetch("r1", 0)
    w.deliver("a")
    w.finish_write("b", xfer0, land=False)
    assert only(w.wire("b")) == AbortAck("r1", 0)
    assert w.hosts["b"].store_results[pin0] == StoreResult(pin0, False)
    assert pin1 not in w.hosts["b"].store_results
    w.deliver("b")
    assert w.result("a", job0) == LoadResult(job0, "r1", False, True)
    job1 = w.load("a", "r1", [9])
    w.stabilize()
    assert w.result("a", job1).success
    assert w.hosts["b"].store_results[pin1].success


def test_concurrent_loads_complete_by_round_with_out_of_order_transfer_dones() -> None:
    w = ready_world()
    job0, xfer0, _pin0, _pin1 = round_0_in_flight_and_round_1_pinned(w)
    job1 = w.load("a", "r1", [9])
    w.deliver("a")
    (xfer1,) = set(w.xfers("b")) - {xfer0}
    w.finish_write("b", xfer1)
    w.finish_write("b", xfer0)
    assert w.wire("b") == [TransferDone("r1", True, 1), TransferDone("r1", True, 0)]
    w.deliver("b")
    assert w.result("a", job1) == LoadResult(job1, "r1", True, True)
    assert job0 not in w.hosts["a"].load_results
    w.deliver("b")
    assert w.result("a", job0) == LoadResult(job0, "r1", True, True)


def test_concurrent_loads_one_failing_does_not_touch_the_other() -> None:
    w = ready_world()
    job0, xfer0, _pin0, _pin1 = round_0_in_flight_and_round_1_pinned(w)
    job1 = w.load("a", "r1", [9])
    w.deliver("a")
    (xfer1,) = set(w.xfers("b")) - {xfer0}
    w.finish_write("b", xfer0, land=False)  # round 0's write fails
    w.finish_write("b", xfer1)
    w.deliver_all("b")
    assert w.result("a", job0) == LoadResult(job0, "r1", False, True)
    assert w.result("a", job1) == LoadResult(job1, "r1", True, True)


def test_finish_with_an_inflight_load_and_an_open_lookup_round() -> None:
    w = ready_world(auto_answer=False)
    w.lookup("a", "r1", [8])
    w.deliver("a")
    w.answer("b", only(w.held["b"]).token, [8])
    w.deliver("b")
    job0 = w.load("a", "r1", [8])
    w.deliver("a")
    (xfer0,) = w.xfers("b")
    w.lookup("a", "r1", [9])
    w.deliver("a")  # b holds the round-1 lookup unanswered
    w.finish("a", "r1")
    assert w.wire("a") == [AbortFetch("r1", 0), Fetch("r1", (), (), 1)]
    assert w.hosts["a"].lookup_results[-1] == LookupResult("r1", keys([9]), (False,), False)
    w.deliver_all("a")
    assert w.out("b", LookupClosed)[-1].token == w.held["b"][-1].token
    assert w.wire("b") == []  # round 0 still drains; round 1 ends silently
    w.finish_write("b", xfer0)
    assert w.wire("b") == [AbortAck("r1", 0)]
    w.deliver("b")
    assert w.result("a", job0) == LoadResult(job0, "r1", False, True)
    assert not w.sessions["a"].has_pending_work and not w.sessions["b"].has_pending_work
    assert not w.hosts["b"].violations and not w.hosts["a"].violations


def test_unfetched_keys_are_pinned_again_by_the_next_round() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8, 9])
    w.stabilize()
    (pin0,) = pins_of(w, "b")
    job0 = w.load("a", "r1", [8])  # key 9 was a hit but is not fetched now
    w.stabilize()
    assert w.result("a", job0).success
    assert w.hosts["b"].store_results[pin0].success  # round 0's pins are released with it
    assert pins_of(w, "b") == set()
    w.lookup("a", "r1", [9])
    w.stabilize()
    (pin1,) = pins_of(w, "b")
    job1 = w.load("a", "r1", [9])
    w.stabilize()
    assert w.result("a", job1).success
    assert w.hosts["b"].store_results[pin1].success


def test_lookup_for_a_round_after_its_fetch_is_a_violation() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8])
    w.deliver("a")  # PD-style round 0 is serving (demand parked)
    before = w.counts("b")
    out = w.inject_msg("b", Lookup("r1", keys([8]), 0))
    assert len(out) == 1 and isinstance(out[0], ProtocolViolation)
    assert w.counts("b") == before
    w.supply("b", "r1", [8])
    w.stabilize()
    assert w.result("a", job).success



def test_terminal_empty_fetch_drains_a_round_with_a_write_in_flight() -> None:
    d = ready_driver()
    d.recv(Fetch("r1", keys([1, 2]), (5, 6), 0))
    write = only(of_type(d(HostSupply(10, "r1", keys([1]), (1,))), StartWrite))
    out = d.recv(Fetch("r1", (), (), 1))
    assert of_type(out, CancelWrite) == [CancelWrite(write.xfer)]
    assert not of_type(out, StoreResult) and sent(out) == []  # the pin is still read
    out = d(WriteFinished(write.xfer, True))
    assert of_type(out, StoreResult) == [StoreResult(10, False)]
    assert sent(out) == []  # the request is over: no transfer_done
    assert not d.s.has_pending_work
