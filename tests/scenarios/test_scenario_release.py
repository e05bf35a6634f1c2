"""Held destinations and their release notice, under each behaviour profile.

A load whose result says ``released=False`` is followed by exactly one
DestinationReleased once the peer's writes are over: its late abort_ack or
transfer_done (a profile that reports at abort send), its new incarnation, the data
plane's proof (PeerGone), or the host's bounded hold. The profile (models/profiles/)
decides when an aborted load is reported and what a missing abort_ack does."""

from __future__ import annotations

import pytest
from helpers.world import (
    Driver,
    key,
    local_config,
    of_type,
    only,
    peer_connect,
    ready_driver,
    sent,
)

from p2pfsm.errors import ConfigError, LocalProtocolError
from p2pfsm.protocol import AbortAck, AbortFetch, Disconnect, Lookup, LookupResp, TransferDone
from p2pfsm.session import (
    LOOKUP_TIMED_OUT,
    DestinationReleased,
    FailReason,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    LoadResult,
    LookupResult,
    PeerGone,
    ReleaseCause,
    SessionDead,
    Timeouts,
    TransportLost,
)


def _v34(**overrides: object) -> Driver:
    return ready_driver(local_config(profile="vllm-0.34", **overrides))


def _released(d: Driver) -> list[DestinationReleased]:
    return of_type(d.log, DestinationReleased)


def test_native_holds_an_orphaned_destination_until_the_data_plane_proves_it_free() -> None:
    d = ready_driver()
    d(HostFetch(1, "r1", (key(1),), (4,)))
    out = d(TransportLost("cut"))
    assert only(of_type(out, LoadResult)) == LoadResult(1, "r1", False, False)
    assert not d.armed("hold") and d.s.held_destinations == 1  # native: no clock release
    out = d(PeerGone("data_plane"))
    assert only(of_type(out, DestinationReleased)) == DestinationReleased(
        1, "r1", 0, ReleaseCause.DATA_PLANE)
    assert d.s.held_destinations == 0
    assert d(PeerGone("peer_restarted")) == []  # exactly one notice per job


def test_a_live_session_ignores_peer_gone_and_a_bad_cause_is_refused() -> None:
    d = ready_driver()
    d(HostFetch(1, "r1", (key(1),), (4,)))
    assert d(PeerGone("data_plane")) == []
    assert d.s.view.loads["r1"][0].fsm_state == "loading"
    with pytest.raises(LocalProtocolError, match="peer_gone: cause"):
        d(PeerGone("because"))


def test_a_new_incarnation_releases_the_destinations_its_old_process_could_write() -> None:
    d = Driver(local_config(incarnation=1))
    d.handshake(peer_connect(incarnation=100))
    d(HostFetch(1, "r1", (key(1),), (4,)))
    out = d.recv(peer_connect(incarnation=101))
    assert only(of_type(out, LoadResult)) == LoadResult(1, "r1", False, False)
    assert only(of_type(out, DestinationReleased)).cause is ReleaseCause.PEER_RESTARTED
    assert out.index(only(of_type(out, LoadResult))) < out.index(_released(d)[0])


def test_a_bounded_hold_releases_on_the_clock_with_its_cause() -> None:
    d = ready_driver(local_config(timeouts=Timeouts(hold=7.0)))
    d(HostFetch(1, "r1", (key(1),), (4,)))
    d(TransportLost("cut"))
    (hold,) = d.armed("hold")
    assert d.timers[hold] == d.now + 7.0
    out = d.fire(hold)
    assert only(of_type(out, DestinationReleased)).cause is ReleaseCause.HOLD_EXPIRED
    assert d(PeerGone("data_plane")) == [] and not d.armed("hold")


def test_vllm_034_reports_a_timed_out_load_at_abort_send_and_releases_at_its_ack() -> None:
    d = _v34()
    d(HostFetch(1, "r1", (key(1),), (4,)))
    out = d.fire(only(d.armed("load")))
    assert only(sent(out)) == AbortFetch("r1", 0)
    res = only(of_type(out, LoadResult))
    assert (res.success, res.released, res.reason) == (False, False, FailReason.TIMEOUT)
    assert d.s.held_destinations == 1 and d.s.has_pending_work
    out = d.recv(AbortAck("r1", 0))
    assert only(of_type(out, DestinationReleased)) == DestinationReleased(
        1, "r1", 0, ReleaseCause.ABORT_ACK)
    assert not of_type(out, LoadResult) and not d.s.has_pending_work
    # The acked round is not reused: its duplicate ack may still be on the wire.
    d(HostFetch(2, "r1", (key(2),), (5,)))
    assert d.s.view.load("r1", 1) is not None


def test_vllm_034_a_finish_fails_at_once_and_a_racing_transfer_done_releases() -> None:
    d = _v34()
    d(HostFetch(1, "r1", (key(1),), (4,)))
    res = only(of_type(d(HostFinish("r1")), LoadResult))
    assert (res.released, res.reason) == (False, FailReason.FINISHED)
    out = d.recv(TransferDone("r1", True, 0))
    assert only(of_type(out, DestinationReleased)).cause is ReleaseCause.TRANSFER_DONE
    assert len(of_type(d.log, LoadResult)) == 1


def test_vllm_034_load_deadline_is_shorter_for_a_request_that_ran_lookups() -> None:
    d = _v34()
    d(HostLookup("p", (key(1),)))
    d.recv(LookupResp("p", (key(1),), (True,)))
    d(HostFetch(1, "p", (key(1),), (4,)))
    d(HostFetch(2, "pd", (key(2),), (5,)))
    deadlines = {t.key[0]: when - d.now for t, when in d.timers.items() if t.kind == "load"}
    assert deadlines == {"p": 10.0, "pd": 30.0}
    assert d.s.config.timeouts.abort_ack == 5.0 and d.s.config.timeouts.lookup == 8.0


def test_vllm_034_a_missing_abort_ack_ends_the_session_and_the_hold_releases() -> None:
    d = _v34()
    d(HostFetch(1, "r1", (key(1),), (4,)))
    d(HostFetch(2, "r2", (key(2),), (5,)))
    d.fire(only([t for t in d.armed("load") if t.key[0] == "r1"]))
    out = d.fire(only(d.armed("abort_ack")))
    assert only(of_type(out, SessionDead)).reason == "abort ack timed out"
    assert Disconnect() in sent(out) and d.s.state == "ended"
    # r1 was reported at its abort; r2 now, both held (30 s, the profile's hold).
    assert [r.released for r in of_type(d.log, LoadResult)] == [False, False]
    assert d.s.held_destinations == 2 and len(d.armed("hold")) == 2
    for timer in d.armed("hold"):
        d.fire(timer)
    assert sorted(r.job_id for r in _released(d)) == [1, 2]
    assert {r.cause for r in _released(d)} == {ReleaseCause.HOLD_EXPIRED}


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.34"])
def test_vllm_an_overdue_lookup_answer_ends_the_session_keeping_the_answered_hits(
        profile: str) -> None:
    d = ready_driver(local_config(profile=profile))
    d(HostLookup("r1", (key(1), key(2))))
    d(HostLookup("r2", (key(3),)))
    d.recv(LookupResp("r1", (key(1),), (True,)))  # a part: key 2 still unanswered
    d(HostFetch(5, "r3", (key(4),), (7,)))
    first = min(d.armed("lookup"), key=lambda t: d.timers[t])
    out = d.fire(first)
    assert only(of_type(out, SessionDead)).reason == LOOKUP_TIMED_OUT
    assert Disconnect() in sent(out) and d.s.state == "ended" and not d.armed("lookup")
    # every open lookup gets its one result at the session's end, the load its own
    results = {r.kv_request_id: r for r in of_type(out, LookupResult)}
    assert (results["r1"].hits, results["r2"].hits) == ((True, False), (False,))
    assert {r.reason for r in results.values()} == {FailReason.SESSION_ENDED}
    assert only(of_type(out, LoadResult)).job_id == 5


def test_vllm_an_overdue_lookup_before_ready_ends_the_session_unsent() -> None:
    d = Driver(local_config(profile="vllm-0.33"))
    d(HostStart())
    d(HostLookup("r1", (key(1),)))
    out = d.fire(only(d.armed("lookup")))
    assert only(of_type(out, SessionDead)).reason == LOOKUP_TIMED_OUT
    assert d.s.state == "ended" and not [m for m in sent(out) if isinstance(m, Lookup)]
    assert only(of_type(out, LookupResult)).answered is False


@pytest.mark.parametrize("profile", ["vllm-0.33", "vllm-0.34"])
def test_vllm_a_fetch_reports_the_requests_waiting_lookup_and_the_session_stays(
        profile: str) -> None:
    d = ready_driver(local_config(profile=profile))
    d(HostLookup("r1", (key(1), key(2))))
    d.recv(LookupResp("r1", (key(1),), (True,)))  # key 2 never answered (vLLM's producer
    out = d(HostFetch(5, "r1", (key(1),), (7,)))  # drops a lookup it holds at the fetch)
    res = only(of_type(out, LookupResult))
    assert (res.hits, res.answered, res.reason) == ((True, False), False, FailReason.FINISHED)
    out = d.fire(only(d.armed("lookup")))  # one more period for a late answer: none came
    assert not of_type(out, SessionDead) and not of_type(out, LookupResult)
    assert d.s.alive and not d.armed("lookup")


def test_native_answers_an_overdue_lookup_miss_and_keeps_the_session() -> None:
    d = ready_driver()
    d(HostLookup("r1", (key(1),)))
    out = d.fire(only(d.armed("lookup")))
    assert only(of_type(out, LookupResult)).reason is FailReason.TIMEOUT
    assert d.s.alive and not of_type(out, SessionDead)


def test_native_resends_an_unanswered_abort_and_reports_once_acked() -> None:
    d = ready_driver()
    d(HostFetch(1, "r1", (key(1),), (4,)))
    d.fire(only(d.armed("load")))
    out = d.fire(only(d.armed("abort_ack")))
    assert only(sent(out)) == AbortFetch("r1", 0) and d.s.alive
    out = d.recv(AbortAck("r1", 0))
    res = only(of_type(out, LoadResult))
    assert (res.released, res.reason) == (True, FailReason.TIMEOUT) and not _released(d)


def test_an_unknown_profile_is_refused_naming_the_known() -> None:
    with pytest.raises(ConfigError, match=r"unknown profile 'vllm-9'.*native"):
        local_config(profile="vllm-9")


def test_explicit_timeouts_win_over_the_profiles() -> None:
    cfg = local_config(profile="vllm-0.34", timeouts=Timeouts(load=3.0))
    assert cfg.timeouts.load == 3.0 and cfg.timeouts.hold is None
    assert local_config(profile="vllm-0.34").timeouts.hold == 30.0


def test_an_unknown_profile_is_refused_with_explicit_timeouts_too() -> None:
    with pytest.raises(ConfigError, match="unknown profile 'nope'"):
        local_config(profile="nope", timeouts=Timeouts())
