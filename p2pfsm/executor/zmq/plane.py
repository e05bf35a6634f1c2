"""ZeroMQ control plane: one bound ROUTER that only receives, one DEALER per peer that only sends.

This is the socket pattern of vLLM 0.33.0's P2P tier
(``vllm/v1/kv_offload/tiering/p2p/control/zmq.py``). A node binds a
ROUTER on ``tcp://HOST:PORT`` and is known to every peer as ``local_id = "HOST:PORT"`` (no
``tcp://``). To talk to a peer it opens a DEALER whose ZMQ identity is ``local_id`` and
connects it to the peer's ROUTER, so each direction of a conversation has its own TCP
connection and the ROUTER sees every message as ``[routing_id = sender's local_id, frame]``.
A frame from a routing id with no DEALER yet is answered by dialling one back.

The rooms: the frames the ROUTER receives and who is let in (the strict parsing of
routing ids, the peer cap and the hardening options) are
:mod:`p2pfsm.executor.zmq.intake`; the DEALERs, their monitors, connect timeouts and
the pending budget :mod:`p2pfsm.executor.zmq.dealers`; ZMTP heartbeats
:mod:`p2pfsm.executor.zmq.heartbeats`; the events reported
:mod:`p2pfsm.executor.zmq.events`. ``close()`` is bounded by the DEALER linger (500 ms
by default) and idempotent. With ``curve``, ZeroMQ CURVE is on every socket with an
allow-list of client keys enforced by a ZAP authenticator on our context: an unknown key
or no key at all (NULL security) is refused during the ZMTP handshake, before any frame
is delivered, and logged on ``p2pfsm.zmq``. A dial-back uses the key the peer
authenticated with (ZAP User-Id).

Liveness: ZMTP heartbeats make libzmq drop the TCP connection of a frozen peer; a killed
peer's kernel closes it at once. Either way the DEALER's monitor reports
``EVENT_DISCONNECTED`` and :meth:`ControlPlane.poll` turns it into one :class:`PeerLost`;
the peer's sockets are then torn down, so a later frame from the same id starts afresh.

Nothing here sleeps: :meth:`ControlPlane.poll` waits in ``zmq_poll`` with a timeout, and
:meth:`ControlPlane.fileno` gives an event loop one descriptor to wait on instead.
Not thread-safe: use one ControlPlane from one thread.
"""

from __future__ import annotations

import itertools
import math
import select
import time
from collections.abc import Callable
from typing import Final

import zmq

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.zmq.admission import EVICTED, NewPeerRate, check_int
from p2pfsm.executor.zmq.curve import CurveKeys, Gatekeeper
from p2pfsm.executor.zmq.dealers import Dealers
from p2pfsm.executor.zmq.events import ControlEvent, FrameIn, PeerLost, frame_meta
from p2pfsm.executor.zmq.heartbeats import ROUTER_PING_FACTOR, Heartbeats
from p2pfsm.executor.zmq.intake import RATE_LIMITED, RouterIntake
from p2pfsm.executor.zmq.monitors import HANDSHAKE_FAILURES_MASK, fd_of
from p2pfsm.executor.zmq.peer_ids import ip_of, parse_peer_id
from p2pfsm.executor.zmq.waker import Waker

__all__ = [
    "EVICTED",
    "RATE_LIMITED",
    "ControlEvent",
    "ControlPlane",
    "FrameIn",
    "PeerLost",
    "frame_meta",
]

_LISTEN_BACKLOG: Final = 1024
_router_monitor_serial = itertools.count()


class ControlPlane:
    """A node's control-frame transport: bound ROUTER in, one DEALER per peer out.

    Args:
        bind: ``"tcp://HOST:PORT"``; port 0 picks a free port.
        heartbeat_ivl_ms, heartbeat_timeout_ms, heartbeat_ttl_ms: ZMTP heartbeats sent
            by every DEALER (vLLM: 2000/10000/10000, on both its sockets). A peer
            silent for the timeout is dropped by libzmq and reported as
            :class:`PeerLost`. The ROUTER PINGs 6 times as rarely
            (:meth:`~p2pfsm.executor.zmq.heartbeats.Heartbeats.apply`).
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
        dial_back_check: ``check(peer_id, frame)`` decides whether a frame from an
            identity with no DEALER is dialled back (False: dropped as "not a
            connect"); None: every frame is (vLLM's raw pattern). A node passes
            :func:`~p2pfsm.executor.zmq.admission.is_connect_from`.
        dial_back_any_host: dial back whatever host the identity names. Off by
            default: only an identity whose host is the IP the connection came from.
        max_pending: the budget of dial-backs not yet :meth:`mark_ready` (when full,
            one is evicted for a new one:
            :meth:`~p2pfsm.executor.zmq.dealers.Dealers.make_room`); ready peers and our own
            dials count against ``max_peers``. None: every peer counts against
            ``max_peers``, no eviction.
        curve: CURVE keys (:func:`load_curve_keys`); None: NULL security (vLLM's).
        max_new_peers_per_s: new identities admitted per source host and second (a
            burst of as many at once); past it their frames are dropped. None: no limit.
        rate_clock: the clock of that limit (seconds, monotonic); tests pass their own.
        holds_session: ``holds(peer_id)``: the node still holds a session of that id
            which is over. Its peer's frames from the host the id names reach the node
            without a dial-back (which :meth:`answer` may then make), however long ago
            the connection was lost; None: only for 60 s after the loss (``dealers._LOST_KEEP_S``).
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
        dial_back_check: Callable[[str, bytes], bool] | None = None,
        holds_session: Callable[[str], bool] | None = None,
        dial_back_any_host: bool = False,
        max_pending: int | None = None,
        curve: CurveKeys | None = None,
        max_new_peers_per_s: int | None = None,
        rate_clock: Callable[[], float] = time.monotonic,
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
        heartbeats = Heartbeats.checked(heartbeat_ivl_ms, heartbeat_timeout_ms,
                                        heartbeat_ttl_ms)
        sndhwm = check_int("sndhwm", sndhwm, 0)
        rcvhwm = check_int("rcvhwm", rcvhwm, 0)
        self._dealer_linger = check_int("dealer_linger_ms", dealer_linger_ms, 0)
        self._max_peers = check_int("max_peers", max_peers, 1)
        connect_timeout_ms = check_int("connect_timeout_ms", connect_timeout_ms, 1)
        max_msg_size = check_int("max_msg_size", max_msg_size, 1)
        max_batch = check_int("max_batch", max_batch, 1)
        self._max_pending = None if max_pending is None else check_int(
            "max_pending", max_pending, 1)
        rate = None if max_new_peers_per_s is None else NewPeerRate(max_new_peers_per_s)
        if not callable(rate_clock):
            raise ConfigError(f"rate_clock must be callable, got {rate_clock!r}")
        if curve is not None and not isinstance(curve, CurveKeys):
            raise ConfigError(f"curve must be CurveKeys, got {curve!r}")
        self._curve = curve
        # Our DEALERs connect from the bind address when it is one specific IP, so the
        # peer sees our connection come from the host our identity names.
        bind_ip = ip_of(host)
        source = host if bind_ip is not None and not bind_ip.is_unspecified else None
        self._closed = False

        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._auth: Gatekeeper | None = None
        self._router_monitor: zmq.Socket[bytes] | None = None
        self._router: zmq.Socket[bytes] = self._ctx.socket(zmq.ROUTER)
        try:
            if curve is not None:
                # ZAP first: a CURVE server with no handler yet would let any key in.
                self._auth = Gatekeeper(self._ctx, curve.allow)
                self._auth.start()
                self._auth.configure_curve_callback("*", self._auth)
                self._router.setsockopt(zmq.CURVE_SERVER, 1)
                self._router.setsockopt(zmq.CURVE_SECRETKEY, curve.secret)
                addr = (f"inproc://p2pfsm-router-monitor-{id(self):x}-"
                        f"{next(_router_monitor_serial)}")
                self._router.monitor(addr, HANDSHAKE_FAILURES_MASK)
                self._router_monitor = self._ctx.socket(zmq.PAIR)
                self._router_monitor.setsockopt(zmq.LINGER, 0)
                self._router_monitor.connect(addr)
            heartbeats.apply(self._router, ROUTER_PING_FACTOR)
            self._router.setsockopt(zmq.RCVHWM, rcvhwm)
            self._router.setsockopt(zmq.MAXMSGSIZE, max_msg_size)
            # No ROUTER_HANDOVER (vLLM sets none either): a second connection presenting
            # a live connection's id is never read, so a twin cannot cut the peer off
            # (with handover libzmq would stop reading the live one). A restarted peer
            # whose old connection still looks open (a host gone silent: no FIN) gets
            # in once heartbeats end that one and it connects again.
            # A burst of connects (hundreds of peers at once, or a flood) must not
            # overflow libzmq's default listen backlog of 100, which stalls even a
            # legitimate peer's TCP connect for seconds of SYN retries.
            self._router.setsockopt(zmq.BACKLOG, _LISTEN_BACKLOG)
            if host.startswith("["):
                self._router.setsockopt(zmq.IPV6, 1)
            self._router.bind(f"tcp://{host}:{port}")
            endpoint = self._router.getsockopt(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            self._close_router()
            self._closed = True
            raise TransportError(f"cannot bind ROUTER on {bind}: {exc}") from exc
        assert isinstance(endpoint, bytes)
        bound_port = int(endpoint.decode("ascii").rpartition(":")[2])
        self._local_id = f"{advertise_host if advertise_host is not None else host}:{bound_port}"
        self._epoll = select.epoll()
        self._epoll.register(fd_of(self._router), select.EPOLLIN)
        self._waker = Waker()  # wake(): any thread ends a poll() early
        self._epoll.register(self._waker.fileno(), select.EPOLLIN)
        if self._router_monitor is not None:
            self._epoll.register(fd_of(self._router_monitor), select.EPOLLIN)
        self._dealers = Dealers(
            self._ctx, self._epoll, self._local_id.encode("ascii"), heartbeats=heartbeats,
            sndhwm=sndhwm, rcvhwm=rcvhwm, linger_ms=self._dealer_linger,
            immediate=bool(immediate), connect_timeout_ms=connect_timeout_ms, curve=curve,
            source=source, max_peers=self._max_peers, max_pending=self._max_pending)
        self.intake = RouterIntake(
            self._router, self._router_monitor, self._dealers, self._local_id,
            max_batch=max_batch, max_peers=self._max_peers, max_pending=self._max_pending,
            dial_back_check=dial_back_check, holds_session=holds_session,
            any_host=bool(dial_back_any_host), curve=curve, rate=rate, rate_clock=rate_clock)

    # -- properties ---------------------------------------------------------------

    @property
    def local_id(self) -> str:
        """``"host:port"`` of the bound ROUTER; also the identity of every DEALER."""
        return self._local_id

    @property
    def peers(self) -> tuple[str, ...]:
        """Ids of the peers that currently have a DEALER (connected or still dialling)."""
        return tuple(self._dealers.peers)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def drop_counts(self) -> dict[str, int]:
        """How many inbound messages were dropped, by reason (a copy)."""
        return dict(self.intake.drops)

    @property
    def rate_limited(self) -> int:
        """How many frames were dropped so far for a rate: of new identities
        (``max_new_peers_per_s``) and of dial-backs (per identity, per host)."""
        return self.intake.rate_drops

    def is_connected(self, peer_id: str) -> bool:
        """True once the DEALER to ``peer_id`` completed its ZMTP handshake."""
        peer = self._dealers.peers.get(peer_id)
        return peer is not None and peer.connected

    # -- peers --------------------------------------------------------------------

    def connect(self, peer_id: str, server_key: bytes | None = None) -> None:
        """Open the DEALER to ``tcp://peer_id`` (no-op if one is already open).

        Frames sent before TCP is up are queued (unless ``immediate``). With CURVE,
        ``server_key`` is the peer's public key (Z85; default: ``curve.peer_key``, or the
        allow-list's only key). Raises :class:`TransportError` for a malformed id, our
        own id, too many peers, or no server key.
        """
        self._check_open()
        parse_peer_id(peer_id)
        if peer_id == self._local_id:
            raise TransportError("cannot connect to our own local_id")
        known = self._dealers.peers.get(peer_id)
        if known is not None:
            known.dialled_back = False  # ours now: never evicted as a pending dial-back
            return
        if self._dealers.settled() >= self._max_peers:
            raise TransportError(f"peer limit reached ({self._max_peers})")
        if self._curve is not None and server_key is None:
            server_key = self._curve.server_key_for(peer_id)
        self._dealers.open(peer_id, server_key)

    def mark_ready(self, peer_id: str) -> bool:
        """The session with ``peer_id`` completed its handshake: from now on it counts
        against ``max_peers`` instead of the pending budget. False (and a
        :class:`PeerLost` ``"peer limit"`` at the next poll) when ``max_peers`` ready
        peers exist already; True otherwise, and for an unknown id (nothing to do)."""
        self._check_open()
        peer = self._dealers.peers.get(peer_id)
        if peer is None or peer.ready:
            return True
        if (self._max_pending is not None and peer.dialled_back
                and self._dealers.settled() >= self._max_peers):
            self._dealers.lose(peer, "peer limit")
            return False
        peer.ready = True
        peer.done = False
        peer.done_at = None
        return True

    def mark_done(self, peer_id: str) -> None:
        """The session with ``peer_id`` is over. Its DEALER stays (frames still in flight
        either way reach the node), but it no longer holds a slot: it joins the pending
        budget and is the first evicted there. A later connect from it (a restarted
        peer) makes it pending again. Unknown ids are ignored; no-op without
        ``max_pending``."""
        self._check_open()
        peer = self._dealers.peers.get(peer_id)
        if peer is None or self._max_pending is None:
            return
        peer.ready = False
        peer.dialled_back = True
        peer.done = True
        self._dealers.finish_later(peer)

    def remove_peer(self, peer_id: str) -> None:
        """Close the DEALER to ``peer_id`` (lingering up to ``dealer_linger_ms`` to
        flush what was sent). No :class:`PeerLost` is reported. Unknown ids are ignored."""
        self._check_open()
        peer = self._dealers.peers.get(peer_id)
        if peer is not None:
            self._dealers.teardown(peer, self._dealer_linger)

    def answer(self, peer_id: str, frame: bytes) -> bool:
        """Send ``frame`` to a peer whose DEALER was lost while the peer still sends to
        us (a dead session's answer in a one-sided loss): dialled again with the key it
        had (with CURVE, the configured server key once that is forgotten), the frame
        queued, the DEALER closed once flushed (the done grace). False, sending nothing,
        when it cannot be dialled (neither lost lately nor held by the node, limit
        reached, no key)."""
        self._check_open()
        dealers = self._dealers
        if peer_id not in dealers.peers:
            entry = dealers.lost.get(peer_id)
            if ((entry is None and not self.intake.held(peer_id))
                    or dealers.settled() >= self._max_peers):
                return False
            key = None if entry is None else entry[1]
            try:
                if key is None and self._curve is not None:
                    key = self._curve.server_key_for(peer_id)
                peer = dealers.open(peer_id, key, dialled_back=True)
            except TransportError:
                return False
            if entry is not None:
                dealers.lost[peer_id] = entry  # still lost: its frames keep reaching the node
            peer.done = True
            dealers.finish_later(peer)
        return self.send(peer_id, frame)

    # -- I/O ----------------------------------------------------------------------

    def send(self, peer_id: str, frame: bytes) -> bool:
        """Queue one frame to ``peer_id`` without blocking.

        Returns False, and queues a :class:`PeerLost` for the next :meth:`poll`, when
        there is no DEALER for ``peer_id`` or its queue is full or the send fails (the
        DEALER is then closed).
        """
        reason = self.try_send(peer_id, frame)
        if reason is None:
            return True
        self._dealers.pending.append(PeerLost(peer_id, reason))
        return False

    def try_send(self, peer_id: str, frame: bytes) -> str | None:
        """:meth:`send`, the failure told to the caller alone (no :class:`PeerLost`):
        None when queued, else why not (``"not connected"``, ``"send queue full"``,
        ``"send failed: ..."``; the DEALER is then closed)."""
        self._check_open()
        peer = self._dealers.peers.get(peer_id)
        if peer is None:
            return "not connected"
        return self._dealers.send(peer, frame)

    def hold(self, peer_id: str, frame: bytes, tag: object) -> str | None:
        """:meth:`try_send`, the frame written at :meth:`send_held` (or as its DEALER
        closes): frames that leave together wake libzmq's I/O thread once. A later
        failure comes back from :meth:`send_held` with ``tag``."""
        self._check_open()
        peer = self._dealers.peers.get(peer_id)
        if peer is None:
            return "not connected"
        self._dealers.hold(peer, frame, tag)
        return None

    def send_held(self) -> list[tuple[str, str, object]]:
        """Write the held frames; those that failed, as (peer id, why, tag)."""
        return self._dealers.send_held()

    def poll(self, timeout_ms: int) -> list[ControlEvent]:
        """Return what happened, waiting up to ``timeout_ms`` (0: don't wait; < 0: wait
        until something happens) for the first event.

        Frames come out in the order each peer sent them. A :class:`PeerLost` may be
        followed by frames from the same id, which then start a fresh peer.
        """
        self._check_open()
        waker = self._waker
        woken = waker.armed and waker.clear()
        events = self._collect()
        if events or timeout_ms == 0 or woken:
            return events
        end = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        while True:
            wait = 0 if self.intake.more else self._wait_ms(end)
            if wait != 0:
                self._epoll.poll(-1 if wait is None else wait / 1000.0)
            woken = waker.armed and waker.clear()
            events = self._collect()
            if events or woken or (end is not None and time.monotonic() >= end):
                return events

    def wake(self) -> None:
        """End a :meth:`poll` that is waiting (or the next one) at once, with what it
        has; :meth:`fileno` turns readable. Safe from any thread."""
        self._waker.wake()

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
        """Close every socket, the ZAP authenticator and the context. Idempotent; returns
        within about ``dealer_linger_ms`` even when peers are dead or frozen."""
        if self._closed:
            return
        self._closed = True
        try:
            for peer in list(self._dealers.peers.values()):
                self._dealers.teardown(peer, self._dealer_linger)
            self._epoll.unregister(fd_of(self._router))
            if self._router_monitor is not None:
                self._epoll.unregister(fd_of(self._router_monitor))
        finally:
            self._epoll.close()
            self._waker.close()
            self._close_router()

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("control plane is closed")

    def _close_router(self) -> None:
        """ROUTER (its monitor detached first, libzmq#3575), ZAP thread, context."""
        try:
            if self._router_monitor is not None:
                try:
                    self._router.disable_monitor()
                finally:
                    self._router_monitor.close(linger=0)
        finally:
            self._router.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
            self._ctx.term()

    def _collect(self) -> list[ControlEvent]:
        # One list for frames and losses alike, in the order they happened: a loss in the
        # drain (an eviction, a refused dial-back) precedes any later frame of that id.
        dealers = self._dealers
        out = dealers.pending
        self.intake.drain(out)
        if self._router_monitor is not None:
            self.intake.drain_refusals()
        if dealers.peers:  # no DEALER, no monitor to read
            dealers.drain_monitors()
        if dealers.next_expiry is not None:
            dealers.expire_due()
        dealers.pending = []
        return out

    def _wait_ms(self, end: float | None) -> int | None:
        first = self._dealers.next_due()
        if end is not None and (first is None or end < first):
            first = end
        if first is None:
            return None
        return max(0, math.ceil((first - time.monotonic()) * 1000.0))
