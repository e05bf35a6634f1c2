"""Restart detection: a connect carrying a new incarnation ends the live session as
"peer restarted" (every job one result, no disconnect sent). The same incarnation on a
ready session is the peer connecting again after it lost its side ("peer reconnected",
the same ending); before ready, or without an incarnation (a vLLM peer), a second
connect is the duplicate-connect error."""

from __future__ import annotations

import msgpack
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

from p2pfsm.errors import ConfigError, LocalProtocolError
from p2pfsm.protocol import Connect, ConnectAck, Disconnect, decode, encode
from p2pfsm.session import (
    HostFetch,
    HostStart,
    LoadResult,
    RegistrationFinished,
    Session,
    SessionDead,
)


def test_our_connect_carries_our_incarnation_and_none_leaves_it_off_the_wire() -> None:
    d = Driver(local_config(incarnation=7))
    connect = only([m for m in sent(d(HostStart())) if isinstance(m, Connect)])
    assert connect.incarnation == 7
    plain = Driver()
    frame = encode(only(sent(plain(HostStart()))))
    assert "incarnation" not in msgpack.unpackb(frame)
    decoded = decode(frame)
    assert isinstance(decoded, Connect) and decoded.incarnation is None


def test_a_new_incarnation_after_ready_ends_the_session_as_restarted() -> None:
    d = Driver(local_config(incarnation=1))
    d.handshake(peer_connect(incarnation=100))
    sent_before = d(HostFetch(1, "r1", (key(1),), (4,)))
    assert sent(sent_before)
    restart = peer_connect(incarnation=101)
    out = d.recv(restart)
    dead = only(of_type(out, SessionDead))
    assert dead.reason == "peer restarted" and dead.restarted_by == restart
    assert d.s.state == "dead"
    # The fetch went out: its destination stays quarantined (a write may still land).
    assert only(of_type(out, LoadResult)) == LoadResult(1, "r1", False, False)
    assert not [m for m in sent(out) if isinstance(m, Disconnect)]  # would end the new one


@pytest.mark.parametrize("state", ["registering", "registering_acked", "awaiting_ack"])
def test_a_new_incarnation_before_ready_fails_queued_work_with_its_destination_free(
        state: str) -> None:
    """Beyond the gate (p2pfsm/tools/verify/unreachable.py): <state> --recv_connect--> dead."""
    d = Driver(local_config(incarnation=1))
    d(HostStart())
    d.recv(peer_connect(incarnation=100))
    if state == "registering_acked":
        d.recv(ConnectAck(PEER_ID))
    elif state == "awaiting_ack":
        d(RegistrationFinished(True))
    assert d.s.state == state
    d(HostFetch(1, "r1", (key(1),), (4,)))  # queued: nothing reached the peer
    out = d.recv(peer_connect(incarnation=5))
    assert only(of_type(out, SessionDead)).reason == "peer restarted"
    assert only(of_type(out, LoadResult)) == LoadResult(1, "r1", False, True)
    assert not sent(out)
    assert d.s.state == "dead"  # the new incarnation is served by a fresh session


@pytest.mark.parametrize(("first", "second"), [(None, None), (None, 5), (5, None)],
                         ids=["vllm", "old-then-new", "field-dropped"])
def test_without_two_different_incarnations_a_second_connect_is_a_protocol_error(
        first: int | None, second: int | None) -> None:
    d = Driver(local_config(incarnation=1))
    d.handshake(peer_connect(incarnation=first))
    out = d.recv(peer_connect(incarnation=second))
    dead = only(of_type(out, SessionDead))
    assert "connect after the handshake" in dead.reason and dead.restarted_by is None
    assert [type(m) for m in sent(out)] == [Disconnect]


def test_the_same_incarnation_on_a_ready_session_is_the_peer_reconnecting() -> None:
    d = Driver(local_config(incarnation=1))
    d.handshake(peer_connect(incarnation=100))
    d(HostFetch(1, "r1", (key(1),), (4,)))
    again = peer_connect(incarnation=100)
    out = d.recv(again)
    dead = only(of_type(out, SessionDead))
    assert dead.reason == "peer reconnected" and dead.restarted_by == again
    assert only(of_type(out, LoadResult)) == LoadResult(1, "r1", False, False)
    assert not sent(out)  # a disconnect would end the peer's new session


def test_the_same_incarnation_before_ready_is_a_protocol_error() -> None:
    d = Driver(local_config(incarnation=1))
    d(HostStart())
    d.recv(peer_connect(incarnation=5))
    out = d.recv(peer_connect(incarnation=5))
    dead = only(of_type(out, SessionDead))
    assert "connect after the handshake" in dead.reason and dead.restarted_by is None
    assert [type(m) for m in sent(out)] == [Disconnect]


def test_an_incarnation_must_fit_64_bits() -> None:
    assert local_config(incarnation=2**64 - 1).incarnation == 2**64 - 1
    with pytest.raises(ConfigError) as err:
        local_config(incarnation=2**64)
    assert str(err.value) == ("incarnation: expected None or an int in [0, 2**64), got "
                              "18446744073709551616")


def test_a_new_session_knows_no_peer_and_refuses_unknown_inputs() -> None:
    session = Session(local_config())
    assert session.peer is None
    with pytest.raises(LocalProtocolError) as err:
        session.handle(object(), 0.0)  # type: ignore[arg-type]
    assert str(err.value) == "unknown input object"
