"""One-sided transport loss: one side's session dies (its heartbeat expired) while the
other's stays ready. The dead session answers the live peer's requests and responses
with a disconnect, at most one a second, so the peer ends its side with one result per
job instead of re-sending its abort for ever (tla/P2P.tla: NetworkHalfCut,
SessionRecvStale; tla/mustfail/one_sided_loss.cfg shows the wedge without the answer)."""

from __future__ import annotations

from helpers.world import Driver, World, only, peer_connect, ready_driver, ready_world, sent

from p2pfsm.protocol import (
    AbortFetch,
    ConnectAck,
    Disconnect,
    Fetch,
    Lookup,
    TransferDone,
    encode,
)
from p2pfsm.session import (
    FrameReceived,
    HostClose,
    HostStart,
    LoadResult,
    RegistrationFinished,
    SessionDead,
    TransportLost,
)
from p2pfsm.session.machine import STALE_ANSWER_INTERVAL_S


def _producer_lost_one_sided() -> tuple[World, int]:
    """a fetches from b; b's transport reports the loss, a's does not."""
    w = ready_world()
    job = w.load("a", "r1", [8])
    w.deliver_all("a")  # b holds the fetch, not supplied yet
    w.feed("b", TransportLost("heartbeat expired"))
    assert w.sessions["b"].state == "dead" and w.sessions["a"].ready
    return w, job


def test_the_consumers_abort_is_answered_and_its_load_ends_once() -> None:
    w, job = _producer_lost_one_sided()
    assert not w.wire("b")  # the death itself sends nothing: the connection is gone
    w.fire_next("a", "load")
    assert w.types("a") == ["abort_fetch"]
    w.deliver_all("a")
    assert w.types("b") == ["disconnect"]  # the dead session's answer
    w.deliver_all("b")
    dead = only(w.out("a", SessionDead))
    assert dead.reason == "peer disconnected"
    # The fetch reached b: its destination stays quarantined, and the job has one result.
    assert only([r for r in w.out("a", LoadResult) if r.job_id == job]).released is False
    assert w.counts("a") == w.counts("b") == {k: 0 for k in w.counts("a")}


def test_answers_are_rate_limited_to_one_a_second() -> None:
    w, _job = _producer_lost_one_sided()
    for _ in range(3):
        w.inject_msg("b", AbortFetch("r1", 0))
    assert w.types("b") == ["disconnect"]  # three stale frames, one answer
    w.now += STALE_ANSWER_INTERVAL_S
    w.inject_msg("b", AbortFetch("r1", 0))
    assert w.types("b") == ["disconnect", "disconnect"]


def test_a_dead_producer_answers_the_consumers_next_fetch() -> None:
    w, _job = _producer_lost_one_sided()
    w.now += STALE_ANSWER_INTERVAL_S
    job = w.load("a", "r2", [9])
    w.deliver_all("a")
    w.deliver_all("b")
    assert w.sessions["a"].state == "ended"
    assert only([r for r in w.out("a", LoadResult) if r.job_id == job]).success is False


def test_a_dead_consumer_answers_the_producers_transfer_done() -> None:
    w = ready_world()
    w.load("a", "r1", [8])
    w.deliver_all("a")
    w.feed("a", TransportLost("heartbeat expired"))  # the consumer's side only
    w.supply("b", "r1", [8])
    w.finish_writes("b")
    assert "transfer_done" in w.types("b")
    w.deliver_all("b")
    assert w.types("a") == ["disconnect"]
    w.deliver_all("a")
    assert only(w.out("b", SessionDead)).reason == "peer disconnected"
    assert w.counts("b") == {k: 0 for k in w.counts("b")}


def test_handshake_frames_and_malformed_frames_get_no_answer() -> None:
    d = ready_driver()
    d(TransportLost("heartbeat expired"))
    assert not sent(d.recv(ConnectAck("peer:1"))) and d.s.state == "dead"
    assert not sent(d.recv_raw(b"\xc1garbage")) and d.s.state == "dead"
    assert [type(m) for m in sent(d.recv(Lookup("r1", (b"k",), 0)))] == [Disconnect]


def test_a_peer_that_ended_its_side_too_is_told_nothing_more() -> None:
    """dead --recv_disconnect--> ended (beyond the gate: a one-sided loss, then the
    peer's own close): no answer to its frames, no disconnect when closed."""
    d = ready_driver()
    d(TransportLost("heartbeat expired"))
    assert d.recv(Disconnect()) == [] and d.s.state == "ended"
    d.now += 10 * STALE_ANSWER_INTERVAL_S
    assert not sent(d.recv(Lookup("r1", (b"k",), 0)))
    assert not sent(d(HostClose())) and d.s.state == "closed"


def test_closing_a_dead_session_tells_the_peer_and_an_ended_one_does_not() -> None:
    lost = ready_driver()
    lost(TransportLost("heartbeat expired"))
    assert [type(m) for m in sent(lost(HostClose()))] == [Disconnect]
    told = ready_driver()
    told.recv(Disconnect())
    assert told.s.state == "ended" and not sent(told(HostClose()))


def test_a_closed_session_answers_nothing() -> None:
    d = ready_driver()
    d(HostClose())
    d.now += 10 * STALE_ANSWER_INTERVAL_S
    for msg in (Fetch("r1", (b"k",), (0,), 0), TransferDone("r1", True, 0)):
        assert not sent(d.recv(msg))
    assert d.s.state == "closed"


def test_a_loss_before_ready_leaves_the_session_dead_not_ended() -> None:
    """transport_lost in the handshake (connecting, registering, awaiting_ack) goes to
    dead like a loss once ready: the peer may still hold the session live, so its
    requests are answered and closing tells it."""
    handshake = [HostStart(), FrameReceived(encode(peer_connect())),
                 RegistrationFinished(True)]
    for steps in (1, 2, 3):  # connecting, registering, awaiting_ack
        d = Driver()
        for event in handshake[:steps]:
            d(event)
        d(TransportLost("heartbeat expired"))
        assert d.s.state == "dead", steps
        assert [type(m) for m in sent(d.recv(Lookup("r1", (b"k",), 0)))] == [Disconnect]
        assert [type(m) for m in sent(d(HostClose()))] == [Disconnect], steps
