"""Session loss mid-transfer: loads fail at once but keep their destination (a write may
still land); pins are released only once their writes are quiescent."""

from __future__ import annotations

from helpers.world import World, keys, only, ready_driver, ready_world

from p2pfsm.fsm import Tracer
from p2pfsm.protocol import Fetch
from p2pfsm.session import (
    CancelWrite,
    LoadResult,
    LookupClosed,
    LookupResult,
    StoreResult,
    TransportLost,
)


def test_cut_mid_transfer_fails_the_load_but_keeps_its_destination() -> None:
    w = ready_world()
    store = w.supply("b", "r1", [8])
    job = w.load("a", "r1", [8])
    w.deliver("a")
    (xfer,) = w.xfers("b")
    w.cut()
    for node in ("a", "b"):
        assert w.sessions[node].state == "dead"
        assert only(w.hosts[node].deaths).reason == "transport lost: simulated cut"
    assert w.result("a", job) == LoadResult(job, "r1", False, False)
    assert store not in w.hosts["b"].store_results  # its write still reads the pin
    assert w.out("b", CancelWrite) == [CancelWrite(xfer)]
    w.land("b", xfer)  # lands in blocks a still keeps: no SafetyViolation
    w.complete("b", xfer)
    assert w.hosts["b"].store_results[store] == StoreResult(store, False)
    assert w.channels[("a", "b")] == [] and w.channels[("b", "a")] == []
    assert w.hosts["a"].quiet and w.hosts["b"].quiet


def test_cut_reports_lookups_and_served_lookups() -> None:
    w = ready_world(auto_answer=False)
    w.lookup("a", "r1", [8])
    w.deliver("a")
    token = w.held["b"][0].token
    w.cut()
    assert w.hosts["a"].lookup_results == [LookupResult("r1", keys([8]), (False,), False)]
    assert w.out("b", LookupClosed) == [LookupClosed(token)]
    assert w.timers["a"] == {} and w.timers["b"] == {}


def test_loss_while_aborting_keeps_the_destination() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8])
    w.deliver("a")
    w.fire_next("a", "load")
    w.cut()
    assert w.result("a", job) == LoadResult(job, "r1", False, False)


def test_a_round_lost_while_aborting_ends_orphaned() -> None:
    """Not done: the abort's write may still land, so the round ends orphaned (what the
    spec and trace validation read), whatever the host is told."""
    tracer = Tracer()
    w = World(tracer=tracer)
    w.handshake()
    w.load("a", "r1", [8])
    w.deliver("a")
    w.fire_next("a", "load")
    w.cut()
    ends = [(r.trigger, r.source, r.dest) for r in tracer.records
            if r.machine == "client_round" and r.dest in ("done", "aborted", "orphaned")]
    assert ends == [("session_lost", "aborting", "orphaned")]


def test_a_round_lost_before_its_fetch_was_sent_ends_done() -> None:
    """Its fetch was still queued (the handshake had not completed): nothing can land,
    so the round ends done and its destination is released."""
    tracer = Tracer()
    w = World(tracer=tracer)
    w.start()
    job = w.load("a", "r1", [8])
    w.cut()
    assert w.result("a", job).released
    ends = [(r.trigger, r.source, r.dest) for r in tracer.records
            if r.machine == "client_round" and r.dest in ("done", "aborted", "orphaned")]
    assert ends == [("session_lost_unsent", "loading", "done")]


def test_loss_during_the_handshake_drops_queued_frames() -> None:
    w = World()
    w.start()
    job = w.load("a", "r1", [8])
    w.cut()
    assert w.result("a", job).success is False
    assert not any(isinstance(m, Fetch) for m in w.sent["a"])


def test_transport_lost_twice_is_harmless() -> None:
    d = ready_driver()
    out = d(TransportLost("first"))
    assert d.s.state == "dead" and out
    assert d(TransportLost("second")) == []
