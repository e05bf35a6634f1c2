"""p2pfsm's ZeroMQ control plane behind vLLM's ``ControlTransport`` interface (0.33.0, 0.34.0).

:class:`PlaneTransport` has ``ZmqTransport``'s constructor ``(local_id, host, port)`` and
the surface vLLM's tier manager uses (``connect``, ``poll``, ``close``), and hands out
:class:`PlaneConnection` objects with ``ControlConnection``'s (``send``, ``recv``,
``alive``, ``mark_dead``, ``close``). Underneath is :class:`~p2pfsm.executor.zmq.plane.
ControlPlane` as ``p2pfsm serve`` configures it: dial-back only for a well-formed connect
from its own address, a pending-handshake budget, a per-host rate of new identities, a
connect timeout, frame size limit, heartbeats, and CURVE when keys are given.
:func:`p2pfsm.vllm.install` with ``transport="p2pfsm"`` makes vLLM's manager build it
(docs/explanation/vllm.md). Frames are dicts, msgpack-encoded as vLLM's own transport does.
Importing this module imports vLLM.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import msgspec
from vllm.v1.kv_offload.tiering.p2p.control.base import ControlConnection, ControlTransport

from p2pfsm.executor.zmq.admission import is_connect_from
from p2pfsm.executor.zmq.curve import load_curve_keys
from p2pfsm.executor.zmq.plane import ControlEvent, ControlPlane, FrameIn, PeerLost
from p2pfsm.vllm import guard
from p2pfsm.vllm.data import progress_open

log = logging.getLogger("p2pfsm.vllm.control")

ENV_RATE = "P2PFSM_VLLM_MAX_NEW_PEERS_PER_S"
ENV_CONNECT_TIMEOUT = "P2PFSM_VLLM_CONNECT_TIMEOUT_MS"
ENV_CURVE_SECRET = "P2PFSM_VLLM_CURVE_SECRET_KEY"
ENV_CURVE_ALLOW = "P2PFSM_VLLM_CURVE_ALLOW"
ENV_CURVE_PEER = "P2PFSM_VLLM_CURVE_PEER_KEY"
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = 2000, 10_000  # vLLM 0.33.0's
MAX_PEERS = 128  # vLLM's VLLM_P2P_MAX_PEERS default; its manager enforces its own too
_ENCODE = msgspec.msgpack.Encoder().encode
_DECODE = msgspec.msgpack.decode


def _is_connect_from(peer_id: str, frame: bytes) -> bool:
    """A well-formed connect (the guard's limits) whose ``peer_id`` is the sender."""
    return is_connect_from(peer_id, frame, guard.limits())


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    return int(text) if text else default


class PlaneConnection(ControlConnection):  # type: ignore[misc]
    """One peer's channel: frames in from the transport's poll, out through its plane."""

    def __init__(self, transport: PlaneTransport, peer_id: str) -> None:
        super().__init__(peer_id)
        self._transport = transport
        self._inbox: list[Any] = []
        self._dead = False
        self._closed = False

    @property
    def alive(self) -> bool:
        return not (self._dead or self._closed)

    def send(self, msg: dict[str, Any]) -> None:
        """Queue ``msg`` without blocking; raises once the connection is dead or the
        peer's queue is full (vLLM's contract: the session then marks it dead)."""
        if not self.alive:
            raise RuntimeError(f"PlaneConnection: send on closed connection to {self.peer_id}")
        if not self._transport._plane.send(self.peer_id, _ENCODE(msg)):
            self._dead = True
            raise ConnectionError(f"PlaneConnection: cannot send to {self.peer_id}")

    def recv(self) -> Sequence[Any]:
        msgs, self._inbox = self._inbox, []
        return msgs

    def mark_dead(self) -> None:
        self._dead = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = self._dead = True
        self._transport._release(self)


class PlaneTransport(ControlTransport):  # type: ignore[misc]
    """``ZmqTransport``'s place in vLLM's tier manager, on p2pfsm's ControlPlane."""

    def __init__(self, local_id: str, host: str, port: int) -> None:
        cfg = guard.config()
        curve = None
        secret = os.environ.get(ENV_CURVE_SECRET, "").strip()
        if secret:
            allow = [a for a in os.environ.get(ENV_CURVE_ALLOW, "").split(",") if a.strip()]
            curve = load_curve_keys(secret, allow,
                                    os.environ.get(ENV_CURVE_PEER, "").strip() or None)
        self._plane = ControlPlane(
            f"tcp://{host}:{port}", heartbeat_ivl_ms=HEARTBEAT_IVL_MS,
            heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS, heartbeat_ttl_ms=HEARTBEAT_TIMEOUT_MS,
            max_peers=MAX_PEERS, max_msg_size=cfg.max_frame_bytes,
            connect_timeout_ms=_env_int(ENV_CONNECT_TIMEOUT, 10_000),
            dial_back_check=_is_connect_from, dial_back_any_host=cfg.dial_back_any_host,
            max_pending=cfg.max_pending, max_new_peers_per_s=_env_int(ENV_RATE, 500),
            max_batch=guard.FRAMES_PER_POLL, curve=curve)
        if self._plane.local_id != local_id:
            self._plane.close()
            raise ValueError(f"PlaneTransport: bound as {self._plane.local_id}, "
                             f"not {local_id}")
        self._local_id = local_id
        self._connections: dict[str, PlaneConnection] = {}
        self._events: list[ControlEvent] = []
        self._closed = False

    @property
    def plane(self) -> ControlPlane:
        """The p2pfsm control plane underneath (its drop counts, peers)."""
        return self._plane

    def connect(self, peer_id: str) -> PlaneConnection:
        """An outbound connection to ``peer_id``; a dead one registered is retired."""
        existing = self._connections.get(peer_id)
        if existing is not None:
            if existing.alive:
                raise ValueError(f"PlaneTransport: connection to {peer_id} already exists")
            existing.close()
        self._plane.connect(peer_id)  # TransportError for a bad id, our own, too many
        conn = PlaneConnection(self, peer_id)
        self._connections[peer_id] = conn
        return conn

    def wait(self, timeout_ms: int) -> None:
        """Block until the plane has news, or ``timeout_ms`` at most (kept for poll())."""
        self._events.extend(self._plane.poll(timeout_ms))
        progress_open()

    def poll(self) -> Sequence[PlaneConnection]:
        """Frames into their connections, lost peers marked dead, dead ones released;
        the connections opened by peers since the last poll (each once). The full
        install's data transports get a UCX progress step too (:mod:`p2pfsm.vllm.data`):
        the manager polls this every tick."""
        progress_open()
        self._sweep()
        events, self._events = self._events + self._plane.poll(0), []
        # A peer lost later in this batch (evicted from the pending budget, refused) gets
        # no new connection for its earlier frames: no session, no registration for it.
        lost_at = {e.peer_id: i for i, e in enumerate(events) if isinstance(e, PeerLost)}
        new: list[PlaneConnection] = []
        for i, event in enumerate(events):
            if isinstance(event, PeerLost):
                conn = self._connections.get(event.peer_id)
                if conn is not None:
                    conn.mark_dead()
                continue
            assert isinstance(event, FrameIn)
            try:
                msg = _DECODE(event.frame)
            except Exception as exc:  # as vLLM: an undecodable frame is dropped
                log.warning("PlaneTransport: undecodable frame from %s: %s", event.peer_id,
                            exc)
                continue
            conn = self._connections.get(event.peer_id)
            if conn is None or not conn.alive:
                if lost_at.get(event.peer_id, -1) > i:
                    continue
                if conn is not None:
                    conn.close()
                conn = PlaneConnection(self, event.peer_id)
                self._connections[event.peer_id] = conn
                new.append(conn)
            conn._inbox.append(msg)
            if isinstance(msg, dict) and msg.get("type") == "connect_ack":
                self._plane.mark_ready(event.peer_id)  # out of the pending budget
        self._sweep()
        return new

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in list(self._connections.values()):
            conn.close()
        self._connections.clear()
        self._plane.close()

    def _sweep(self) -> None:
        for conn in [c for c in self._connections.values() if not c.alive]:
            conn.close()

    def _release(self, conn: PlaneConnection) -> None:
        """``conn`` closed: its DEALER goes, if it is still the one registered."""
        if self._connections.get(conn.peer_id) is conn:
            del self._connections[conn.peer_id]
            if not self._closed:
                self._plane.remove_peer(conn.peer_id)
