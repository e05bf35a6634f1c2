"""PD fetch scenarios (vLLM's PD flows): supply before/after the fetch, partial supply,
one transfer_done per round, host finish with unmet demand, prefiller-first finish."""

from __future__ import annotations

import pytest
from helpers.world import World, keys, of_type, ready_world, snapshot

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import LocalProtocolError
from p2pfsm.protocol import AbortAck, Fetch, TransferDone
from p2pfsm.session import (
    CancelWrite,
    FetchArrived,
    HostDecline,
    HostFetch,
    HostSupply,
    LoadResult,
    StartWrite,
    StoreResult,
)


def transfer_dones(w: World) -> list[TransferDone]:
    return w.sent_of("b", TransferDone)


def assert_idle(w: World) -> None:
    for node in ("a", "b"):
        counts = w.counts(node)
        assert counts["client_round"] == counts["server_round"] == counts["writes"] == 0, counts
        assert not w.sessions[node].has_pending_work
        assert w.hosts[node].quiet


def test_supply_before_fetch_is_written_when_the_fetch_arrives() -> None:
    w = ready_world()
    store = w.supply("b", "r1", [8, 9])
    assert w.xfers("b") == []
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    arrived = w.out("b", FetchArrived)
    assert arrived == [FetchArrived("r1", 0, keys([8, 9]), keys([8, 9]))]
    assert arrived[0].missing == ()
    write = w.out("b", StartWrite)[-1]
    assert write.local_indexes == (8, 9)
    assert write.remote_indexes == w.hosts["a"].loads[job].dest
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", True, 0)]
    w.deliver_all("b")
    assert w.result("a", job) == LoadResult(job, "r1", True, True)
    assert w.hosts["b"].store_results[store] == StoreResult(store, True)
    assert_idle(w)


def test_loaded_bytes_equal_the_producers_blocks() -> None:
    w = ready_world()
    w.supply("b", "r1", [10, 11, 12])
    job = w.load("a", "r1", [10, 11, 12])
    dest = w.hosts["a"].loads[job].dest
    w.stabilize()
    assert w.result("a", job).success
    for k, d in zip((10, 11, 12), dest, strict=True):
        assert w.hosts["a"].block(d) == demo_block(k, 16) == w.hosts["b"].block(k)


def test_supply_after_fetch_serves_the_parked_demand() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    assert w.out("b", StartWrite) == []
    assert w.counts("b")["server_round"] == 1
    assert w.out("b", FetchArrived)[-1].missing == keys([8, 9])
    store = w.supply("b", "r1", [8, 9])
    write = w.out("b", StartWrite)[-1]
    assert write.local_indexes == (8, 9)
    w.finish_writes("b")
    w.deliver_all("b")
    assert w.result("a", job) == LoadResult(job, "r1", True, True)
    assert w.hosts["b"].store_results[store].success
    assert_idle(w)


def test_partial_supply_in_two_batches_gives_one_transfer_done() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9, 10, 11])
    w.deliver("a")
    first = w.supply("b", "r1", [8, 9])
    assert len(w.out("b", StartWrite)) == 1
    w.finish_writes("b")
    assert transfer_dones(w) == []  # two blocks are still missing
    assert w.out("b", StoreResult) == []
    second = w.supply("b", "r1", [10, 11])
    writes = w.out("b", StartWrite)
    assert len(writes) == 2 and writes[1].local_indexes == (10, 11)
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", True, 0)]
    w.deliver_all("b")
    assert w.result("a", job).success
    assert {r.job_id for r in w.out("b", StoreResult)} == {first, second}
    assert_idle(w)


def test_fetch_arrived_names_the_keys_still_missing_after_partial_supply() -> None:
    w = ready_world()
    w.supply("b", "r1", [9])
    w.load("a", "r1", [8, 9, 10])
    w.deliver("a")
    arrived = w.out("b", FetchArrived)[-1]
    assert arrived.supplied == keys([9])
    assert arrived.missing == keys([8, 10])


def test_each_round_of_a_request_gets_exactly_one_transfer_done() -> None:
    w = ready_world()
    first = w.load("a", "r1", [8])
    second = w.load("a", "r1", [9])  # concurrent: its own round
    fetch = w.wire("a")[1]
    assert isinstance(fetch, Fetch) and fetch.round_seq == 1
    w.supply("b", "r1", [8])
    w.stabilize()
    w.supply("b", "r1", [9])
    w.stabilize()
    assert transfer_dones(w) == [TransferDone("r1", True, 0), TransferDone("r1", True, 1)]
    results = w.hosts["a"].load_results
    assert results[first].success and results[second].success
    assert_idle(w)


def test_host_finish_with_unmet_demand_sends_failure() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    store = w.supply("b", "r1", [8])
    w.finish_writes("b")
    assert transfer_dones(w) == []
    w.finish("b", "r1")
    assert transfer_dones(w) == [TransferDone("r1", False, 0)]
    assert [r.job_id for r in w.out("b", StoreResult)] == [store]
    w.deliver_all("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)
    assert_idle(w)


def test_host_finish_waits_for_the_write_in_flight() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    w.supply("b", "r1", [8])
    w.finish("b", "r1")
    assert transfer_dones(w) == []  # a write is in flight: the round cannot end yet
    assert w.out("b", StoreResult) == []
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", False, 0)]
    w.deliver_all("b")
    assert not w.result("a", job).success


def test_host_finish_after_full_supply_still_succeeds() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    w.supply("b", "r1", [8, 9])
    w.finish("b", "r1")
    assert transfer_dones(w) == []
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", True, 0)]
    w.deliver_all("b")
    assert w.result("a", job).success


def test_prefiller_first_finish_fully_supplied_succeeds() -> None:
    w = ready_world()
    store = w.supply("b", "r1", [8, 9])
    w.finish("b", "r1")
    assert w.sent["b"][2:] == []  # nothing to say before a fetch
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    assert w.out("b", StartWrite)[-1].local_indexes == (8, 9)
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", True, 0)]
    w.deliver_all("b")
    assert w.result("a", job).success
    assert w.hosts["b"].store_results[store].success
    assert_idle(w)


def test_a_second_host_finish_changes_nothing() -> None:
    """finish, fetch (finishing: the write is in flight), finish again: the round still
    ends with its transfer_done once the write landed."""
    w = ready_world()
    w.supply("b", "r1", [8, 9])
    w.finish("b", "r1")
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    before = snapshot(w.sessions["b"])
    w.finish("b", "r1")
    assert snapshot(w.sessions["b"]) == before
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", True, 0)]
    w.deliver_all("b")
    assert w.result("a", job).success
    assert_idle(w)


def test_prefiller_first_finish_partially_supplied_fails_after_the_write() -> None:
    w = ready_world()
    w.supply("b", "r1", [8])
    w.finish("b", "r1")
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    assert w.out("b", StartWrite)[-1].local_indexes == (8,)
    assert transfer_dones(w) == []
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", False, 0)]
    w.deliver_all("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)
    assert_idle(w)


def test_an_abort_reaches_a_prefiller_first_round_once_its_fetch_named_it() -> None:
    """A supply parked before any fetch has no round number; the fetch gives it one, so
    the consumer's abort of that round finds it: abort_ack waits for the write."""
    w = ready_world()
    w.supply("b", "r1", [8])
    w.finish("b", "r1")
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    assert len(w.xfers("b")) == 1
    w.fire_next("a", "load")
    w.deliver_all("a")
    assert w.sent_of("b", AbortAck) == [] and transfer_dones(w) == []  # the write may land
    w.finish_writes("b")
    assert len(w.sent_of("b", AbortAck) + transfer_dones(w)) == 1
    w.deliver_all("b")
    assert w.result("a", job).released
    assert_idle(w)


def test_a_lookup_pinned_round_the_host_finished_is_served_then_ends() -> None:
    """Pins from a lookup, then the host finishes the request, then the fetch: the pinned
    blocks are written and the round ends with transfer_done once they landed."""
    w = ready_world()
    w.lookup("a", "r1", [8, 9])
    w.stabilize()
    w.finish("b", "r1")
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    assert len(w.xfers("b")) == 1 and transfer_dones(w) == []
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", True, 0)]
    w.deliver_all("b")
    assert w.result("a", job).success
    assert_idle(w)


def test_a_lookup_pinned_round_the_host_finished_fails_at_its_demand_deadline() -> None:
    """As above, but the write never completes: the demand deadline fails the round (its
    write is cancelled, transfer_done(false) once the cancel completed)."""
    w = ready_world()
    w.lookup("a", "r1", [8, 9])
    w.stabilize()
    w.finish("b", "r1")
    w.load("a", "r1", [8, 9])
    w.deliver("a")
    (xfer,) = w.xfers("b")
    w.fire_next("b", "demand")
    assert [c.xfer for c in w.out("b", CancelWrite)] == [xfer]
    assert transfer_dones(w) == []
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", False, 0)]


@pytest.mark.parametrize("before", ["nothing", "parked-supply", "served"])
def test_supply_for_a_request_the_host_finished_is_refused(before: str) -> None:
    """HostSupply after HostFinish of the same request raises LocalProtocolError and
    changes nothing, whether the finish left a parked round, none (a new round would wait
    for a fetch that never comes, its pins held until the store deadline) or one that
    was served and ended. Other requests are not affected."""
    w = ready_world()
    if before == "parked-supply":
        w.supply("b", "r1", [8])
    elif before == "served":
        job = w.load("a", "r1", [8])
        w.supply("b", "r1", [8])
        w.stabilize()
        assert w.result("a", job).success
    w.finish("b", "r1")
    s = w.sessions["b"]
    snap = snapshot(s)
    with pytest.raises(LocalProtocolError, match="'r1' was finished by this host"):
        s.handle(HostSupply(99, "r1", (demo_key(9),), (9,)), w.now)
    assert snapshot(s) == snap
    assert w.supply("b", "r1", [9]) is None  # the simulated host obeys the rule
    other = w.supply("b", "r2", [9])
    assert other is not None and other not in w.hosts["b"].store_results  # parked


def test_unfetched_supply_is_released_at_the_store_deadline() -> None:
    w = ready_world()
    store = w.supply("b", "r1", [8, 9])
    assert w.advance()
    assert w.hosts["b"].store_results[store] == StoreResult(store, False)
    assert w.sent["b"][2:] == []
    assert_idle(w)


def test_store_deadline_is_disarmed_by_the_fetch() -> None:
    w = ready_world()
    store = w.supply("b", "r1", [8])
    job = w.load("a", "r1", [8])
    w.deliver("a")
    assert all(t[0] != "store" for t in w.timers["b"])
    w.stabilize()
    assert w.hosts["b"].store_results[store].success
    assert w.result("a", job).success


def test_a_new_round_of_a_request_the_host_finished_fails_at_once_unasked() -> None:
    """The consumer continues a request after its producer's host finished it (round 0
    named a key the host lacks, so the host finished the request): round 1's fetch gets
    transfer_done(false) at once, no write starts and the host is never told of it
    (asked, it could only break the rule that no supply follows a finish)."""
    w = ready_world()
    w.inject_msg("b", Fetch("r1", keys([40]), (0,), 0))
    assert [a.round_seq for a in w.out("b", FetchArrived)] == [0]
    w.finish("b", "r1")
    assert transfer_dones(w) == [TransferDone("r1", False, 0)]
    outs = w.inject_msg("b", Fetch("r1", keys([8]), (1,), 1))
    assert of_type(outs, FetchArrived) == [] and of_type(outs, StartWrite) == []
    assert transfer_dones(w) == [TransferDone("r1", False, 0), TransferDone("r1", False, 1)]
    assert w.types("b") == ["transfer_done", "transfer_done"]  # nothing else (no abort_ack)
    assert w.counts("b")["server_round"] == 0


def test_a_consumer_continuing_after_the_producer_finished_gets_one_failure_per_round() -> None:
    """The same through the consumer's own session: each load gets exactly one result."""
    w = ready_world()
    first = w.load("a", "r1", [8])
    w.deliver("a")
    w.finish("b", "r1")
    w.deliver_all("b")
    assert w.result("a", first) == LoadResult(first, "r1", False, True)
    asked = len(w.out("b", FetchArrived))
    second = w.load("a", "r1", [9])
    w.deliver("a")
    assert len(w.out("b", FetchArrived)) == asked
    w.deliver_all("b")
    assert w.result("a", second) == LoadResult(second, "r1", False, True)
    assert [d.success for d in transfer_dones(w)] == [False, False]
    assert_idle(w)


def test_a_declined_round_fails_once_its_write_landed_and_the_request_goes_on() -> None:
    """HostDecline fails one fetched round (its other keys will never be supplied): the
    write already started lands first, then transfer_done(false); the pins are released.
    The next round of the same request is served as usual (a finish would fail it)."""
    w = ready_world()
    first = w.load("a", "r1", [8, 9])
    w.deliver("a")
    store = w.supply("b", "r1", [8])
    assert len(w.xfers("b")) == 1
    w.decline("b", "r1", 0)
    assert transfer_dones(w) == []  # a write is in flight: no reply before it ends
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", False, 0)]
    assert w.hosts["b"].store_results[store] == StoreResult(store, False)
    w.deliver_all("b")
    assert not w.result("a", first).success
    second = w.load("a", "r1", [9])
    w.deliver("a")
    assert len(w.out("b", FetchArrived)) == 2  # the host is asked again
    w.supply("b", "r1", [9])
    w.finish_writes("b")
    w.deliver_all("b")
    assert w.result("a", second).success
    assert [d.success for d in transfer_dones(w)] == [False, True]
    assert_idle(w)


def test_a_second_decline_while_the_write_drains_changes_nothing() -> None:
    """A declined round drains its write (draining_failed): declining it again, or the
    host supplying the rest, neither fails it twice nor starts a write."""
    w = ready_world()
    w.load("a", "r1", [8, 9])
    w.deliver("a")
    w.supply("b", "r1", [8])
    w.decline("b", "r1", 0)
    before = (snapshot(w.sessions["b"]), len(w.outputs["b"]))
    w.decline("b", "r1", 0)
    assert (snapshot(w.sessions["b"]), len(w.outputs["b"])) == before
    w.finish_writes("b")
    assert transfer_dones(w) == [TransferDone("r1", False, 0)]


def test_decline_of_a_round_no_fetch_named_is_refused_and_of_an_ended_one_is_nothing() -> None:
    w = ready_world()
    before = snapshot(w.sessions["b"])
    with pytest.raises(LocalProtocolError, match="decline"):
        w.feed("b", HostDecline("r1", -1))
    assert snapshot(w.sessions["b"]) == before
    w.decline("b", "r9", 0)  # no such round: ended (or never was), nothing to fail
    assert snapshot(w.sessions["b"]) == before and transfer_dones(w) == []


def test_decline_of_a_round_whose_fetch_has_not_arrived_is_refused() -> None:
    """A lookup pinned round 0, no fetch yet: there is no demand to decline."""
    w = ready_world()
    w.lookup("a", "r1", [8])
    w.stabilize()
    before = snapshot(w.sessions["b"])
    with pytest.raises(LocalProtocolError) as err:
        w.feed("b", HostDecline("r1", 0))
    assert str(err.value) == ("decline: no fetch of r1/0 has arrived yet (its round is "
                              "pinned)")
    assert snapshot(w.sessions["b"]) == before


def test_a_fetch_naming_one_destination_twice_is_refused_locally() -> None:
    """Two blocks cannot land in one destination: the host's fetch is refused before
    anything is sent, naming the index, and changes nothing."""
    w = ready_world()
    s = w.sessions["a"]
    before = snapshot(s)
    with pytest.raises(LocalProtocolError, match="destination index 3 named twice"):
        s.handle(HostFetch(77, "r1", (demo_key(8), demo_key(9)), (3, 3)), w.now)
    assert snapshot(s) == before and w.channels[("a", "b")] == []
