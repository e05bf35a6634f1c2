"""The attacker's side: raw pyzmq + msgpack, no p2pfsm code.

A :class:`RawPeer` is what a vLLM-style peer looks like on the wire, built by hand: a
ROUTER bound on ``127.0.0.1:0`` (where the server dials back), and a DEALER whose
routing id is ``"127.0.0.1:PORT"`` of that ROUTER, connected to the server's ROUTER. The
identity, the frame parts and the payload bytes are entirely the caller's choice, so
every field can be wrong.

The demo block model (key and content of block ``i``) is rebuilt here from its
documented definition (``p2pfsm/demo_blocks.py`` docstring), so the attacker can ask
for real blocks and check the bytes the server wrote into its memory.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgpack
import zmq
from helpers.ports import free_port as free_port  # re-exported for the tests here

HASH_SEED = "vllm-none-hash"
BLOCK_LEN = 4096
SERVED_BLOCKS = 64


def demo_key(i: int) -> bytes:
    return hashlib.sha256(b"vllm-interop-key:" + i.to_bytes(8, "big")).digest() + bytes(4)


def demo_block(i: int, block_len: int = BLOCK_LEN) -> bytes:
    return hashlib.shake_256(b"vllm-interop-block:" + i.to_bytes(8, "big")).digest(block_len)


def pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def unpack(frame: bytes) -> Any:
    return msgpack.unpackb(frame, raw=False, strict_map_key=False)


def connect_msg(peer_id: str, metadata: bytes, base_addr: int,
                num_blocks: int = SERVED_BLOCKS, **override: Any) -> dict[str, Any]:
    """A well-formed connect map in vLLM's key order; ``override`` replaces or (with the
    value ``DROP``) removes fields."""
    msg: dict[str, Any] = {
        "type": "connect", "peer_id": peer_id, "agent_metadata": metadata,
        "base_addr": base_addr, "num_blocks": num_blocks, "block_len": BLOCK_LEN,
        "config_fingerprint": "", "hash_seed": HASH_SEED,
    }
    return patched(msg, override)


DROP = object()


def patched(msg: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``msg`` with ``override`` applied (the value ``DROP`` removes a key)."""
    out = dict(msg)
    for key, value in override.items():
        if value is DROP:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def fetch_msg(rid: str, keys: Any, indexes: Any, round_seq: Any = 0) -> dict[str, Any]:
    return {"type": "fetch", "kv_request_id": rid, "keys": keys, "block_indexes": indexes,
            "round_seq": round_seq}


class RawPeer:
    """One attacker identity: a bound ROUTER (ours) and a DEALER to the server."""

    def __init__(self, ctx: zmq.Context[Any], server: str, *, identity: bytes | None = None,
                 bind: bool = True, sndhwm: int = 1000, source: str | None = None) -> None:
        self.ctx = ctx
        self.router: zmq.Socket[bytes] | None = None
        port = 0
        if bind:
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.peer_id = f"127.0.0.1:{port}"
        self.identity = identity if identity is not None else self.peer_id.encode()
        self.server = server
        self.sndhwm = sndhwm
        self.source = source  # the address our DEALER connects from (None: the kernel's)
        self.dealer: zmq.Socket[bytes] = self._dial()
        self.seen: list[dict[str, Any]] = []

    def _dial(self) -> zmq.Socket[bytes]:
        dealer: zmq.Socket[bytes] = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.SNDHWM, self.sndhwm)
        dealer.setsockopt(zmq.IDENTITY, self.identity)
        origin = "" if self.source is None else f"{self.source}:0;"
        dealer.connect(f"tcp://{origin}{self.server}")
        return dealer

    def redial(self, between: Callable[[], None] | None = None) -> None:
        """A new DEALER under the same identity (a reconnect); ``between`` runs after the
        old one is closed, before the new one dials."""
        self.dealer.close(0)
        if between is not None:
            between()
        self.dealer = self._dial()

    def send(self, obj: Any) -> None:
        self.send_raw(pack(obj))

    def send_raw(self, payload: bytes) -> None:
        self.dealer.send(payload)

    def send_parts(self, parts: list[bytes]) -> None:
        self.dealer.send_multipart(parts)

    def recv(self, timeout: float) -> dict[str, Any] | None:
        """The next map the server sent us, or None after ``timeout`` s."""
        assert self.router is not None
        if not self.router.poll(int(timeout * 1000)):
            return None
        parts = self.router.recv_multipart()
        msg = unpack(parts[-1])
        self.seen.append(msg)
        return msg  # type: ignore[no-any-return]

    def expect(self, kind: str, timeout: float = 10.0, match: Any = None,
               pump: Callable[[], None] | None = None,
               ends_on: tuple[str, ...] = ()) -> dict[str, Any]:
        """Read until a message of type ``kind`` (for which ``match(msg)`` holds) arrives;
        fail after ``timeout`` s naming what came instead, or at once when a message of a
        type in ``ends_on`` comes (one after which ``kind`` cannot). ``pump`` is called
        between short waits (our NIXL agent's progress, which a peer's WRITE into us
        needs)."""
        deadline = time.monotonic() + timeout
        got: list[str] = []
        while (left := deadline - time.monotonic()) > 0:
            if pump is not None:
                pump()
            msg = self.recv(left if pump is None else min(left, 0.005))
            if msg is None:
                if pump is not None:
                    continue
                break
            if isinstance(msg, dict) and msg.get("type") == kind and (match is None
                                                                     or match(msg)):
                return msg
            got.append(str(msg.get("type")) if isinstance(msg, dict) else repr(msg)[:40])
            if got[-1] in ends_on:
                raise AssertionError(f"{got[-1]} from the server before any {kind}; got {got}")
        raise AssertionError(f"no {kind} from the server within {timeout:.1f} s; got {got}")

    def types_within(self, timeout: float) -> list[str]:
        """Types of everything the server sends us in the next ``timeout`` s (an
        observation window for 'the server says nothing', never a synchronisation)."""
        deadline = time.monotonic() + timeout
        out: list[str] = []
        while (left := deadline - time.monotonic()) > 0:
            msg = self.recv(left)
            if msg is None:
                break
            out.append(str(msg.get("type")) if isinstance(msg, dict) else "?")
        return out

    def handshake(self, metadata: bytes, base_addr: int, timeout: float = 10.0,
                  **override: Any) -> dict[str, Any]:
        """connect -> the server's connect -> our connect_ack -> its connect_ack."""
        self.send(connect_msg(self.peer_id, metadata, base_addr, **override))
        theirs = self.expect("connect", timeout)
        self.send({"type": "connect_ack", "peer_id": self.peer_id})
        self.expect("connect_ack", timeout)
        return theirs

    def fetch_ok(self, plane: Any, rid: str, blocks: Iterable[int], round_seq: int = 0,
                 timeout: float = 10.0, ends_on: tuple[str, ...] = ()) -> None:
        """A real PD fetch of demo blocks into ``plane`` (an object with ``region``, a
        uint8 tensor of rows, and ``progress()``), every byte checked; it fails at once
        on a message of a type in ``ends_on``."""
        blocks = list(blocks)
        for slot in range(len(blocks)):
            plane.region[slot].zero_()
        self.send(fetch_msg(rid, [demo_key(b) for b in blocks], list(range(len(blocks))),
                            round_seq))
        done = self.expect("transfer_done", timeout, lambda m: m.get("kv_request_id") == rid,
                           pump=plane.progress, ends_on=ends_on)
        assert done["success"] is True, done
        for slot, b in enumerate(blocks):
            assert plane.region[slot].numpy().tobytes() == demo_block(b), f"block {b}"

    def close(self) -> None:
        self.dealer.close(0)
        if self.router is not None:
            self.router.close(0)
