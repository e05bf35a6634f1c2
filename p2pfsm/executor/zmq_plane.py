"""ZeroMQ control plane: one bound ROUTER that only receives, one DEALER per peer that only sends.

This is the socket pattern of vLLM 0.33.0's P2P tier
(``vllm/v1/kv_offload/tiering/p2p/control/zmq.py``). A node binds a
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

Hardening a node turns on (the raw pattern, the default here, dials back on any frame):

* ``dial_back_check``: a frame from an identity with no DEALER is dialled back only when
  the check accepts it (the node passes
  :func:`~p2pfsm.executor.admission.is_connect_from`: a well-formed connect whose
  ``peer_id`` is the identity); anything else is dropped, counted as
  ``"not a connect"`` and logged at debug (rate-limited). One stray frame can no longer
  make the node dial a third party.
* the dial-back goes only to the host the connection came from (each message's
  ``Peer-Address``): an identity naming another host (or a host name) is dropped as
  ``"address mismatch"`` unless ``dial_back_any_host`` (peers behind NAT). Our own
  DEALERs connect from our bind address when it is a specific IP, so our connections
  come from the host our identity names.
* ``max_pending``: dial-backs whose session is not ready yet (:meth:`ControlPlane.
  mark_ready` not called) have a budget of their own; when it is full one is evicted
  (``PeerLost(reason="evicted: too many unfinished handshakes")``): a session already
  over, else one of the host (the connection's address) holding the most pending
  dial-backs, the newcomer's own host on a tie, preferring one whose ZMTP handshake has
  not succeeded, oldest first. A flood from one host thus only evicts its own, and
  inside a host a dial-back that came up outlives those that did not. Ready peers and
  our own dials count against ``max_peers``, so identities that never finish a
  handshake cannot lock a legitimate peer out.
* ``max_new_peers_per_s``: each source host (the connection's address, as for
  ``max_pending``) may have at most that many new identities admitted a second, with a
  burst of as many (:class:`NewPeerRate`). Past it the frame of a new identity is dropped
  at the door like one past ``max_peers`` (no dial-back, nothing kept for the identity),
  counted as ``"new identity rate"`` and logged at warning (one line per 10 s). Only
  an identity about to be dialled back is charged: frames of known peers, our own
  dials and a lately lost peer coming back never are, nor is a frame dropped for
  another reason. Per host, so a flood from one host never stops another's newcomers.
* ``curve``: ZeroMQ CURVE on every socket with an allow-list of client keys enforced by
  a ZAP authenticator on our context: an unknown key or no key at all (NULL security)
  is refused during the ZMTP handshake, before any frame is delivered, and logged on
  ``p2pfsm.zmq``. A dial-back uses the key the peer authenticated with (ZAP User-Id).

Liveness: ZMTP heartbeats (each DEALER PINGs every ``heartbeat_ivl_ms`` and drops its
connection after ``heartbeat_timeout_ms`` of silence; the ROUTER drops an inbound
connection whose PINGs stop for their TTL, and PINGs itself only 6 times as rarely, for
peers that send none) make libzmq drop the TCP connection of a frozen peer;
a killed peer's kernel closes it at once. Either way the DEALER's monitor reports
``EVENT_DISCONNECTED`` and :meth:`ControlPlane.poll` turns it into one :class:`PeerLost`;
the peer's sockets are then torn down, so a later frame from the same id starts afresh.

Nothing here sleeps: :meth:`ControlPlane.poll` waits in ``zmq_poll`` with a timeout, and
:meth:`ControlPlane.fileno` gives an event loop one descriptor to wait on instead.
Not thread-safe: use one ControlPlane from one thread.
"""

from __future__ import annotations

import itertools
import logging
import math
import select
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeAlias

import zmq

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.admission import EVICTED, NewPeerRate, check_int, eviction_victim
from p2pfsm.executor.curve import CurveKeys, Gatekeeper, refusal_of, router_refusals
from p2pfsm.executor.monitors import (
    DEALER_MASK,
    EV_CLOSED,
    EV_CONNECT_RETRIED,
    EV_CONNECTED,
    EV_DISCONNECTED,
    EV_HANDSHAKE_FAILED,
    EV_HANDSHAKE_OK,
    HANDSHAKE_FAILURES_MASK,
    connected_to_itself,
    fd_of,
    monitor_events,
)
from p2pfsm.executor.peer_ids import ip_of, origin_of, parse_peer_id
from p2pfsm.executor.waker import Waker
from p2pfsm.logwindow import LogWindow

__all__ = [
    "EVICTED",
    "RATE_LIMITED",
    "ControlEvent",
    "ControlPlane",
    "FrameIn",
    "PeerLost",
    "frame_meta",
]

log = logging.getLogger("p2pfsm.zmq")


@dataclass(frozen=True, slots=True)
class FrameIn:
    """One control frame received from ``peer_id`` (its routing id, i.e. its local_id) on
    connection ``conn`` (the descriptor libzmq read it from; -1 when unknown)."""

    peer_id: str
    frame: bytes
    conn: int = field(default=-1, compare=False)


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

RATE_LIMITED: Final = "new identity rate"
""":attr:`ControlPlane.drop_counts` reason of a new identity refused by the
``max_new_peers_per_s`` rate limit."""

_MAX_HEARTBEAT_TTL_MS: Final = 6_553_599  # ZMTP carries the TTL in deciseconds, 16 bits.
_ROUTER_PING_FACTOR: Final = 6  # the ROUTER's own PINGs, in DEALER heartbeat intervals
_MAX_HEARTBEAT_IVL_MS: Final = 2**31 - 1
_DONE_GRACE_S: Final = 5.0
"""How long the DEALER of a peer whose session is over stays open (its last frames, e.g.
a disconnect, go out meanwhile) before it is closed and its descriptors freed."""
_LOST_KEEP_S: Final = 60.0
"""How long a lost peer's id is remembered: its frames (a peer that still holds its
session live, a one-sided loss) still reach the node, whose dead session answers them."""
_LISTEN_BACKLOG: Final = 1024
_POLLIN: Final = int(zmq.POLLIN)  # plain ints: enum arithmetic costs on every turn
_EVENTS: Final = int(zmq.EVENTS)
_SWEEP_S: Final = 1.0
"""Every monitor is looked at this often even when its descriptor did not signal (a
safety net under the edge-triggered ZMQ_FD); otherwise only signalled ones are, so an
idle turn costs the same with 1 peer or 128."""
_DROP_LOG_BURST: Final = 10
_DROP_LOG_WINDOW_S: Final = 10.0

_monitor_serial = itertools.count()


def _conn_of(message: zmq.Frame) -> int:
    """The descriptor of the connection ``message`` came on (-1 when libzmq cannot say)."""
    try:
        return int(message.get(zmq.SRCFD))
    except (zmq.ZMQError, TypeError, ValueError):
        return -1


def frame_meta(frame: zmq.Frame, name: str) -> str | None:
    """A message's ZeroMQ metadata property ``name`` (``Peer-Address``, ``User-Id``), or
    None when libzmq has none or it is not text."""
    try:
        value = frame.get(name)
    except (zmq.ZMQError, UnicodeDecodeError):
        return None
    return value if isinstance(value, str) else None


@dataclass(eq=False)
class _Peer:
    peer_id: str
    dealer: zmq.Socket[bytes]
    monitor: zmq.Socket[bytes]
    deadline: float | None  # time.monotonic() by which the handshake must succeed
    connected: bool = False
    reached: bool = False  # a TCP connection came up (and went) before the handshake
    dialled_back: bool = False  # opened for an unknown identity, not by connect()
    ready: bool = False  # the node said its session is ready (mark_ready)
    done: bool = False  # the node said its session is over (mark_done): evicted first
    done_at: float | None = None  # when mark_done came; closed _DONE_GRACE_S later
    server_key: bytes | None = None  # CURVE: the key it was dialled with
    origin: str = ""  # the host it counts against in the pending budget (origin_of)


class ControlPlane:
    """A node's control-frame transport: bound ROUTER in, one DEALER per peer out.

    Args:
        bind: ``"tcp://HOST:PORT"``; port 0 picks a free port.
        heartbeat_ivl_ms, heartbeat_timeout_ms, heartbeat_ttl_ms: ZMTP heartbeats sent
            by every DEALER (vLLM: 2000/10000/10000, on both its sockets). A peer
            silent for the timeout is dropped by libzmq and reported as
            :class:`PeerLost`. The ROUTER PINGs 6 times as rarely (see
            ``_set_heartbeats``).
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
            :func:`~p2pfsm.executor.admission.is_connect_from`.
        dial_back_any_host: dial back whatever host the identity names. Off by
            default: only an identity whose host is the IP the connection came from.
        max_pending: the budget of dial-backs not yet :meth:`mark_ready` (when full,
            one is evicted for a new one: see ``_make_room``); ready peers and our own
            dials count against ``max_peers``. None: every peer counts against
            ``max_peers``, no eviction.
        curve: CURVE keys (:func:`load_curve_keys`); None: NULL security (vLLM's).
        max_new_peers_per_s: new identities admitted per source host and second (a
            burst of as many at once); past it their frames are dropped. None: no limit.
        rate_clock: the clock of that limit (seconds, monotonic); tests pass their own.
        holds_session: ``holds(peer_id)``: the node still holds a session of that id
            which is over. Its peer's frames from the host the id names reach the node
            without a dial-back (which :meth:`answer` may then make), however long ago
            the connection was lost; None: only for ``_LOST_KEEP_S`` after the loss.
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
        self._hb_ivl = check_int("heartbeat_ivl_ms", heartbeat_ivl_ms, 0)
        self._hb_timeout = check_int("heartbeat_timeout_ms", heartbeat_timeout_ms, 0)
        self._hb_ttl = check_int("heartbeat_ttl_ms", heartbeat_ttl_ms, 0, _MAX_HEARTBEAT_TTL_MS)
        self._sndhwm = check_int("sndhwm", sndhwm, 0)
        self._rcvhwm = check_int("rcvhwm", rcvhwm, 0)
        self._dealer_linger = check_int("dealer_linger_ms", dealer_linger_ms, 0)
        self._max_peers = check_int("max_peers", max_peers, 1)
        self._connect_timeout = check_int("connect_timeout_ms", connect_timeout_ms, 1)
        self._max_msg_size = check_int("max_msg_size", max_msg_size, 1)
        self._max_batch = check_int("max_batch", max_batch, 1)
        self._immediate = bool(immediate)
        self._max_pending = None if max_pending is None else check_int(
            "max_pending", max_pending, 1)
        self._rate = None if max_new_peers_per_s is None else NewPeerRate(max_new_peers_per_s)
        if not callable(rate_clock):
            raise ConfigError(f"rate_clock must be callable, got {rate_clock!r}")
        self._rate_clock = rate_clock
        self._rate_log = LogWindow(1, _DROP_LOG_WINDOW_S)  # rate-limited warnings
        if curve is not None and not isinstance(curve, CurveKeys):
            raise ConfigError(f"curve must be CurveKeys, got {curve!r}")
        self._curve = curve
        self._dial_back_check = dial_back_check
        self._holds_session = holds_session
        self._any_host = bool(dial_back_any_host)
        # Our DEALERs connect from the bind address when it is one specific IP, so the
        # peer sees our connection come from the host our identity names.
        bind_ip = ip_of(host)
        self._source = host if bind_ip is not None and not bind_ip.is_unspecified else None

        self._peers: dict[str, _Peer] = {}
        self._lost: OrderedDict[str, tuple[float, bytes | None]] = OrderedDict()  # id -> when, key
        self._peer_by_ident: dict[bytes, str] = {}
        self._pending: list[ControlEvent] = []
        self._drops: dict[str, int] = {}
        self._drop_log = LogWindow(_DROP_LOG_BURST, _DROP_LOG_WINDOW_S)  # debug lines
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
                addr = f"inproc://p2pfsm-router-monitor-{id(self):x}-{next(_monitor_serial)}"
                self._router.monitor(addr, HANDSHAKE_FAILURES_MASK)
                self._router_monitor = self._ctx.socket(zmq.PAIR)
                self._router_monitor.setsockopt(zmq.LINGER, 0)
                self._router_monitor.connect(addr)
            self._set_heartbeats(self._router, _ROUTER_PING_FACTOR)
            self._router.setsockopt(zmq.RCVHWM, self._rcvhwm)
            self._router.setsockopt(zmq.MAXMSGSIZE, self._max_msg_size)
            # A restarted peer may present its id while its old connection still looks
            # open (a host gone silent: no FIN): the new connection takes the id over.
            # Any connection can present any id, so every frame says which connection
            # it came on (FrameIn.conn) and the node binds each session to its own: a
            # frame on another connection reaches it only as a fresh connect.
            self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)
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
        self._identity = self._local_id.encode("ascii")

        self._epoll = select.epoll()
        self._epoll.register(fd_of(self._router), select.EPOLLIN)
        self._waker = Waker()  # wake(): any thread ends a poll() early
        self._epoll.register(self._waker.fileno(), select.EPOLLIN)
        if self._router_monitor is not None:
            self._epoll.register(fd_of(self._router_monitor), select.EPOLLIN)
        self._by_fd: dict[int, _Peer] = {}  # monitor descriptor -> its peer
        self._router_more = False  # the last drain stopped at max_batch
        self._next_expiry: float | None = None  # earliest connect deadline or done grace
        self._next_sweep = 0.0
        self._look: list[_Peer] = []

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

    @property
    def rate_limited(self) -> int:
        """How many frames of new identities ``max_new_peers_per_s`` dropped so far."""
        return self._drops.get(RATE_LIMITED, 0)

    def is_connected(self, peer_id: str) -> bool:
        """True once the DEALER to ``peer_id`` completed its ZMTP handshake."""
        peer = self._peers.get(peer_id)
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
        known = self._peers.get(peer_id)
        if known is not None:
            known.dialled_back = False  # ours now: never evicted as a pending dial-back
            return
        if self._settled() >= self._max_peers:
            raise TransportError(f"peer limit reached ({self._max_peers})")
        if self._curve is not None and server_key is None:
            server_key = self._curve.server_key_for(peer_id)
        self._open_peer(peer_id, server_key)

    def mark_ready(self, peer_id: str) -> bool:
        """The session with ``peer_id`` completed its handshake: from now on it counts
        against ``max_peers`` instead of the pending budget. False (and a
        :class:`PeerLost` ``"peer limit"`` at the next poll) when ``max_peers`` ready
        peers exist already; True otherwise, and for an unknown id (nothing to do)."""
        self._check_open()
        peer = self._peers.get(peer_id)
        if peer is None or peer.ready:
            return True
        if (self._max_pending is not None and peer.dialled_back
                and self._settled() >= self._max_peers):
            self._lose(peer, "peer limit")
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
        peer = self._peers.get(peer_id)
        if peer is None or self._max_pending is None:
            return
        peer.ready = False
        peer.dialled_back = True
        peer.done = True
        peer.done_at = time.monotonic()
        self._note_expiry(peer.done_at + _DONE_GRACE_S)

    def remove_peer(self, peer_id: str) -> None:
        """Close the DEALER to ``peer_id`` (lingering up to ``dealer_linger_ms`` to
        flush what was sent). No :class:`PeerLost` is reported. Unknown ids are ignored."""
        self._check_open()
        peer = self._peers.get(peer_id)
        if peer is not None:
            self._teardown(peer, self._dealer_linger)

    def answer(self, peer_id: str, frame: bytes) -> bool:
        """Send ``frame`` to a peer whose DEALER was lost while the peer still sends to
        us (a dead session's answer in a one-sided loss): dialled again with the key it
        had (with CURVE, the configured server key once that is forgotten), the frame
        queued, the DEALER closed once flushed (the done grace). False, sending nothing,
        when it cannot be dialled (neither lost lately nor held by the node, limit
        reached, no key)."""
        self._check_open()
        if peer_id not in self._peers:
            entry = self._lost.get(peer_id)
            if (entry is None and not self._held(peer_id)) or self._settled() >= self._max_peers:
                return False
            key = None if entry is None else entry[1]
            try:
                if key is None and self._curve is not None:
                    key = self._curve.server_key_for(peer_id)
                peer = self._open_peer(peer_id, key, dialled_back=True)
            except TransportError:
                return False
            if entry is not None:
                self._lost[peer_id] = entry  # still lost: its frames keep reaching the node
            peer.done = True
            peer.done_at = time.monotonic()
            self._note_expiry(peer.done_at + _DONE_GRACE_S)
        return self.send(peer_id, frame)

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
        woken = self._waker.clear()
        events = self._collect()
        if events or timeout_ms == 0 or woken:
            return events
        end = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        while True:
            wait = 0 if self._router_more else self._wait_ms(end)
            if wait != 0:
                self._epoll.poll(-1 if wait is None else wait / 1000.0)
            woken = self._waker.clear()
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
            for peer in list(self._peers.values()):
                self._teardown(peer, self._dealer_linger)
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

    def _settled(self) -> int:
        """Peers counted against ``max_peers``: all of them without a pending budget,
        else the ready ones and our own dials."""
        if self._max_pending is None:
            return len(self._peers)
        return sum(1 for p in self._peers.values() if p.ready or not p.dialled_back)

    def _set_heartbeats(self, sock: zmq.Socket[bytes], every: int = 1) -> None:
        """ZMTP heartbeats on ``sock``: a PING every ``every`` heartbeat intervals.

        A DEALER pings at the interval. The ROUTER pings ``_ROUTER_PING_FACTOR`` times as
        rarely: each inbound connection is already pinged by the DEALER at its other end
        (ours and vLLM's set a TTL, which libzmq enforces here: silence past it drops the
        connection), and libzmq answers every PING with a PONG whatever these options
        say. The ROUTER's own rare PING covers a peer that sends none: one whose DEALER
        sets no heartbeats, or one frozen before its first PING (no TTL armed yet)."""
        sock.setsockopt(zmq.HEARTBEAT_IVL, min(self._hb_ivl * every, _MAX_HEARTBEAT_IVL_MS))
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self._hb_timeout)
        sock.setsockopt(zmq.HEARTBEAT_TTL, self._hb_ttl)

    def _open_peer(self, peer_id: str, server_key: bytes | None,
                   dialled_back: bool = False, origin: str | None = None) -> _Peer:
        """A DEALER to ``peer_id``; ``origin``: the host it is charged to in the pending
        budget (:func:`~p2pfsm.executor.peer_ids.origin_of`; None: the host its id names, as for
        our own dials)."""
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
            if self._curve is not None:
                if server_key is None:
                    raise TransportError(f"no CURVE server key for {peer_id}")
                dealer.setsockopt(zmq.CURVE_PUBLICKEY, self._curve.public)
                dealer.setsockopt(zmq.CURVE_SECRETKEY, self._curve.secret)
                dealer.setsockopt(zmq.CURVE_SERVERKEY, server_key)
            addr = f"inproc://p2pfsm-monitor-{id(self):x}-{next(_monitor_serial)}"
            dealer.monitor(addr, DEALER_MASK)
            monitoring = True
            monitor = self._ctx.socket(zmq.PAIR)
            monitor.setsockopt(zmq.LINGER, 0)
            monitor.connect(addr)
            bind_from = "" if self._source is None else f"{self._source}:0;"
            dealer.connect(f"tcp://{bind_from}{peer_id}")
        except (zmq.ZMQError, TransportError) as exc:
            if monitoring:
                dealer.disable_monitor()
            if monitor is not None:
                monitor.close(linger=0)
            dealer.close(linger=0)
            if isinstance(exc, TransportError):
                raise
            raise TransportError(f"cannot open DEALER to {peer_id}: {exc}") from exc
        deadline = time.monotonic() + self._connect_timeout / 1000.0
        peer = _Peer(peer_id, dealer, monitor, deadline, dialled_back=dialled_back,
                     server_key=server_key,
                     origin=origin if origin is not None
                     else origin_of(peer_id.rpartition(":")[0], None))
        self._peers[peer_id] = peer
        self._lost.pop(peer_id, None)
        fd = fd_of(monitor)
        self._by_fd[fd] = peer
        self._epoll.register(fd, select.EPOLLIN)
        self._note_expiry(deadline)
        self._look.append(peer)  # opening it ran its commands: look once without a signal
        return peer

    def _teardown(self, peer: _Peer, linger_ms: int) -> None:
        # Order matters (libzmq#3575): stop the DEALER's monitor before closing the
        # PAIR that reads it, so the DEALER never writes into a dead monitor pipe.
        self._peers.pop(peer.peer_id, None)
        self._peer_by_ident.pop(peer.peer_id.encode("ascii"), None)
        fd = fd_of(peer.monitor)
        if self._by_fd.get(fd) is peer:
            del self._by_fd[fd]
        self._epoll.unregister(fd)
        try:
            peer.dealer.disable_monitor()
        finally:
            peer.monitor.close(linger=0)
            peer.dealer.close(linger=linger_ms)

    def _lose(self, peer: _Peer, reason: str) -> None:
        self._teardown(peer, 0)
        self._pending.append(PeerLost(peer.peer_id, reason))
        self._lost[peer.peer_id] = (time.monotonic(), peer.server_key)
        self._lost.move_to_end(peer.peer_id)
        while len(self._lost) > self._max_peers:
            self._lost.popitem(last=False)

    def _held(self, peer_id: str) -> bool:
        """The node still holds a session of ``peer_id`` that is over (``holds_session``)."""
        return self._holds_session is not None and self._holds_session(peer_id)

    def _lost_from(self, peer_id: str, host: str, message: zmq.Frame) -> bool:
        """``peer_id`` was lost lately, or the node still holds its session that is over,
        and this message comes from its host."""
        if not self._remembered(peer_id) and not self._held(peer_id):
            return False
        source = frame_meta(message, "Peer-Address")
        return self._any_host or (source is not None and ip_of(host) == ip_of(source)
                                  and ip_of(host) is not None)

    def _drop(self, reason: str, detail: str = "") -> None:
        self._drops[reason] = self._drops.get(reason, 0) + 1
        if log.isEnabledFor(logging.DEBUG):
            self._drop_log.emit(log.debug, "dropped inbound messages",
                                "dropped an inbound message: %s%s", reason, detail)

    def _collect(self) -> list[ControlEvent]:
        # One list for frames and losses alike, so they come out in the order they
        # happened: a loss inside the drain (an eviction, or a refused dial-back seen
        # while making room) precedes any later frame from the same id.
        out = self._pending
        self._drain_router(out)
        self._drain_router_monitor()
        self._drain_monitors()
        now = time.monotonic()
        if self._next_expiry is not None and now >= self._next_expiry:
            self._expire(now)
        self._pending = []
        return out

    def _drain_router(self, out: list[ControlEvent]) -> None:
        self._router_more = True  # until it is seen empty
        for _ in range(self._max_batch):
            # Checking EVENTS first avoids raising zmq.Again on every empty poll.
            if not int(self._router.getsockopt(_EVENTS)) & _POLLIN:
                self._router_more = False
                return
            try:
                parts = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._router_more = False
                return
            if len(parts) != 2:
                self._drop("frame count")
                continue
            ident, frame = parts[0].bytes, parts[1].bytes
            peer_id = self._admit(ident, frame, parts[1])
            if peer_id is not None:
                out.append(FrameIn(peer_id, frame, _conn_of(parts[1])))

    def _admit(self, ident: bytes, frame: bytes, message: zmq.Frame) -> str | None:
        """The peer id for a routing id, dialling back unknown ones; None = drop."""
        known = self._peer_by_ident.get(ident)
        if known is not None and known in self._peers:
            peer = self._peers[known]
            if peer.done and (self._dial_back_check is None
                              or self._dial_back_check(known, frame)):
                peer.done = False  # a restarted peer: pending again, not first to go
                peer.done_at = None
            return known
        try:
            host, _port = parse_peer_id(ident)
        except TransportError:
            self._drop("bad identity")
            return None
        peer_id = ident.decode("ascii")
        if peer_id in self._peers:
            self._peer_by_ident[ident] = peer_id
            return self._admit(ident, frame, message)  # known now (done grace, as above)
        if peer_id == self._local_id:
            self._drop("own identity")
            return None
        if self._dial_back_check is not None and not self._dial_back_check(peer_id, frame):
            if self._lost_from(peer_id, host, message):
                return peer_id  # no dial-back: the node's dead session may answer()
            self._drop("not a connect", f" from unknown identity {peer_id}")
            return None
        source = frame_meta(message, "Peer-Address")
        if not self._any_host:
            ip = ip_of(host)
            if ip is None or source is None or ip != ip_of(source):
                self._drop("address mismatch",
                           f": identity {peer_id} came from {source or 'an unknown address'}")
                return None
        server_key = None
        if self._curve is not None:
            user = frame_meta(message, "User-Id")
            server_key = None if user is None else user.encode("ascii", "replace")
            if server_key not in self._curve.allow:
                self._drop("no authenticated key", f": {peer_id} from {source}")
                return None
        if self._settled() >= self._max_peers:
            self._drop("peer limit", f": {peer_id}")
            return None
        origin = origin_of(host, source)
        rate = self._rate
        if rate is not None and not self._remembered(peer_id):
            now = self._rate_clock()
            if not rate.take(origin, now):
                self._refuse_rate(peer_id, origin, now)
                return None
        else:
            rate = None  # nothing charged: nothing to give back
        if self._max_pending is not None:
            self._make_room(origin)
        try:
            self._open_peer(peer_id, server_key, dialled_back=True, origin=origin)
        except TransportError:
            if rate is not None:
                rate.refund(origin)
            self._drop("dial-back failed", f": {peer_id}")
            return None
        self._peer_by_ident[ident] = peer_id
        return peer_id

    def _remembered(self, peer_id: str) -> bool:
        """``peer_id`` was a peer of ours lost lately (a peer coming back, not a new one);
        one lost longer ago than ``_LOST_KEEP_S`` is forgotten here."""
        entry = self._lost.get(peer_id)
        if entry is None:
            return False
        if time.monotonic() - entry[0] >= _LOST_KEEP_S:
            del self._lost[peer_id]
            return False
        return True

    def _refuse_rate(self, peer_id: str, origin: str, now: float) -> None:
        """Drop a new identity past ``max_new_peers_per_s``: counted, and logged at
        warning at most once per ``_DROP_LOG_WINDOW_S`` (with how many were left out)."""
        self._drop(RATE_LIMITED, f": {peer_id} from {origin}")
        assert self._rate is not None
        self._rate_log.emit(log.warning, "new identities past the rate",
                            "new identities past %d a second from one host: dropped %s "
                            "from %s", self._rate.rate, peer_id, origin, now=now)

    def _unfinished(self) -> list[_Peer]:
        """The dial-backs in the pending budget, oldest first."""
        return [p for p in self._peers.values() if p.dialled_back and not p.ready]

    def _make_room(self, origin: str) -> None:
        """Free a slot of the pending budget, if it is full, for a dial-back to ``origin``
        (the victim: :func:`~p2pfsm.executor.admission.eviction_victim`).

        What we know of each pending dial-back is brought up to date first (a refused
        one is gone, a finished ZMTP handshake is seen): inside one drain of the ROUTER
        nothing else would read the monitors, and a burst of connects whose dial-backs
        are refused at once would otherwise push out a dial-back that is coming up."""
        assert self._max_pending is not None
        pending = self._unfinished()
        if len(pending) < self._max_pending:
            return
        self._drain_monitors()
        pending = self._unfinished()
        if len(pending) < self._max_pending:
            return
        victim = eviction_victim(pending, origin)
        log.info("evicting %s (from %s): %d dial-backs without a finished handshake",
                 victim.peer_id, victim.origin, len(pending))
        self._lose(victim, EVICTED)

    def _drain_router_monitor(self) -> None:
        """Count the handshakes our ROUTER refused (CURVE only; logged by
        :func:`~p2pfsm.executor.curve.router_refusals`)."""
        if self._router_monitor is not None:
            for reason in router_refusals(self._router_monitor, self._local_id,
                                          self._max_batch):
                self._drop(reason)

    def _drain_monitors(self) -> None:
        """Drain the monitors whose descriptor signalled (all of them once a sweep)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + _SWEEP_S
            chosen = list(self._peers.values())
        else:
            by_fd = self._by_fd
            chosen = [by_fd[fd] for fd, _ in self._epoll.poll(0) if fd in by_fd]
            if self._look:
                chosen.extend(self._look)
        self._look = []
        for peer in chosen:
            if self._peers.get(peer.peer_id) is not peer:
                continue
            for event, value, _ in monitor_events(peer.monitor):
                self._on_monitor_event(peer, event, value)
                if self._peers.get(peer.peer_id) is not peer:
                    break

    def _on_monitor_event(self, peer: _Peer, event: int, value: int) -> None:
        """What a DEALER's monitor event means for its peer."""
        if event == EV_CONNECTED:
            if connected_to_itself(value):
                self._lose(peer, "connection refused")
        elif event == EV_HANDSHAKE_OK:
            peer.connected = True
            peer.deadline = None
        elif event in EV_HANDSHAKE_FAILED:
            if self._curve is not None:
                log.warning("%s refused our connection: %s", peer.peer_id,
                            refusal_of(event, value))
            self._lose(peer, "handshake failed")
        elif peer.connected and event == EV_DISCONNECTED:
            self._lose(peer, "disconnected")
        elif peer.connected and event == EV_CLOSED:
            self._lose(peer, "closed")
        elif not peer.connected and event == EV_DISCONNECTED:
            peer.reached = True
        elif not peer.connected and event == EV_CONNECT_RETRIED:
            # libzmq failed a connect attempt and would retry. With no TCP connection
            # made (no DISCONNECTED before: just CLOSED), the connect itself failed: on
            # an address nobody listens on, at once.
            self._lose(peer, "connection closed before handshake" if peer.reached
                       else "connection refused")
        # Before the first handshake, CLOSED is the socket of a failed attempt.

    def _note_expiry(self, when: float) -> None:
        if self._next_expiry is None or when < self._next_expiry:
            self._next_expiry = when

    def _expire(self, now: float) -> None:
        """Connect timeouts and done graces that are due (run only when one may be), and
        the next one's time."""
        self._next_expiry = None
        for peer in list(self._peers.values()):
            if peer.deadline is not None:
                if now >= peer.deadline:
                    self._lose(peer, "connect timeout")
                    continue
                self._note_expiry(peer.deadline)
            if peer.done_at is not None:
                if now >= peer.done_at + _DONE_GRACE_S:
                    self._teardown(peer, self._dealer_linger)  # over: free its descriptors
                else:
                    self._note_expiry(peer.done_at + _DONE_GRACE_S)

    def _wait_ms(self, end: float | None) -> int | None:
        first = self._next_expiry
        if self._peers and (first is None or self._next_sweep < first):
            first = self._next_sweep
        if end is not None and (first is None or end < first):
            first = end
        if first is None:
            return None
        return max(0, math.ceil((first - time.monotonic()) * 1000.0))
