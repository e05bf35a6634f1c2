"""Symmetric lookup -> fetch scenarios (vLLM's lookup flow): pins,
round_seq, fail-fast, the terminal empty fetch, and both lookup deadlines."""

from __future__ import annotations

from dataclasses import replace

from helpers.world import (
    World,
    key,
    keys,
    local_config,
    of_type,
    only,
    ready_driver,
    ready_world,
    sent,
    snapshot,
)

from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, Lookup, LookupResp, TransferDone
from p2pfsm.session import (
    HostAnswerLookup,
    LoadResult,
    LookupClosed,
    LookupRequest,
    LookupResult,
    ProtocolViolation,
    SessionDead,
    StartWrite,
    StoreResult,
    TimerId,
)


def pinned_jobs(w: World, node: str) -> set[int]:
    """Store jobs of ``node`` whose pins are not released yet."""
    host = w.hosts[node]
    return set(host.store_jobs) - set(host.store_results)


def test_lookup_answers_in_wire_order_and_pins_the_hits() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8, 3, 9])
    lookup = only(w.wire("a"))
    assert lookup == Lookup("r1", keys([8, 3, 9]), 0)
    w.deliver("a")
    req = only(w.out("b", LookupRequest))
    assert (req.kv_request_id, req.round_seq, req.keys) == ("r1", 0, keys([8, 3, 9]))
    assert only(w.wire("b")) == LookupResp("r1", keys([8, 3, 9]), (True, False, True))
    assert w.out("b", LookupClosed) == [LookupClosed(req.token)]
    assert len(pinned_jobs(w, "b")) == 1  # the hits stay pinned for the fetch
    assert w.counts("b")["server_round"] == 1
    w.deliver("b")
    assert w.hosts["a"].lookup_results == [
        LookupResult("r1", keys([8, 3, 9]), (True, False, True), True)]


def test_fetch_after_lookup_carries_its_round_and_is_served_from_the_pins() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8, 9])
    w.stabilize()
    (pin,) = pinned_jobs(w, "b")
    job = w.load("a", "r1", [8, 9])
    assert only(w.wire("a")) == Fetch("r1", keys([8, 9]), w.hosts["a"].loads[job].dest, 0)
    w.deliver("a")
    write = only(w.out("b", StartWrite))  # no host supply needed
    assert write.local_indexes == (8, 9)
    w.finish_writes("b")
    assert w.sent_of("b", TransferDone) == [TransferDone("r1", True, 0)]
    w.deliver_all("b")
    assert w.result("a", job) == LoadResult(job, "r1", True, True)
    assert w.hosts["b"].store_results[pin] == StoreResult(pin, True)
    assert w.hosts["a"].quiet and w.hosts["b"].quiet


def test_a_lookup_after_a_finished_fetch_starts_round_zero_again() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8])
    w.stabilize()
    w.load("a", "r1", [8])
    w.stabilize()
    w.lookup("a", "r1", [9])
    assert only(w.wire("a")) == Lookup("r1", keys([9]), 0)  # nothing open: round 0 again
    w.stabilize()
    w.load("a", "r1", [9])
    fetch = only(w.wire("a"))
    assert isinstance(fetch, Fetch) and fetch.round_seq == 0
    w.stabilize()
    dones = w.sent_of("b", TransferDone)
    assert dones == [TransferDone("r1", True, 0), TransferDone("r1", True, 0)]


def test_several_lookups_of_one_round_share_its_round_seq() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8])
    w.lookup("a", "r1", [9])
    assert w.wire("a") == [Lookup("r1", keys([8]), 0), Lookup("r1", keys([9]), 0)]
    w.stabilize()
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    assert only(w.out("b", StartWrite)).local_indexes == (8, 9)
    w.stabilize()
    assert w.result("a", job).success


def test_unmatched_symmetric_fetch_fails_fast_without_a_write() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8])
    w.stabilize()
    (pin,) = pinned_jobs(w, "b")
    job = w.load("a", "r1", [8, 20])  # key 20 was never confirmed (b does not hold it)
    w.deliver("a")
    assert w.out("b", StartWrite) == []
    assert only(w.wire("b")) == TransferDone("r1", False, 0)
    assert w.hosts["b"].store_results[pin] == StoreResult(pin, False)
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)
    assert w.counts("b")["server_round"] == 0
    assert w.counts("b")["timers"] == 0  # the pins' store deadline went with them


def test_terminal_empty_fetch_drops_the_parked_lookup_without_replies() -> None:
    w = ready_world(auto_answer=False)
    w.lookup("a", "r1", [8, 9])
    w.deliver("a")
    req = only(w.held["b"])
    w.finish("a", "r1")
    assert w.wire("a") == [Fetch("r1", (), (), 0)]
    assert w.hosts["a"].lookup_results == [LookupResult("r1", keys([8, 9]), (False, False), False)]
    w.deliver("a")
    assert w.out("b", LookupClosed) == [LookupClosed(req.token)]
    assert w.wire("b") == []  # neither lookup_resp nor transfer_done
    # The host's late answer finds the lookup gone: its pins are released at once.
    pin = w.answer("b", req.token, [8, 9])
    assert pin is not None
    assert w.hosts["b"].store_results[pin] == StoreResult(pin, False)
    assert w.wire("b") == []
    assert not w.sessions["b"].has_pending_work


def test_terminal_empty_fetch_releases_unfetched_pins_silently() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8, 9])
    w.stabilize()
    (pin,) = pinned_jobs(w, "b")
    w.finish("a", "r1")
    assert w.wire("a") == [Fetch("r1", (), (), 0)]
    w.deliver("a")
    assert w.hosts["b"].store_results[pin] == StoreResult(pin, False)
    assert w.wire("b") == []
    assert w.counts("b")["server_round"] == 0


def test_finish_without_a_lookup_sends_nothing() -> None:
    w = ready_world()
    w.finish("a", "r1")
    assert w.wire("a") == []


def test_finish_after_the_lookup_round_was_fetched_sends_no_empty_fetch() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8])
    w.stabilize()
    job = w.load("a", "r1", [8])
    w.stabilize()
    assert w.result("a", job).success
    w.finish("a", "r1")
    assert w.wire("a") == []


def test_client_lookup_deadline_answers_miss_and_keeps_the_session() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8, 9])
    w.drop_all("a")  # the peer never sees it (silent peer)
    w.fire_next("a", "lookup")
    assert w.hosts["a"].lookup_results == [LookupResult("r1", keys([8, 9]), (False, False), False)]
    assert w.sessions["a"].ready
    assert not w.out("a", SessionDead)
    # The session still serves other work.
    w.supply("b", "r2", [10])
    job = w.load("a", "r2", [10])
    w.stabilize()
    assert w.result("a", job).success
    for _ in range(10):
        if not w.advance():
            break
    assert len(w.hosts["a"].lookup_results) == 1
    assert w.sessions["a"].ready


def test_late_lookup_resp_after_the_client_deadline_is_dropped() -> None:
    w = ready_world(auto_answer=False)
    w.lookup("a", "r1", [8])
    w.deliver("a")
    req = only(w.held["b"])
    w.fire_next("a", "lookup")
    assert len(w.hosts["a"].lookup_results) == 1
    w.answer("b", req.token, [8])
    assert only(w.wire("b")) == LookupResp("r1", keys([8]), (True,))
    w.deliver("b")
    assert w.hosts["a"].lookup_results == [LookupResult("r1", keys([8]), (False,), False)]
    assert w.sessions["a"].ready


def test_server_resolves_pending_keys_to_miss_at_its_deadline() -> None:
    d = ready_driver()
    out = d.recv(Lookup("r1", (key(1), key(2), key(3)), 0))
    req = only(of_type(out, LookupRequest))
    assert req.keys == (key(1), key(2), key(3))
    out = d(HostAnswerLookup(req.token, {key(1): 5}, 70, frozenset({key(2)})))
    assert sent(out) == []  # key 2 is still pending
    assert d.armed("lookup_pending") == [TimerId("lookup_pending", (req.token,))]
    out = d.fire(TimerId("lookup_pending", (req.token,)))
    assert sent(out) == [LookupResp("r1", (key(1), key(2), key(3)), (True, False, False))]
    assert of_type(out, LookupClosed) == [LookupClosed(req.token)]
    assert not of_type(out, StoreResult)  # the hit stays pinned for the fetch
    out = d.recv(Fetch("r1", (key(1),), (9,), 0))
    write = only(of_type(out, StartWrite))
    assert (write.local_indexes, write.remote_indexes) == ((5,), (9,))


def test_server_pending_key_resolved_in_time_is_a_hit() -> None:
    d = ready_driver()
    req = only(of_type(d.recv(Lookup("r1", (key(1), key(2), key(3)), 0)), LookupRequest))
    d(HostAnswerLookup(req.token, {key(1): 5}, 70, frozenset({key(2), key(3)})))
    assert sent(d(HostAnswerLookup(req.token, {key(2): 6}, 71, frozenset({key(3)})))) == []
    out = d(HostAnswerLookup(req.token, {}, None, frozenset()))
    assert sent(out) == [LookupResp("r1", (key(1), key(2), key(3)), (True, True, False))]
    assert d.armed("lookup_pending") == []
    out = d.recv(Fetch("r1", (key(1), key(2)), (0, 1), 0))
    write = only(of_type(out, StartWrite))
    assert sorted(zip(write.local_indexes, write.remote_indexes, strict=True)) == [(5, 0), (6, 1)]


def test_lookups_of_one_request_are_answered_in_arrival_order() -> None:
    d = ready_driver()
    first = only(of_type(d.recv(Lookup("r1", (key(1),), 0)), LookupRequest))
    second = only(of_type(d.recv(Lookup("r1", (key(2),), 0)), LookupRequest))
    assert sent(d(HostAnswerLookup(second.token, {}, None))) == []
    out = d(HostAnswerLookup(first.token, {}, None))
    assert sent(out) == [
        LookupResp("r1", (key(1),), (False,)), LookupResp("r1", (key(2),), (False,))]
    assert of_type(out, LookupClosed) == [LookupClosed(first.token), LookupClosed(second.token)]


def test_duplicate_keys_in_a_lookup_are_asked_once_and_echoed() -> None:
    d = ready_driver()
    req = only(of_type(d.recv(Lookup("r1", (key(1), key(1), key(2)), 0)), LookupRequest))
    assert req.keys == (key(1), key(2))
    out = d(HostAnswerLookup(req.token, {key(1): 3}, 80))
    assert sent(out) == [LookupResp("r1", (key(1), key(1), key(2)), (True, True, False))]


def test_lookups_past_the_per_request_bound_are_refused_and_change_nothing() -> None:
    d = ready_driver(replace(local_config(), max_lookups_per_request=2))
    first = only(of_type(d.recv(Lookup("r1", (key(1),), 0)), LookupRequest))
    only(of_type(d.recv(Lookup("r1", (key(2),), 1)), LookupRequest))
    before = snapshot(d.s)
    out = d.recv(Lookup("r1", (key(3),), 2))
    violation = only(out)
    assert isinstance(violation, ProtocolViolation)
    assert "max_lookups_per_request" in str(violation.error)
    assert snapshot(d.s) == before
    only(of_type(d.recv(Lookup("r2", (key(4),), 0)), LookupRequest))  # others still served
    d(HostAnswerLookup(first.token, {}, None))  # one answered: room for one more
    only(of_type(d.recv(Lookup("r1", (key(3),), 2)), LookupRequest))


def test_an_unanswered_lookup_is_counted_open_on_both_sides() -> None:
    w = ready_world(auto_answer=False)
    w.lookup("a", "r1", [8])
    w.deliver("a")
    assert len(w.held["b"]) == 1  # the producer's host holds its answer
    assert (w.counts("a")["client_lookup"], w.counts("b")["server_lookup"]) == (1, 1)
    assert w.counts("a")["server_lookup"] == w.counts("b")["client_lookup"] == 0


def test_a_fetch_of_pins_whose_request_the_host_finished_stops_their_store_deadline() -> None:
    """Lookup pins of a request the producer's host then finished (pinned_closed): the
    fetch that takes them writes them and ends the round; the pins' store deadline is
    over (the demand deadline bounds the round now)."""
    w = ready_world()
    w.lookup("a", "r1", [8, 9])
    w.stabilize()
    assert [t.kind for t in w.timers["b"]].count("store") == 1
    w.finish("b", "r1")
    assert [t.kind for t in w.timers["b"]].count("store") == 1  # the pins wait for a fetch
    job = w.load("a", "r1", [8, 9])
    w.deliver("a")
    only(w.out("b", StartWrite))
    assert [t.kind for t in w.timers["b"] if t.kind == "store"] == []
    w.finish_writes("b")
    w.deliver_all("b")
    assert w.result("a", job).success


def test_an_abort_of_a_pinned_round_no_fetch_named_disarms_its_store_timer() -> None:
    # A peer may abort a round whose lookup pinned blocks before any fetch named it: the
    # pins are released once, the abort is acked, and no store timer is left armed.
    w = ready_world()
    w.lookup("a", "r1", [8, 9])
    w.stabilize()
    (pin,) = pinned_jobs(w, "b")
    assert w.counts("b")["timers"] == 1  # the pins' store timer
    out = w.inject_msg("b", AbortFetch("r1", 0))
    assert only(w.wire("b")) == AbortAck("r1", 0)
    assert [r.job_id for r in out if isinstance(r, StoreResult)] == [pin]
    assert w.counts("b")["timers"] == 0
