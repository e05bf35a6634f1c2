"""ZeroMQ control plane: one bound ROUTER that only receives, one DEALER per peer that only sends.

This is the socket pattern of vLLM 0.33.0's P2P tier (wire-notes section 3). A node binds a
ROUTER on ``tcp://HOST:PORT`` and is known to every peer as ``local_id = "HOST:PORT"`` (no
``tcp://``). To talk to a peer it opens a DEALER whose ZMQ identity is ``local_id`` and
connects it to the peer's ROUTER, so each direction of a conversation has its own TCP
connection and the ROUTER sees every message as ``[routing_id = sender's local_id, frame]``.
A frame from a routing id with no DEALER yet is answered by dialling one back.

What this module adds on top of the raw pattern, because vLLM's own transport does not:

* routing ids are parsed strictly (ASCII ``host:port``; host an IPv4 literal, a bracketed
  IPv6 literal or an RFC 1123 name; port a canonical decimal in 1..65535) and anything
  else is dropped instead of crashing the loop;
* messages at the ROUTER with other than exactly two frames are dropped;
* the number of peers is capped (frames from new identities beyond the cap are dropped);
* a DEALER whose TCP connect fails (refused: nobody listens there) is given up at once with
  ``"connection refused"``, and one that never completes its ZMTP handshake after
  ``connect_timeout_ms`` with ``"connect timeout"``;
* the per-DEALER socket monitor is always detached with ``disable_monitor()`` before its
  PAIR socket is closed (libzmq#3575: closing the PAIR first can wedge the I/O thread and
  with it the whole context), and it only subscribes to the handful of events it acts on,
  so an unread monitor pipe cannot fill up;
* ``close()`` is bounded by the DEALER linger (500 ms by default) and idempotent.

Liveness: ZMTP heartbeats (PING every ``heartbeat_ivl_ms``, drop after
``heartbeat_timeout_ms`` of silence) make libzmq drop the TCP connection of a frozen peer;
a killed peer's kernel closes it at once. Either way the DEALER's monitor reports
``EVENT_DISCONNECTED`` and :meth:`ControlPlane.poll` turns it into one :class:`PeerLost`;
the peer's sockets are then torn down, so a later frame from the same id starts afresh.

Nothing here sleeps: :meth:`ControlPlane.poll` waits in ``zmq_poll`` with a timeout, and
:meth:`ControlPlane.fileno` gives an event loop one descriptor to wait on instead.
Not thread-safe: use one ControlPlane from one thread.
"""

from __future__ import annotations

import ipaddress
import itertools
import math
import select
import struct
import time
from dataclasses import dataclass
from typing import Final, TypeAlias

import zmq

from p2pfsm.errors import ConfigError, TransportError

__all__ = ["ControlEvent", "ControlPlane", "FrameIn", "PeerLost", "parse_peer_id"]


@dataclass(frozen=True, slots=True)
class FrameIn:
    """One control frame received from ``peer_id`` (its routing id, i.e. its local_id)."""

    peer_id: str
    frame: bytes


@dataclass(frozen=True, slots=True)
class PeerLost:
    """The connection to ``peer_id`` is gone; its DEALER has been closed.

    Reported once per loss. ``reason`` is one of ``"disconnected"``, ``"closed"``,
    ``"handshake failed"``, ``"connection refused"`` (the TCP connect failed: refused, or
    the host is unreachable), ``"connection closed before handshake"``,
    ``"connect timeout"``, ``"send queue full"``, ``"send failed: ..."`` or
    ``"not connected"`` (a send to an id with no DEALER).
    """

    peer_id: str
    reason: str


ControlEvent: TypeAlias = FrameIn | PeerLost

_MAX_HOSTNAME_LEN: Final = 253
_MAX_PEER_ID_LEN: Final = _MAX_HOSTNAME_LEN + 1 + 5
_HOST_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_DIGITS_AND_DOTS: Final = frozenset("0123456789.")
_MAX_HEARTBEAT_TTL_MS: Final = 6_553_599  # ZMTP carries the TTL in deciseconds, 16 bits.

_EV_HANDSHAKE_OK: Final = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
_EV_HANDSHAKE_FAILED: Final = frozenset(
    {
        int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL),
        int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL),
        int(zmq.EVENT_HANDSHAKE_FAILED_AUTH),
    }
)
_EV_DISCONNECTED: Final = int(zmq.EVENT_DISCONNECTED)
_EV_CLOSED: Final = int(zmq.EVENT_CLOSED)
_EV_CONNECT_RETRIED: Final = int(zmq.EVENT_CONNECT_RETRIED)
# Only what we act on. While a connection keeps failing to come up, libzmq repeats
# CLOSED/DISCONNECTED and CONNECT_RETRIED every reconnect interval; the first
# CONNECT_RETRIED (or a handshake failure) before the handshake ends the peer, and
# CLOSED/DISCONNECTED end it once it has connected, so none of them piles up.
_MONITOR_MASK: Final = (
    _EV_HANDSHAKE_OK
    | _EV_DISCONNECTED
    | _EV_CLOSED
    | _EV_CONNECT_RETRIED
    | int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    | int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
    | int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
)
_MONITOR_HEADER: Final = struct.Struct("=HI")  # uint16 event id, uint32 value, no padding

_monitor_serial = itertools.count()


def _host_is_valid(host: str) -> bool:
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    if not host or len(host) > _MAX_HOSTNAME_LEN:
        return False
    if set(host) <= _DIGITS_AND_DOTS:
        # Looks numeric, so it must be a well-formed IPv4 literal (no octet > 255,
        # no leading zeros), never a "hostname" such as 1.2.3.999.
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    for label in host.split("."):
        if not 1 <= len(label) <= 63 or not set(label) <= _HOST_CHARS:
            return False
        if label[0] == "-" or label[-1] == "-":
            return False
    return True


def parse_peer_id(raw: str | bytes, *, allow_port_zero: bool = False) -> tuple[str, int]:
    """Parse a peer id ``"host:port"`` strictly; return ``(host, port)``.

    Raises :class:`TransportError` for anything else: non-ASCII or non-UTF-8 bytes, no
    colon, a port that is not a canonical decimal in 1..65535 (0 too when
    ``allow_port_zero``), or a host that is neither an IPv4 literal, a bracketed IPv6
    literal nor an RFC 1123 host name. Never raises anything else, whatever ``raw`` is.
    """
    if isinstance(raw, bytes):
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            raise TransportError(f"peer id is not ASCII: {raw[:64]!r}") from None
    elif isinstance(raw, str):
        if not raw.isascii():
            raise TransportError(f"peer id is not ASCII: {raw[:64]!r}")
        text = raw
    else:
        raise TransportError(f"peer id must be str or bytes, not {type(raw).__name__}")
    if len(text) > _MAX_PEER_ID_LEN:
        raise TransportError(f"peer id longer than {_MAX_PEER_ID_LEN} characters")
    host, colon, port_text = text.rpartition(":")
    if not colon:
        raise TransportError(f"peer id has no ':port': {text!r}")
    if not port_text.isdigit() or (len(port_text) > 1 and port_text[0] == "0"):
        raise TransportError(f"peer id port is not a canonical decimal: {text!r}")
    port = int(port_text)
    if not (0 if allow_port_zero else 1) <= port <= 65535:
        raise TransportError(f"peer id port out of range: {text!r}")
    if not _host_is_valid(host):
        raise TransportError(f"peer id host is not an IP literal or host name: {text!r}")
    return host, port


def _fd(sock: zmq.Socket[bytes]) -> int:
    """The socket's notification descriptor (ZMQ_FD), for epoll."""
    fd = sock.getsockopt(zmq.FD)
    assert isinstance(fd, int)
    return fd


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(f"{name} must be an int {bound}, got {value!r}")
    return value


@dataclass(eq=False)
class _Peer:
    peer_id: str
    dealer: zmq.Socket[bytes]
    monitor: zmq.Socket[bytes]
    deadline: float | None  # time.monotonic() by which the handshake must succeed
    connected: bool = False
    reached: bool = False  # a TCP connection came up (and went) before the handshake


class ControlPlane:
    """A node's control-frame transport: bound ROUTER in, one DEALER per peer out.

    Args:
        bind: ``"tcp://HOST:PORT"``; port 0 picks a free port.
        heartbeat_ivl_ms, heartbeat_timeout_ms, heartbeat_ttl_ms: ZMTP heartbeats on
            every socket (vLLM: 2000/10000/10000). A peer silent for the timeout is
            dropped by libzmq and reported as :class:`PeerLost`.
        sndhwm, rcvhwm: queue bounds in messages (vLLM: 1000 each). A DEALER whose
            queue is full is treated as dead (vLLM's rule).
        dealer_linger_ms: how long a closed DEALER may keep flushing (vLLM: 500).
        immediate: ZMQ_IMMEDIATE on DEALERs (vLLM: off, so frames queue until TCP is up).
        max_peers: at most this many DEALERs at once (vLLM: 128).
        connect_timeout_ms: a DEALER whose ZMTP handshake has not succeeded by then is
            given up with ``PeerLost(reason="connect timeout")``. A refused TCP connect
            does not wait for it: it is ``PeerLost(reason="connection refused")`` at once.
        max_msg_size: largest frame the ROUTER accepts; a larger one drops that
            connection (libzmq MAXMSGSIZE). vLLM sets no limit.
        max_batch: at most this many ROUTER messages handled per :meth:`poll` call.
        advertise_host: the host put in ``local_id`` (default: the bind host), for
            binding a wildcard address while advertising a reachable one.
    """

    def __init__(
        self,
        bind: str,
        *,
        heartbeat_ivl_ms: int = 2000,
        heartbeat_timeout_ms: int = 10_000,
        heartbeat_ttl_ms: int = 10_000,
        sndhwm: int = 1000,
        rcvhwm: int = 1000,
        dealer_linger_ms: int = 500,
        immediate: bool = False,
        max_peers: int = 128,
        connect_timeout_ms: int = 10_000,
        max_msg_size: int = 16 * 1024 * 1024,
        max_batch: int = 1000,
        advertise_host: str | None = None,
    ) -> None:
        if not isinstance(bind, str) or not bind.startswith("tcp://"):
            raise ConfigError(f"bind must be 'tcp://HOST:PORT', got {bind!r}")
        try:
            host, port = parse_peer_id(bind[len("tcp://") :], allow_port_zero=True)
        except TransportError as exc:
            raise ConfigError(f"bad bind address {bind!r}: {exc}") from None
        if advertise_host is not None:
            try:
                parse_peer_id(f"{advertise_host}:1")
            except TransportError as exc:
                raise ConfigError(f"bad advertise_host {advertise_host!r}: {exc}") from None
        self._hb_ivl = _check_int("heartbeat_ivl_ms", heartbeat_ivl_ms, 0)
        self._hb_timeout = _check_int("heartbeat_timeout_ms", heartbeat_timeout_ms, 0)
        self._hb_ttl = _check_int("heartbeat_ttl_ms", heartbeat_ttl_ms, 0, _MAX_HEARTBEAT_TTL_MS)
        self._sndhwm = _check_int("sndhwm", sndhwm, 0)
        self._rcvhwm = _check_int("rcvhwm", rcvhwm, 0)
        self._dealer_linger = _check_int("dealer_linger_ms", dealer_linger_ms, 0)
        self._max_peers = _check_int("max_peers", max_peers, 1)
        self._connect_timeout = _check_int("connect_timeout_ms", connect_timeout_ms, 1)
        self._max_msg_size = _check_int("max_msg_size", max_msg_size, 1)
        self._max_batch = _check_int("max_batch", max_batch, 1)
        self._immediate = bool(immediate)

        self._peers: dict[str, _Peer] = {}
        self._peer_by_ident: dict[bytes, str] = {}
        self._pending: list[ControlEvent] = []
        self._drops: dict[str, int] = {}
        self._closed = False

        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._router: zmq.Socket[bytes] = self._ctx.socket(zmq.ROUTER)
        try:
            self._set_heartbeats(self._router)
            self._router.setsockopt(zmq.RCVHWM, self._rcvhwm)
            self._router.setsockopt(zmq.MAXMSGSIZE, self._max_msg_size)
            # A restarted peer reconnects under the same identity; let the new
            # connection take the identity over instead of being refused.
            self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            if host.startswith("["):
                self._router.setsockopt(zmq.IPV6, 1)
            self._router.bind(f"tcp://{host}:{port}")
            endpoint = self._router.getsockopt(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            self._router.close(linger=0)
            self._ctx.term()
            self._closed = True
            raise TransportError(f"cannot bind ROUTER on {bind}: {exc}") from exc
        assert isinstance(endpoint, bytes)
        bound_port = int(endpoint.decode("ascii").rpartition(":")[2])
        self._local_id = f"{advertise_host if advertise_host is not None else host}:{bound_port}"
        self._identity = self._local_id.encode("ascii")

        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)
        self._epoll = select.epoll()
        self._epoll.register(_fd(self._router), select.EPOLLIN)

    # -- properties ---------------------------------------------------------------

    @property
    def local_id(self) -> str:
        """``"host:port"`` of the bound ROUTER; also the identity of every DEALER."""
        return self._local_id

    @property
    def peers(self) -> tuple[str, ...]:
        """Ids of the peers that currently have a DEALER (connected or still dialling)."""
        return tuple(self._peers)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def drop_counts(self) -> dict[str, int]:
        """How many inbound messages were dropped, by reason (a copy)."""
        return dict(self._drops)

    def is_connected(self, peer_id: str) -> bool:
        """True once the DEALER to ``peer_id`` completed its ZMTP handshake."""
        peer = self._peers.get(peer_id)
        return peer is not None and peer.connected

    # -- peers --------------------------------------------------------------------

    def connect(self, peer_id: str) -> None:
        """Open the DEALER to ``tcp://peer_id`` (no-op if one is already open).

        Frames sent before TCP is up are queued (unless ``immediate``). Raises
        :class:`TransportError` for a malformed id, our own id, or too many peers.
        """
        self._check_open()
        parse_peer_id(peer_id)
        if peer_id == self._local_id:
            raise TransportError("cannot connect to our own local_id")
        if peer_id in self._peers:
            return
        if len(self._peers) >= self._max_peers:
            raise TransportError(f"peer limit reached ({self._max_peers})")
        self._open_peer(peer_id)

    def remove_peer(self, peer_id: str) -> None:
        """Close the DEALER to ``peer_id`` (lingering up to ``dealer_linger_ms`` to
        flush what was sent). No :class:`PeerLost` is reported. Unknown ids are ignored."""
        self._check_open()
        peer = self._peers.get(peer_id)
        if peer is not None:
            self._teardown(peer, self._dealer_linger)

    # -- I/O ----------------------------------------------------------------------

    def send(self, peer_id: str, frame: bytes) -> bool:
        """Queue one frame to ``peer_id`` without blocking.

        Returns False, and queues a :class:`PeerLost` for the next :meth:`poll`, when
        there is no DEALER for ``peer_id`` or its queue is full or the send fails (the
        DEALER is then closed).
        """
        self._check_open()
        peer = self._peers.get(peer_id)
        if peer is None:
            self._pending.append(PeerLost(peer_id, "not connected"))
            return False
        try:
            peer.dealer.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            self._lose(peer, "send queue full")
            return False
        except zmq.ZMQError as exc:
            self._lose(peer, f"send failed: {exc}")
            return False
        return True

    def poll(self, timeout_ms: int) -> list[ControlEvent]:
        """Return what happened, waiting up to ``timeout_ms`` (0: don't wait; < 0: wait
        until something happens) for the first event.

        Frames come out in the order each peer sent them. A :class:`PeerLost` may be
        followed by frames from the same id, which then start a fresh peer.
        """
        self._check_open()
        events = self._collect()
        if events or timeout_ms == 0:
            return events
        end = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        while True:
            wait = self._wait_ms(end)
            if wait != 0:
                self._poller.poll(wait)
            events = self._collect()
            if events or (end is not None and time.monotonic() >= end):
                return events

    def fileno(self) -> int:
        """One descriptor that becomes readable when :meth:`poll` may have news.

        It is an epoll set over ZeroMQ's notification descriptors, which are edge
        triggered: after it turns readable, call ``poll(0)`` until it returns an empty
        list before waiting on it again. Connect timeouts do not wake it; a loop using
        it should also call ``poll(0)`` at least every :meth:`next_timeout_ms`.
        """
        self._check_open()
        return self._epoll.fileno()

    def next_timeout_ms(self) -> int | None:
        """Milliseconds until the earliest connect deadline, None when there is none."""
        return self._wait_ms(None)

    def close(self) -> None:
        """Close every socket and the context. Idempotent; returns within about
        ``dealer_linger_ms`` even when peers are dead or frozen."""
        if self._closed:
            return
        self._closed = True
        try:
            for peer in list(self._peers.values()):
                self._teardown(peer, self._dealer_linger)
            self._poller.unregister(self._router)
            self._epoll.unregister(_fd(self._router))
        finally:
            self._epoll.close()
            self._router.close(linger=0)
            self._ctx.term()

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("control plane is closed")

    def _set_heartbeats(self, sock: zmq.Socket[bytes]) -> None:
        sock.setsockopt(zmq.HEARTBEAT_IVL, self._hb_ivl)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self._hb_timeout)
        sock.setsockopt(zmq.HEARTBEAT_TTL, self._hb_ttl)

    def _open_peer(self, peer_id: str) -> _Peer:
        dealer = self._ctx.socket(zmq.DEALER)
        monitor: zmq.Socket[bytes] | None = None
        monitoring = False
        try:
            dealer.setsockopt(zmq.IDENTITY, self._identity)
            dealer.setsockopt(zmq.SNDHWM, self._sndhwm)
            dealer.setsockopt(zmq.RCVHWM, self._rcvhwm)
            dealer.setsockopt(zmq.LINGER, self._dealer_linger)
            dealer.setsockopt(zmq.IMMEDIATE, 1 if self._immediate else 0)
            self._set_heartbeats(dealer)
            if peer_id.startswith("["):
                dealer.setsockopt(zmq.IPV6, 1)
            addr = f"inproc://p2pfsm-monitor-{id(self):x}-{next(_monitor_serial)}"
            dealer.monitor(addr, _MONITOR_MASK)
            monitoring = True
            monitor = self._ctx.socket(zmq.PAIR)
            monitor.setsockopt(zmq.LINGER, 0)
            monitor.connect(addr)
            dealer.connect(f"tcp://{peer_id}")
        except zmq.ZMQError as exc:
            if monitoring:
                dealer.disable_monitor()
            if monitor is not None:
                monitor.close(linger=0)
            dealer.close(linger=0)
            raise TransportError(f"cannot open DEALER to {peer_id}: {exc}") from exc
        deadline = time.monotonic() + self._connect_timeout / 1000.0
        peer = _Peer(peer_id, dealer, monitor, deadline)
        self._peers[peer_id] = peer
        self._poller.register(monitor, zmq.POLLIN)
        self._epoll.register(_fd(monitor), select.EPOLLIN)
        return peer

    def _teardown(self, peer: _Peer, linger_ms: int) -> None:
        # Order matters (libzmq#3575): stop the DEALER's monitor before closing the
        # PAIR that reads it, so the DEALER never writes into a dead monitor pipe.
        self._peers.pop(peer.peer_id, None)
        self._peer_by_ident.pop(peer.peer_id.encode("ascii"), None)
        self._poller.unregister(peer.monitor)
        self._epoll.unregister(_fd(peer.monitor))
        try:
            peer.dealer.disable_monitor()
        finally:
            peer.monitor.close(linger=0)
            peer.dealer.close(linger=linger_ms)

    def _lose(self, peer: _Peer, reason: str) -> None:
        self._teardown(peer, 0)
        self._pending.append(PeerLost(peer.peer_id, reason))

    def _drop(self, reason: str) -> None:
        self._drops[reason] = self._drops.get(reason, 0) + 1

    def _collect(self) -> list[ControlEvent]:
        out = self._pending
        self._pending = []
        self._drain_router(out)
        self._drain_monitors()
        self._expire()
        out.extend(self._pending)
        self._pending = []
        return out

    def _drain_router(self, out: list[ControlEvent]) -> None:
        for _ in range(self._max_batch):
            # Checking EVENTS first avoids raising zmq.Again on every empty poll.
            if not int(self._router.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                return
            try:
                parts = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(parts) != 2:
                self._drop("frame count")
                continue
            ident, frame = parts
            peer_id = self._admit(ident)
            if peer_id is not None:
                out.append(FrameIn(peer_id, frame))

    def _admit(self, ident: bytes) -> str | None:
        """The peer id for a routing id, dialling back unknown ones; None = drop."""
        known = self._peer_by_ident.get(ident)
        if known is not None and known in self._peers:
            return known
        try:
            parse_peer_id(ident)
        except TransportError:
            self._drop("bad identity")
            return None
        peer_id = ident.decode("ascii")
        if peer_id in self._peers:
            self._peer_by_ident[ident] = peer_id
            return peer_id
        if peer_id == self._local_id:
            self._drop("own identity")
            return None
        if len(self._peers) >= self._max_peers:
            self._drop("peer limit")
            return None
        try:
            self._open_peer(peer_id)
        except TransportError:
            self._drop("dial-back failed")
            return None
        self._peer_by_ident[ident] = peer_id
        return peer_id

    def _drain_monitors(self) -> None:
        for peer in list(self._peers.values()):
            while peer.peer_id in self._peers:
                if not int(peer.monitor.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    break
                try:
                    parts = peer.monitor.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if not parts or len(parts[0]) != _MONITOR_HEADER.size:
                    continue
                event, _value = _MONITOR_HEADER.unpack(parts[0])
                if event == _EV_HANDSHAKE_OK:
                    peer.connected = True
                    peer.deadline = None
                elif event in _EV_HANDSHAKE_FAILED:
                    self._lose(peer, "handshake failed")
                elif peer.connected and event == _EV_DISCONNECTED:
                    self._lose(peer, "disconnected")
                elif peer.connected and event == _EV_CLOSED:
                    self._lose(peer, "closed")
                elif not peer.connected and event == _EV_DISCONNECTED:
                    peer.reached = True
                elif not peer.connected and event == _EV_CONNECT_RETRIED:
                    # libzmq failed a connect attempt and would retry. With no TCP
                    # connection made (no DISCONNECTED before: just CLOSED), the connect
                    # itself failed: on an address nobody listens on, at once.
                    self._lose(peer, "connection closed before handshake" if peer.reached
                               else "connection refused")
                # Before the first handshake, CLOSED is the socket of a failed attempt.

    def _expire(self) -> None:
        now = time.monotonic()
        for peer in list(self._peers.values()):
            if peer.deadline is not None and now >= peer.deadline:
                self._lose(peer, "connect timeout")

    def _wait_ms(self, end: float | None) -> int | None:
        deadlines = [p.deadline for p in self._peers.values() if p.deadline is not None]
        if end is not None:
            deadlines.append(end)
        if not deadlines:
            return None
        return max(0, math.ceil((min(deadlines) - time.monotonic()) * 1000.0))
