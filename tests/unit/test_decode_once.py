"""A frame is decoded once: where the node decodes a frame (to see whether it opens a
session) it hands the message on, and the session does not decode the frame again.

Decodes are counted at the codec's one entry point (``p2pfsm.protocol.codec._unpack_map``,
which every decode goes through) while the real code runs: a Node on real ZeroMQ
sockets on 127.0.0.1 with a data plane that registers nothing (NIXL is not needed to
open a session), and a bare Session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

import p2pfsm.executor.node.planes as planes_module
from p2pfsm.executor.nixl.layout import Layout
from p2pfsm.executor.nixl.pace import ProgressPace
from p2pfsm.executor.node import Node, NodeConfig
from p2pfsm.protocol import Connect, codec, encode
from p2pfsm.session import FrameReceived, HostStart, Session, SessionConfig

pytestmark = pytest.mark.pure_only  # patches the codec, which a compiled module binds early

BLOCK_LEN = 64
NUM_BLOCKS = 8


class _Decodes:
    """How many frames the codec has unpacked."""

    def __init__(self) -> None:
        self.count = 0


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> _Decodes:
    seen = _Decodes()
    real: Callable[..., Any] = codec._unpack_map

    def counting(*args: Any, **kwargs: Any) -> Any:
        seen.count += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(codec, "_unpack_map", counting)
    return seen


class _NoWrites:
    """The plane's table of WRITEs, empty: no WRITE is ever started here."""

    def __init__(self) -> None:
        self.inflight: dict[object, object] = {}  # read by the node's turn
        self.done: dict[object, object] = {}

    def __len__(self) -> int:
        return 0

    def holds(self, _write_id: object) -> bool:
        return False

    def unreported(self) -> list[object]:
        return []


class _NoMemory:
    """A data plane with a region nobody writes: registering a peer records it."""

    def __init__(self, _name: str, num_blocks: int, block_len: int, _device: str,
                 memory: object = None) -> None:
        self.metadata = b"no-memory-agent"
        self.base_addr = 0x10000
        self.region = None
        self.layout = Layout.plain(self.base_addr, num_blocks, block_len)
        self.registered: list[str] = []
        self.pace = ProgressPace(1, 50, 0.0, 0.0)  # the node's turn reads its windows

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(self.registered)

    @property
    def progress_interval_ms(self) -> int:
        return 50

    @property
    def writes(self) -> _NoWrites:
        return _NoWrites()

    def add_peer(self, peer: str, *_args: object) -> None:
        self.registered.append(peer)

    def remove_peer(self, peer: str) -> None:
        if peer in self.registered:
            self.registered.remove(peer)

    def expect_inbound(self, _seconds: float, prompt: bool = False) -> None:
        pass

    def progress(self) -> None:
        pass

    def poll(self) -> list[object]:
        return []

    def close(self) -> None:
        pass


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[Node]:
    monkeypatch.setattr(planes_module, "DataPlane", _NoMemory)
    n = Node(NodeConfig(bind="tcp://127.0.0.1:0", num_blocks=NUM_BLOCKS, block_len=BLOCK_LEN))
    try:
        yield n
    finally:
        n.close()


def _connect_from(n: Node, peer_id: str) -> Connect:
    """A compatible peer's connect, as that peer sends it."""
    return Connect(peer_id, b"the-peer-agent", 0x20000, NUM_BLOCKS, BLOCK_LEN,
                   n.config.config_fingerprint, n.config.hash_seed, 7, None)


@pytest.fixture
def peer_id() -> Iterator[str]:
    """The identity of a peer that listens (our connect to it goes out)."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        yield f"127.0.0.1:{port}"
    finally:
        sock.close()


def test_a_connect_that_opens_a_session_is_decoded_once(node: Node, peer_id: str,
                                                        decodes: _Decodes) -> None:
    connect = _connect_from(node, peer_id)
    node.control.connect(peer_id)  # the dial-back the ROUTER's intake starts for a connect
    before = decodes.count
    node._peers.on_frame(peer_id, encode(connect))
    node._driver.drain()
    assert decodes.count == before + 1  # by the node; the session took its message
    assert node.sessions[peer_id].peer == connect  # the session took this connect
    assert peer_id in node.data.peers  # and registered the peer: the handshake went on


def test_a_session_handed_the_message_does_not_decode_the_frame(decodes: _Decodes) -> None:
    config = SessionConfig(local_id="127.0.0.1:2", agent_metadata=b"ours", base_addr=0x10000,
                           num_blocks=NUM_BLOCKS, block_len=BLOCK_LEN,
                           expected_peer_id="127.0.0.1:1")
    connect = Connect("127.0.0.1:1", b"theirs", 0x20000, NUM_BLOCKS, BLOCK_LEN,
                      config.config_fingerprint, config.hash_seed, 7, None)
    frame = encode(connect)
    plain, handed = Session(config), Session(config)
    for s in (plain, handed):
        s.handle(HostStart(), 0.0)
    before = decodes.count
    out_plain = plain.handle(FrameReceived(frame), 1.0)
    assert decodes.count == before + 1
    out_handed = handed.handle(FrameReceived(frame, connect), 1.0)
    assert decodes.count == before + 1  # nothing decoded
    assert out_handed == out_plain and handed.state == plain.state
