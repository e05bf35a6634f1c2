"""Every failed result says why: ``reason`` (a FailReason) and a ``detail`` in words.

The test plays the peer of one bare session; each case drives one way a load, a
lookup or a store can fail and checks the reason it reports.
"""

from __future__ import annotations

import pytest
from helpers.world import World, key, local_config, of_type, only, ready_driver, sent

from p2pfsm.errors import LocalProtocolError
from p2pfsm.protocol import AbortAck, Fetch, Limits, Lookup, TransferDone
from p2pfsm.session import (
    FailReason,
    HostClose,
    HostFetch,
    HostFinish,
    HostLookup,
    HostSupply,
    LoadResult,
    LookupResult,
    ProtocolViolation,
    StartWrite,
    StoreResult,
    TransportLost,
)


def fetch(d: object, job: int = 1, rid: str = "r1") -> None:
    d(HostFetch(job, rid, (key(1), key(2)), (0, 1)))  # type: ignore[operator]


def test_the_peer_failing_the_round() -> None:
    d = ready_driver()
    fetch(d)
    res = only(of_type(d.recv(TransferDone("r1", False, 0)), LoadResult))
    assert (res.success, res.reason) == (False, FailReason.PEER_FAILED)
    assert "transfer_done(false)" in res.detail and "2 key(s)" in res.detail


def test_a_load_deadline_aborts_and_says_timeout() -> None:
    d = ready_driver()
    fetch(d)
    d.fire(d.armed("load")[0])
    res = only(of_type(d.recv(AbortAck("r1", 0)), LoadResult))
    assert (res.success, res.released, res.reason) == (False, True, FailReason.TIMEOUT)
    assert "load timeout" in res.detail


def test_a_re_sent_abort_keeps_the_first_cause() -> None:
    d = ready_driver()
    fetch(d)
    d(HostFinish("r1"))                 # the host finishes: abort
    d.fire(d.armed("abort_ack")[0])     # no ack yet: the abort is re-sent
    res = only(of_type(d.recv(AbortAck("r1", 0)), LoadResult))
    assert res.reason is FailReason.FINISHED and "finished" in res.detail


def test_a_session_lost_mid_load_says_so_and_keeps_the_destination() -> None:
    d = ready_driver()
    fetch(d)
    res = only(of_type(d(TransportLost("connection reset")), LoadResult))
    assert (res.released, res.reason) == (False, FailReason.SESSION_ENDED)
    assert "not released" in res.detail


def test_a_fetch_on_a_dead_session_says_the_session_is_not_alive() -> None:
    d = ready_driver()
    d(HostClose())
    res = only(of_type(d(HostFetch(2, "r1", (key(1),), (0,))), LoadResult))
    assert res.reason is FailReason.SESSION_ENDED and "not alive" in res.detail


def test_success_has_no_reason() -> None:
    d = ready_driver()
    fetch(d)
    res = only(of_type(d.recv(TransferDone("r1", True, 0)), LoadResult))
    assert res.success and res.reason is None and res.detail == ""


def test_lookup_reasons_timeout_finish_and_session_end() -> None:
    d = ready_driver()
    d(HostLookup("r1", (key(1), key(2))))
    res = only(of_type(d.fire(d.armed("lookup")[0]), LookupResult))
    assert (res.answered, res.reason) == (False, FailReason.TIMEOUT)
    assert "2 of 2 key(s)" in res.detail and "MISS" in res.detail
    d(HostLookup("r2", (key(1),)))
    res = only(of_type(d(HostFinish("r2")), LookupResult))
    assert res.reason is FailReason.FINISHED
    d(HostLookup("r3", (key(1),)))
    res = only(of_type(d(TransportLost("gone")), LookupResult))
    assert res.reason is FailReason.SESSION_ENDED


def test_a_store_no_fetch_read_says_not_served() -> None:
    d = ready_driver()
    d(HostSupply(6, "r9", (key(1),), (3,)))
    out = d.fire(d.armed("store")[0])     # no fetch ever came for it
    store = only(of_type(out, StoreResult))
    assert (store.success, store.reason) == (False, FailReason.NOT_SERVED)
    assert "without a fetch" in store.detail


def test_a_lookup_on_a_dead_session_says_so() -> None:
    d = ready_driver()
    d(TransportLost("gone"))
    res = only(of_type(d(HostLookup("r1", (key(1), key(2)))), LookupResult))
    assert (res.hits, res.answered) == ((False, False), False)
    assert (res.reason, res.detail) == (FailReason.SESSION_ENDED, "the session is not alive")


def test_pins_answered_after_the_fetch_began_serving_say_not_served() -> None:
    """The producer's host answers a lookup with hits after the fetch of that round has
    arrived (the round serves the fetch and takes no pins): the pins are released at
    once, NOT_SERVED, saying why."""
    w = World(auto_answer=False)
    w.handshake()
    w.lookup("a", "r1", [8])
    w.deliver("a")
    (request,) = w.held["b"]
    w.load("a", "r1", [8])
    w.deliver("a")
    job = w.answer("b", request.token, hit_ids=[8])
    assert job is not None
    store = w.hosts["b"].store_results[job]
    assert (store.success, store.reason) == (False, FailReason.NOT_SERVED)
    assert store.detail == "the lookup's round no longer takes pins"


def test_a_supply_on_a_dead_session_says_so() -> None:
    d = ready_driver()
    d(TransportLost("gone"))
    store = only(of_type(d(HostSupply(6, "r9", (key(1),), (3,))), StoreResult))
    assert (store.success, store.reason) == (False, FailReason.SESSION_ENDED)
    assert store.detail == "the session is not alive"


def test_a_malformed_supply_is_refused_naming_the_call() -> None:
    d = ready_driver()
    with pytest.raises(LocalProtocolError) as err:
        d(HostSupply(6, "r9", (key(1), key(2)), (3,)))
    assert str(err.value) == "supply: 2 keys but 1 indexes"


def test_a_lookup_after_its_rounds_fetch_is_a_violation_that_says_so() -> None:
    d = ready_driver()
    d.recv(Fetch("r1", (key(1),), (0,), 0))
    violation = only(of_type(d.recv(Lookup("r1", (key(1),), 0)), ProtocolViolation))
    assert violation.error.field == "round_seq"
    assert violation.error.reason == "lookup for r1/0 after its fetch"


def test_a_host_call_may_name_as_many_keys_as_the_limit_and_no_more() -> None:
    d = ready_driver(local_config(limits=Limits(max_list_items=2)))
    d(HostSupply(6, "r1", (key(1), key(2)), (1, 2)))
    with pytest.raises(LocalProtocolError) as err:
        d(HostSupply(7, "r2", (key(1), key(2), key(3)), (1, 2, 3)))
    assert str(err.value) == "supply: 3 keys, more than 2"


def test_a_malformed_fetch_is_refused_naming_the_call_and_the_index() -> None:
    d = ready_driver()
    with pytest.raises(LocalProtocolError) as err:
        d(HostFetch(7, "r1", (key(1), key(2)), (1,)))
    assert str(err.value) == "fetch: 2 keys but 1 indexes"
    with pytest.raises(LocalProtocolError) as err:
        d(HostFetch(7, "r1", (key(1), key(2), key(3)), (1, 3, 3)))
    assert "destination index 3 named twice" in str(err.value)


def test_a_fetch_naming_a_key_twice_is_a_violation_of_its_keys() -> None:
    d = ready_driver()
    violation = only(of_type(d.recv(Fetch("r1", (key(1), key(1)), (0, 1), 0)),
                             ProtocolViolation))
    assert (violation.error.field, violation.error.reason) == ("keys",
                                                               "duplicate keys in one fetch")


def test_a_fetch_naming_a_destination_twice_is_refused_before_any_write() -> None:
    """Two blocks cannot land in one: the session refuses such a fetch (a protocol
    violation, transfer_done(false) for its round) instead of leaving it to the data
    plane; nothing of the round is kept and no write starts."""
    d = ready_driver()
    d(HostSupply(5, "r1", (key(1), key(2)), (7, 8)))
    out = d.recv(Fetch("r1", (key(1), key(2)), (3, 3), 0))
    violation = only(of_type(out, ProtocolViolation))
    assert (violation.error.field, violation.error.reason) == (
        "block_indexes", "a destination named twice in one fetch")
    assert sent(out) == [TransferDone("r1", False, 0)]
    assert of_type(out, StartWrite) == [] and not d.s.view.writes
    assert not d.s.view.rounds["r1"][None].demanded  # the supply still waits for a fetch
