"""A job's result says ``never_sent`` exactly when its session ended before it was ready
(the models' ``session_lost_unsent``): only such a job may go to the peer's next session."""

from __future__ import annotations

from helpers.world import Driver, keys, of_type, only, ready_driver

from p2pfsm.session import (
    FailReason,
    HostFetch,
    HostLookup,
    HostStart,
    LoadResult,
    LookupResult,
    TransportLost,
)


def test_the_jobs_of_a_session_that_ends_before_ready_were_never_sent() -> None:
    d = Driver()
    d(HostStart())
    d(HostFetch(1, "r1", keys([1]), (1,)))
    d(HostLookup("r2", keys([2])))
    out = d(TransportLost("cut"))
    load, lookup = only(of_type(out, LoadResult)), only(of_type(out, LookupResult))
    assert load.never_sent and load.released and load.reason is FailReason.SESSION_ENDED
    assert lookup.never_sent and lookup.reason is FailReason.SESSION_ENDED


def test_the_jobs_of_a_ready_session_that_ends_may_have_reached_the_peer() -> None:
    d = ready_driver()
    d(HostFetch(1, "r1", keys([1]), (1,)))
    d(HostLookup("r2", keys([2])))
    out = d(TransportLost("cut"))
    load, lookup = only(of_type(out, LoadResult)), only(of_type(out, LookupResult))
    assert not load.never_sent and not load.released  # orphaned: the peer may still write
    assert not lookup.never_sent and lookup.reason is FailReason.SESSION_ENDED


def test_a_lookup_reported_at_its_deadline_before_ready_gets_nothing_more() -> None:
    d = Driver()
    d(HostStart())
    d(HostLookup("r2", keys([2])))
    expired = only(of_type(d.fire(only(d.armed("lookup"))), LookupResult))
    assert expired.reason is FailReason.TIMEOUT and not expired.never_sent
    assert of_type(d(TransportLost("cut")), LookupResult) == []  # expired -> cancelled
    assert d.s.view.lookups == {}
