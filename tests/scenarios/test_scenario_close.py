"""close(): every outstanding job gets its result -- loads at once (destination kept,
released=False, a write may still land), stores only once their writes are quiescent."""

from __future__ import annotations

from helpers.world import Driver, World, keys, ready_world

from p2pfsm.protocol import Disconnect, TransferDone
from p2pfsm.session import (
    CancelWrite,
    HostClose,
    HostFetch,
    HostFinish,
    HostStart,
    LoadResult,
    LookupClosed,
    LookupResult,
    SessionDead,
    StoreResult,
)


def test_close_reports_loads_at_once_without_releasing_their_destination() -> None:
    w = ready_world()
    w.supply("b", "r1", [8])
    job = w.load("a", "r1", [8])
    dest = w.hosts["a"].loads[job].dest
    w.deliver("a")
    (xfer,) = w.xfers("b")
    w.feed("a", HostClose())
    assert w.result("a", job) == LoadResult(job, "r1", False, False)
    assert w.sessions["a"].state == "closed"
    assert w.wire("a") == [Disconnect()]
    assert all(w.hosts["a"].owner[d] == job for d in dest)  # still quarantined
    w.land("b", xfer)  # the peer's write may still land: safe, the blocks were kept
    w.complete("b", xfer)
    assert w.timers["a"] == {}


def test_close_reports_stores_only_after_their_writes_complete() -> None:
    w = ready_world()
    store = w.supply("b", "r1", [8])
    w.load("a", "r1", [8])
    w.deliver("a")
    (xfer,) = w.xfers("b")
    w.feed("b", HostClose())
    assert w.out("b", CancelWrite) == [CancelWrite(xfer)]
    assert store not in w.hosts["b"].store_results  # the write still reads the pin
    w.land("b", xfer)
    w.complete("b", xfer)
    assert w.hosts["b"].store_results[store] == StoreResult(store, False)
    assert w.sent_of("b", TransferDone) == []  # a closed session replies nothing
    assert not w.sessions["b"].has_pending_work


def test_close_reports_parked_supply_and_lookups_at_once() -> None:
    w = ready_world(auto_answer=False)
    store = w.supply("b", "r1", [8])
    w.lookup("a", "r2", [9])
    w.deliver("a")
    token = w.held["b"][0].token
    w.feed("b", HostClose())
    assert w.hosts["b"].store_results[store] == StoreResult(store, False)
    assert w.out("b", LookupClosed) == [LookupClosed(token)]
    w.feed("a", HostClose())
    assert w.hosts["a"].lookup_results == [LookupResult("r2", keys([9]), (False,), False)]
    # A host answer arriving after the close finds no lookup: its pins are freed at once.
    pin = w.answer("b", token, [9])
    assert pin is not None and w.hosts["b"].store_results[pin] == StoreResult(pin, False)
    for node in ("a", "b"):
        assert w.hosts[node].quiet
        assert w.counts(node) == {k: 0 for k in w.counts(node)}


def test_close_of_an_aborting_load_keeps_its_destination() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8])
    w.deliver("a")
    w.fire_next("a", "load")
    w.feed("a", HostClose())
    assert w.result("a", job) == LoadResult(job, "r1", False, False)
    assert w.timers["a"] == {}


def test_close_sends_disconnect_and_the_peer_reports_its_work() -> None:
    w = ready_world()
    job_b = w.load("b", "r9", [1])  # b loads from a; a never supplies
    store_b = w.supply("b", "r1", [8])  # parked supply for a fetch that never comes
    w.deliver("b")
    w.feed("a", HostClose())
    w.deliver("a")
    b = w.sessions["b"]
    assert b.state == "ended"
    assert [d.reason for d in w.hosts["b"].deaths] == ["peer disconnected"]
    assert w.result("b", job_b) == LoadResult(job_b, "r9", False, False)
    assert w.hosts["b"].store_results[store_b] == StoreResult(store_b, False)
    assert w.hosts["a"].quiet and w.hosts["b"].quiet


def test_close_is_idempotent() -> None:
    w = ready_world()
    w.load("a", "r1", [8])
    first = w.feed("a", HostClose())
    assert any(isinstance(o, LoadResult) for o in first)
    assert w.feed("a", HostClose()) == []
    assert w.sessions["a"].state == "closed"


def test_host_calls_after_close_fail_at_once() -> None:
    w = ready_world()
    w.feed("a", HostClose())
    w.drop_all("a")
    job = w.load("a", "r1", [8])
    assert w.result("a", job) == LoadResult(job, "r1", False, True)  # nothing was sent
    store = w.supply("a", "r2", [1])
    assert w.hosts["a"].store_results[store] == StoreResult(store, False)
    w.lookup("a", "r3", [9])
    assert w.hosts["a"].lookup_results == [LookupResult("r3", keys([9]), (False,), False)]
    assert w.wire("a") == []
    assert not w.out("a", SessionDead)


def test_close_before_the_handshake_completes_reports_queued_work() -> None:
    w = World()
    w.start()
    job = w.load("a", "r1", [8])
    w.lookup("a", "r2", [9])
    w.feed("a", HostClose())
    assert w.result("a", job).success is False
    assert w.hosts["a"].lookup_results == [LookupResult("r2", keys([9]), (False,), False)]
    assert w.types("a") == ["connect", "disconnect"]  # queued frames were never sent


def test_a_load_aborted_before_the_handshake_is_released_on_close() -> None:
    """Never ready: neither the fetch nor its abort left the queue, so no write can land
    (client_round aborting -> done by session_lost_unsent, beyond the gate config)."""
    d = Driver()
    d(HostStart())
    d(HostFetch(1, "r1", keys([1]), (3,)))
    d(HostFinish("r1"))
    rnd = d.s.view.loads["r1"][0]
    assert rnd.fsm_state == "aborting"
    out = d(HostClose())
    assert [o for o in out if isinstance(o, LoadResult)] == [LoadResult(1, "r1", False, True)]
    assert rnd.fsm_state == "done" and d.s.state == "closed"
    assert d.timers == {}
