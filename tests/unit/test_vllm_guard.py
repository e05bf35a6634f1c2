"""The guard on vLLM's ZeroMQ transport (``p2pfsm.vllm.guard``), without vLLM: its read of
the ROUTER driven on fakes of vLLM's transport and connection, frame by frame."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from p2pfsm.vllm import guard

META = b"nixlSerDes|Agent" + bytes(40)


class FakeFrame:
    def __init__(self, data: bytes, source: str | None) -> None:
        self.bytes = data
        self.source = source

    def get(self, name: str) -> str | None:
        assert name == "Peer-Address"
        return self.source


class FakeRouter:
    """Hands out queued multipart messages, then ``zmq.Again``."""

    def __init__(self) -> None:
        self.queue: list[list[FakeFrame]] = []

    def recv_multipart(self, flags: int, copy: bool) -> list[FakeFrame]:
        assert flags == zmq.NOBLOCK and copy is False
        if not self.queue:
            raise zmq.Again()
        return self.queue.pop(0)


class FakeConn:
    def __init__(self) -> None:
        self.alive = True
        self.inbox: list[Any] = []

    def enqueue(self, msg: Any) -> None:
        self.inbox.append(msg)

    def mark_dead(self) -> None:
        self.alive = False


class FakeTransport:
    """What the guard reads and writes on vLLM's ``ZmqTransport``."""

    def __init__(self) -> None:
        self._router = FakeRouter()
        self._connections: dict[str, FakeConn] = {}
        self._pending_inbound: list[tuple[str, Any]] = []

    def frame(self, ident: bytes, msg: Any, source: str | None = "127.0.0.1",
              raw: bytes | None = None) -> None:
        data = raw if raw is not None else msgpack.packb(msg, use_bin_type=True)
        self._router.queue.append([FakeFrame(ident, None), FakeFrame(data, source)])

    def poll(self) -> list[str]:
        """The guard's read, then what vLLM's poll does next: a connection per new id."""
        guard._recv_router(self)
        new = []
        for sender, msg in self._pending_inbound:
            if sender not in self._connections:
                self._connections[sender] = FakeConn()
                new.append(sender)
            self._connections[sender].enqueue(msg)
        self._pending_inbound.clear()
        for peer in [p for p, c in self._connections.items() if not c.alive]:
            del self._connections[peer]  # vLLM's sweep
        return new


def connect(peer_id: str, num_blocks: int = 16) -> dict[str, Any]:
    return {"type": "connect", "peer_id": peer_id, "agent_metadata": META,
            "base_addr": 1 << 20, "num_blocks": num_blocks, "block_len": 4096,
            "config_fingerprint": "", "hash_seed": "vllm-none-hash"}


@pytest.fixture(autouse=True)
def _decoder(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(guard, "_decode", lambda data: msgpack.unpackb(data, raw=False))
    monkeypatch.setattr(guard, "_config", guard.GuardConfig(max_pending=3))
    yield


def test_a_valid_connect_opens_a_connection() -> None:
    t = FakeTransport()
    t.frame(b"127.0.0.1:4000", connect("127.0.0.1:4000"))
    t.frame(b"127.0.0.1:4000", {"type": "connect_ack", "peer_id": "127.0.0.1:4000"})
    assert t.poll() == ["127.0.0.1:4000"]
    assert [m["type"] for m in t._connections["127.0.0.1:4000"].inbox] == ["connect",
                                                                          "connect_ack"]
    assert guard.drops(t) == {}


@pytest.mark.parametrize(("ident", "msg", "source", "reason"), [
    (b"no-colon", connect("no-colon"), "127.0.0.1", "bad identity"),
    (b"\xff\xfe:4000", connect("127.0.0.1:4000"), "127.0.0.1", "bad identity"),
    (b"127.0.0.1:http", connect("127.0.0.1:http"), "127.0.0.1", "bad identity"),
    (b"127.0.0.1:4000", {"type": "fetch", "kv_request_id": "r", "round_seq": 0,
                         "keys": [b"k"], "block_indexes": [0]}, "127.0.0.1", "not a connect"),
    (b"127.0.0.1:4000", connect("127.0.0.1:4001"), "127.0.0.1", "not a connect"),
    (b"127.0.0.1:4000", connect("127.0.0.1:4000", num_blocks=(1 << 20) + 1), "127.0.0.1",
     "not a connect"),
    (b"127.0.0.2:4000", connect("127.0.0.2:4000"), "127.0.0.1", "address mismatch"),
    (b"localhost:4000", connect("localhost:4000"), "10.0.0.1", "address mismatch"),
])
def test_refused_at_the_door(ident: bytes, msg: Any, source: str, reason: str) -> None:
    t = FakeTransport()
    t.frame(ident, msg, source)
    assert t.poll() == [] and t._connections == {}
    assert guard.drops(t) == {reason: 1}


def test_oversized_and_undecodable_frames_are_dropped() -> None:
    t = FakeTransport()
    t.frame(b"127.0.0.1:4000", None, raw=bytes(guard.config().max_frame_bytes + 1))
    t.frame(b"127.0.0.1:4000", None, raw=b"\xc1")
    assert t.poll() == []
    assert guard.drops(t) == {"frame too large": 1, "not a connect": 1}


def test_known_peers_frames_pass_and_localhost_from_loopback_is_admitted() -> None:
    t = FakeTransport()
    t.frame(b"localhost:4000", connect("localhost:4000"), "127.0.0.5")
    assert t.poll() == ["localhost:4000"]
    t.frame(b"localhost:4000", {"type": "anything"}, "127.0.0.5")
    t.poll()
    assert t._connections["localhost:4000"].inbox[-1] == {"type": "anything"}


def test_pending_budget_evicts_the_oldest_of_the_busiest_host() -> None:
    t = FakeTransport()
    for port in (5000, 5001):
        t.frame(f"127.0.0.2:{port}".encode(), connect(f"127.0.0.2:{port}"), "127.0.0.2")
    t.frame(b"127.0.0.3:6000", connect("127.0.0.3:6000"), "127.0.0.3")
    t.poll()
    assert guard.pending(t) == ["127.0.0.2:5000", "127.0.0.2:5001", "127.0.0.3:6000"]
    # 127.0.0.3 holds fewer: its newcomer evicts the busiest host's oldest.
    t.frame(b"127.0.0.3:6001", connect("127.0.0.3:6001"), "127.0.0.3")
    t.poll()
    assert guard.pending(t) == ["127.0.0.2:5001", "127.0.0.3:6000", "127.0.0.3:6001"]
    assert "127.0.0.2:5000" not in t._connections  # marked dead, swept
    # A peer that sent connect_ack leaves the budget; one whose connection died too.
    t.frame(b"127.0.0.3:6000", {"type": "connect_ack", "peer_id": "127.0.0.3:6000"},
            "127.0.0.3")
    t._connections["127.0.0.2:5001"].alive = False
    t.frame(b"127.0.0.4:7000", connect("127.0.0.4:7000"), "127.0.0.4")
    t.poll()
    assert guard.pending(t) == ["127.0.0.3:6001", "127.0.0.4:7000"]


def test_a_flood_in_one_read_keeps_the_budget() -> None:
    t = FakeTransport()
    for port in range(5000, 5100):
        t.frame(f"127.0.0.1:{port}".encode(), connect(f"127.0.0.1:{port}"))
    new = t.poll()
    assert new == ["127.0.0.1:5097", "127.0.0.1:5098", "127.0.0.1:5099"]
    assert guard.drops(t) == {"evicted: too many unfinished handshakes": 97}
