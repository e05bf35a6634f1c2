"""A fetch still queued behind the handshake when its deadline passes or its request is
finished, under each behaviour profile's ``unsent_fetch``.

``retire_locally`` (vllm-0.34): the round waits in ``queued`` and is retired there: the
job fails with its destination free, the fetch never leaves the queue, no abort is
sent, and the request's terminal fetch is queued instead, which the flush drops while a
load or lookup of the request is open. ``send_then_abort`` (native, vllm-0.33): the
flush sends the fetch and then its abort."""

from __future__ import annotations

import pytest
from helpers.world import (
    PEER_ID,
    Driver,
    key,
    local_config,
    of_type,
    only,
    peer_connect,
    sent,
)

from p2pfsm.protocol import AbortFetch, ConnectAck, Fetch
from p2pfsm.session import (
    FailReason,
    HostFetch,
    HostFinish,
    HostStart,
    LoadResult,
    RegistrationFinished,
    TransportLost,
)


def _before_ack(profile: str) -> Driver:
    """A session that registered its peer and waits for the peer's connect_ack."""
    d = Driver(local_config(profile=profile))
    d(HostStart())
    d.recv(peer_connect())
    d(RegistrationFinished(True))
    assert not d.s.ready
    return d


def _fetches(out: list[object]) -> list[Fetch]:
    return [m for m in sent(out) if isinstance(m, Fetch)]


def test_a_timed_out_queued_fetch_is_retired_without_a_frame() -> None:
    d = _before_ack("vllm-0.34")
    d(HostFetch(1, "r1", (key(1),), (4,)))
    assert d.s.view.loads["r1"][0].fsm_state == "queued"
    out = d.fire(only(d.armed("load")))
    res = only(of_type(out, LoadResult))
    assert (res.success, res.released, res.reason) == (False, True, FailReason.TIMEOUT)
    assert "queued fetch r1 round=0 timed out before transport handoff" in res.detail
    assert not sent(out) and not d.s.has_pending_work
    out = d.recv(ConnectAck(PEER_ID))  # the flush: only the request's terminal fetch
    assert sent(out) == [Fetch("r1", (), (), 0)]
    out = d(HostFetch(2, "r1", (key(2),), (5,)))  # a new load goes out as usual
    assert only(_fetches(out)).keys == (key(2),)


def test_a_finished_queued_fetch_is_retired_and_a_newer_load_keeps_the_request_open() -> None:
    d = _before_ack("vllm-0.34")
    d(HostFetch(1, "r1", (key(1),), (4,)))
    res = only(of_type(d(HostFinish("r1")), LoadResult))
    assert (res.success, res.released, res.reason) == (False, True, FailReason.FINISHED)
    assert not d.armed("load")
    d(HostFetch(2, "r1", (key(2),), (5,)))  # queued too: the terminal fetch must not close it
    out = d.recv(ConnectAck(PEER_ID))
    assert [(f.keys, f.block_indexes) for f in _fetches(out)] == [((key(2),), (5,))]
    assert not of_type(sent(out), AbortFetch)
    assert d.s.view.loads["r1"][0].fsm_state == "loading"


def test_a_deadline_due_when_the_handshake_completes_retires_the_fetch_first() -> None:
    d = _before_ack("vllm-0.34")
    d(HostFetch(1, "r1", (key(1),), (4,)))
    d.now = d.timers[only(d.armed("load"))]  # the ack arrives as the deadline passes
    out = d.recv(ConnectAck(PEER_ID))
    assert d.s.ready
    res = only(of_type(out, LoadResult))
    assert (res.success, res.released, res.reason) == (False, True, FailReason.TIMEOUT)
    assert sent(out) == [Fetch("r1", (), (), 0)]


def test_a_queued_fetch_fails_with_its_destination_free_when_the_session_never_was_ready(
) -> None:
    d = _before_ack("vllm-0.34")
    d(HostFetch(1, "r1", (key(1),), (4,)))
    out = d(TransportLost("cut"))
    res = only(of_type(out, LoadResult))
    assert (res.released, res.reason) == (True, FailReason.SESSION_ENDED)
    assert not _fetches(out)


@pytest.mark.parametrize("profile", ["native", "vllm-0.33"])
def test_send_then_abort_profiles_send_the_fetch_and_its_abort(profile: str) -> None:
    d = _before_ack(profile)
    d(HostFetch(1, "r1", (key(1),), (4,)))
    assert d.s.view.loads["r1"][0].fsm_state == "loading"
    out = d.fire(only(d.armed("load")))
    assert not of_type(out, LoadResult) and not sent(out)
    out = d.recv(ConnectAck(PEER_ID))
    assert sent(out) == [Fetch("r1", (key(1),), (4,), 0), AbortFetch("r1", 0)]
