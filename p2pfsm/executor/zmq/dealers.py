"""A control plane's outbound side: one DEALER per peer, its monitor, and its end.

Each DEALER's identity is our ``local_id``; it connects to the peer's ROUTER (from our
bind address when that is one specific IP, so our connection comes from the host our
identity names) and only sends. What its socket monitor reports decides the peer's fate:

* a DEALER whose TCP connect fails (refused: nobody listens there) is given up at once
  with ``"connection refused"``, and one that never completes its ZMTP handshake after
  ``connect_timeout_ms`` with ``"connect timeout"``;
* once connected, ``EVENT_DISCONNECTED`` (a killed peer's kernel closed it, or ZMTP
  heartbeats found it frozen) or ``EVENT_CLOSED`` loses it;
* the monitor is always detached with ``disable_monitor()`` before its PAIR socket is
  closed (libzmq#3575: closing the PAIR first can wedge the I/O thread and with it the
  whole context), and it only subscribes to the handful of events acted on, so an
  unread monitor pipe cannot fill up.

A lost peer is reported once (:class:`~p2pfsm.executor.zmq.events.PeerLost`, queued
in :attr:`Dealers.pending`) and its sockets are torn down, so a later frame from the
same id starts afresh; its id is remembered for ``_LOST_KEEP_S``. The pending budget
(``max_pending``): dial-backs whose session is not ready, one evicted when it is full
(:meth:`Dealers.make_room`). Monitors are read only when their descriptor signals on the
plane's epoll set, and all of them once a ``_SWEEP_S``.
"""

from __future__ import annotations

import itertools
import logging
import select
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

import zmq

from p2pfsm.errors import TransportError
from p2pfsm.executor.fds import require_headroom
from p2pfsm.executor.zmq.admission import EVICTED, eviction_victim
from p2pfsm.executor.zmq.curve import CurveKeys, handshake_cause
from p2pfsm.executor.zmq.events import ControlEvent, PeerLost
from p2pfsm.executor.zmq.heartbeats import Heartbeats
from p2pfsm.executor.zmq.monitors import (
    DEALER_MASK,
    EV_CLOSED,
    EV_CONNECT_RETRIED,
    EV_CONNECTED,
    EV_DISCONNECTED,
    EV_HANDSHAKE_FAILED,
    EV_HANDSHAKE_OK,
    connected_to_itself,
    fd_of,
    monitor_events,
)
from p2pfsm.executor.zmq.peer_ids import origin_of
from p2pfsm.logwindow import LogWindow

__all__ = ["DONE_GRACE_S", "Dealer", "Dealers"]

log = logging.getLogger("p2pfsm.zmq")

DONE_GRACE_S: Final = 5.0
"""How long the DEALER of a peer whose session is over stays open (its last frames, e.g.
a disconnect, go out meanwhile) before it is closed and its descriptors freed."""
_LOST_KEEP_S: Final = 60.0
"""How long a lost peer's id is remembered: its frames (a peer that still holds its
session live, a one-sided loss) still reach the node, whose dead session answers them."""
_SWEEP_S: Final = 1.0
"""Every monitor is looked at this often even when its descriptor did not signal (a
safety net under the edge-triggered ZMQ_FD); otherwise only signalled ones are, so an
idle turn costs the same with 1 peer or 128."""

HOLD_MAX: Final = 32
"""The most frames a DEALER holds (:meth:`Dealers.hold`); at most a quarter of its HWM."""

_monitor_serial = itertools.count()


@dataclass(eq=False)
class Dealer:
    """One peer's DEALER, its monitor, and what the control plane knows of the peer."""

    peer_id: str
    dealer: zmq.Socket[bytes]
    monitor: zmq.Socket[bytes]
    deadline: float | None  # time.monotonic() by which the handshake must succeed
    connected: bool = False
    reached: bool = False  # a TCP connection came up (and went) before the handshake
    dialled_back: bool = False  # opened for an unknown identity, not by connect()
    ready: bool = False  # the node said its session is ready (mark_ready)
    done: bool = False  # the node said its session is over (mark_done): evicted first
    done_at: float | None = None  # when mark_done came; closed DONE_GRACE_S later
    server_key: bytes | None = None  # CURVE: the key it was dialled with
    origin: str = ""  # the host it counts against in the pending budget (origin_of)
    conn: int = -1  # the inbound connection its frames last came on (router_intake)
    source: str | None = None  # the IP that connection came from
    held: list[tuple[bytes, object]] = field(default_factory=list)  # frames, their tags


class Dealers:
    """The DEALERs of one control plane, by peer id, and the peers lost lately.

    ``ctx`` and ``epoll`` are the plane's (each monitor's descriptor joins the epoll
    set); ``identity`` is our ``local_id``; ``source`` the IP our DEALERs connect from
    (None: any). ``max_peers`` bounds the lost ids remembered and, with ``max_pending``
    (None: no pending budget), :meth:`settled`.
    """

    def __init__(
        self, ctx: zmq.Context[zmq.Socket[bytes]], epoll: select.epoll, identity: bytes, *,
        heartbeats: Heartbeats, sndhwm: int, rcvhwm: int, linger_ms: int, immediate: bool,
        connect_timeout_ms: int, curve: CurveKeys | None, source: str | None,
        max_peers: int, max_pending: int | None,
    ) -> None:
        self._ctx = ctx
        self._epoll = epoll
        self._identity = identity
        self._heartbeats = heartbeats
        self._sndhwm = sndhwm
        self._rcvhwm = rcvhwm
        self._linger_ms = linger_ms
        self._immediate = immediate
        self._connect_timeout = connect_timeout_ms
        self._curve = curve
        self._source = source
        self._max_peers = max_peers
        self._max_pending = max_pending
        self.peers: dict[str, Dealer] = {}
        self.lost: OrderedDict[str, tuple[float, bytes | None]] = OrderedDict()  # id -> when, key
        self.by_ident: dict[bytes, str] = {}
        self.pending: list[ControlEvent] = []  # losses (and frames) not yet reported
        self._by_fd: dict[int, Dealer] = {}  # monitor descriptor -> its peer
        self.next_expiry: float | None = None
        """The earliest connect deadline or done grace (None: none; read it, and call
        :meth:`expire_due` only when it is set)."""
        self._next_sweep = 0.0
        self._look: list[Dealer] = []
        self._evict_log = LogWindow(10, 10.0)
        self.holding: list[Dealer] = []  # the DEALERs with held frames
        self.hold_max = HOLD_MAX if sndhwm == 0 else max(1, min(HOLD_MAX, sndhwm // 4))
        self._held_failures: list[tuple[str, str, object]] = []

    def settled(self) -> int:
        """Peers counted against ``max_peers``: all of them without a pending budget,
        else the ready ones and our own dials."""
        if self._max_pending is None:
            return len(self.peers)
        return sum(1 for p in self.peers.values() if p.ready or not p.dialled_back)

    def open(self, peer_id: str, server_key: bytes | None,
             dialled_back: bool = False, origin: str | None = None) -> Dealer:
        """A DEALER to ``peer_id``; ``origin``: the host it is charged to in the pending
        budget (:func:`~p2pfsm.executor.zmq.peer_ids.origin_of`; None: the host its id names, as for
        our own dials). :class:`TransportError` when fewer descriptors are free than a
        dial needs (:mod:`p2pfsm.executor.fds`), or its sockets cannot be made or
        set up (out of the context's sockets); nothing is kept then."""
        require_headroom(f"cannot open DEALER to {peer_id}")  # libzmq aborts short of them
        try:
            dealer = self._ctx.socket(zmq.DEALER)
        except zmq.ZMQError as exc:  # out of descriptors (EMFILE) or the context's sockets
            raise TransportError(f"cannot open DEALER to {peer_id}: {exc}") from exc
        monitor: zmq.Socket[bytes] | None = None
        monitoring = False
        try:
            dealer.setsockopt(zmq.IDENTITY, self._identity)
            dealer.setsockopt(zmq.SNDHWM, self._sndhwm)
            dealer.setsockopt(zmq.RCVHWM, self._rcvhwm)
            dealer.setsockopt(zmq.LINGER, self._linger_ms)
            dealer.setsockopt(zmq.IMMEDIATE, 1 if self._immediate else 0)
            self._heartbeats.apply(dealer)
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
        peer = Dealer(peer_id, dealer, monitor, deadline, dialled_back=dialled_back,
                      server_key=server_key,
                      origin=origin if origin is not None
                      else origin_of(peer_id.rpartition(":")[0], None))
        self.peers[peer_id] = peer
        self.lost.pop(peer_id, None)
        fd = fd_of(monitor)
        self._by_fd[fd] = peer
        self._epoll.register(fd, select.EPOLLIN)
        self.note_expiry(deadline)
        self._look.append(peer)  # opening it ran its commands: look once without a signal
        return peer

    def teardown(self, peer: Dealer, linger_ms: int) -> None:
        """Close a peer's sockets, reporting nothing (its held frames are written first,
        their failures kept for :meth:`send_held`)."""
        if peer.held:
            self._write_held(peer, closing=True)
        # Order matters (libzmq#3575): stop the DEALER's monitor before closing the
        # PAIR that reads it, so the DEALER never writes into a dead monitor pipe.
        self.peers.pop(peer.peer_id, None)
        self.by_ident.pop(peer.peer_id.encode("ascii"), None)
        fd = fd_of(peer.monitor)
        if self._by_fd.get(fd) is peer:
            del self._by_fd[fd]
        self._epoll.unregister(fd)
        try:
            peer.dealer.disable_monitor()
        finally:
            peer.monitor.close(linger=0)
            peer.dealer.close(linger=linger_ms)

    def send(self, peer: Dealer, frame: bytes, *, closing: bool = False) -> str | None:
        """Write one frame to ``peer``'s DEALER without blocking: None when it is queued,
        else why not (the DEALER is then closed, and the caller reports it). ``closing``:
        the DEALER is being closed already (no monitor read, no loss)."""
        try:
            peer.dealer.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            # A DEALER whose handshake was just refused has no pipe left: the refusal,
            # if its monitor holds it, is the cause, not a full queue.
            lost = None if peer.connected or closing else self.loss_unread(peer)
            if lost is not None:
                return lost
            reason = "send queue full"
        except zmq.ZMQError as exc:
            reason = f"send failed: {exc}"
        else:
            return None
        if not closing:
            self.lose(peer, reason, report=False)
        return reason

    def hold(self, peer: Dealer, frame: bytes, tag: object) -> None:
        """Keep ``frame`` for :meth:`send_held` (or ``peer``'s teardown, whichever comes
        first); ``tag`` comes back with its failure, if it fails. A DEALER holds at
        most :attr:`hold_max` frames: a burst is written in batches of that many, so
        that the I/O thread drains its queue between them and no burst meets the HWM
        where frames written one by one would not."""
        held = peer.held
        if not held:
            self.holding.append(peer)
        elif len(held) >= self.hold_max:
            self._write_held(peer, closing=False)
            if self.peers.get(peer.peer_id) is not peer:  # that write failed: closed
                self._held_failures.append((peer.peer_id, "not connected", tag))
                return
        peer.held.append((frame, tag))

    def send_held(self) -> list[tuple[str, str, object]]:
        """Write every held frame, each DEALER's back to back, in the order they were
        held; the frames that failed, as (peer id, why, tag), those that failed at a
        teardown since the last call included. After a failure the DEALER is closed and
        its later frames fail as ``"not connected"``."""
        peers, self.holding = self.holding, []
        for peer in peers:
            if peer.held:
                self._write_held(peer, closing=False)
        failures, self._held_failures = self._held_failures, []
        return failures

    def _write_held(self, peer: Dealer, *, closing: bool) -> None:
        held, peer.held = peer.held, []
        for i, (frame, tag) in enumerate(held):
            reason = self.send(peer, frame, closing=closing)
            if reason is None:
                continue
            self._held_failures.append((peer.peer_id, reason, tag))
            self._held_failures.extend((peer.peer_id, "not connected", later)
                                       for _, later in held[i + 1:])
            return

    def lose(self, peer: Dealer, reason: str, report: bool = True) -> None:
        """Close a peer's sockets at once, report it lost (a :class:`PeerLost` for the
        next poll, unless ``report`` is False: the caller reports it), and remember its
        id."""
        self.teardown(peer, 0)
        if report:
            self.pending.append(PeerLost(peer.peer_id, reason))
        self.lost[peer.peer_id] = (time.monotonic(), peer.server_key)
        self.lost.move_to_end(peer.peer_id)
        while len(self.lost) > self._max_peers:
            self.lost.popitem(last=False)

    def remembered(self, peer_id: str) -> bool:
        """``peer_id`` was a peer of ours lost lately (a peer coming back, not a new one);
        one lost longer ago than ``_LOST_KEEP_S`` is forgotten here."""
        entry = self.lost.get(peer_id)
        if entry is None:
            return False
        if time.monotonic() - entry[0] >= _LOST_KEEP_S:
            del self.lost[peer_id]
            return False
        return True

    def finish_later(self, peer: Dealer) -> None:
        """Close ``peer``'s DEALER once the done grace is over (its last frames go out)."""
        peer.done_at = time.monotonic()
        self.note_expiry(peer.done_at + DONE_GRACE_S)

    def _unfinished(self) -> list[Dealer]:
        """The dial-backs in the pending budget, oldest first."""
        return [p for p in self.peers.values() if p.dialled_back and not p.ready]

    def make_room(self, origin: str) -> None:
        """Free a slot of the pending budget, if it is full, for a dial-back to ``origin``
        (the victim: :func:`~p2pfsm.executor.zmq.admission.eviction_victim`).

        What we know of each pending dial-back is brought up to date first (a refused
        one is gone, a finished ZMTP handshake is seen): inside one drain of the ROUTER
        nothing else would read the monitors, and a burst of connects whose dial-backs
        are refused at once would otherwise push out a dial-back that is coming up."""
        assert self._max_pending is not None
        pending = self._unfinished()
        if len(pending) < self._max_pending:
            return
        self.drain_monitors()
        # Every pending one's own monitor too: its descriptor is edge-triggered, and a
        # signal missed until the next sweep would leave a dial-back whose handshake
        # came up looking unproven (first to go).
        for peer in pending:
            if self.peers.get(peer.peer_id) is peer:
                for event, value, _ in monitor_events(peer.monitor):
                    self._on_monitor_event(peer, event, value)
                    if self.peers.get(peer.peer_id) is not peer:
                        break
        pending = self._unfinished()
        if len(pending) < self._max_pending:
            return
        victim = eviction_victim(pending, origin)
        self._evict_log.emit(
            log.warning, "evictions", "evicting %s (from %s): %d dial-backs without a "
            "finished handshake, %s", victim.peer_id, victim.origin, len(pending),
            "its handshake had come up" if victim.connected else "its handshake unproven")
        self.lose(victim, EVICTED)

    def loss_unread(self, peer: Dealer) -> str | None:
        """Read ``peer``'s monitor now. When it tells of the peer's loss (a refused ZMTP
        handshake whose event no poll has read yet), the peer is lost and that reason is
        returned, taken back from :attr:`pending` (the caller reports it); else None."""
        before = len(self.pending)
        for event, value, _ in monitor_events(peer.monitor):
            self._on_monitor_event(peer, event, value)
            if self.peers.get(peer.peer_id) is not peer:
                break
        if self.peers.get(peer.peer_id) is peer:
            return None
        ours = [e for e in self.pending[before:]
                if isinstance(e, PeerLost) and e.peer_id == peer.peer_id]
        self.pending[before:] = [e for e in self.pending[before:] if e not in ours]
        return ours[-1].reason if ours else "closed"

    def drain_monitors(self) -> None:
        """Drain the monitors whose descriptor signalled (all of them once a sweep)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + _SWEEP_S
            chosen = list(self.peers.values())
        else:
            by_fd = self._by_fd
            chosen = [by_fd[fd] for fd, _ in self._epoll.poll(0) if fd in by_fd]
            if self._look:
                chosen.extend(self._look)
        self._look = []
        for peer in chosen:
            if self.peers.get(peer.peer_id) is not peer:
                continue
            for event, value, _ in monitor_events(peer.monitor):
                self._on_monitor_event(peer, event, value)
                if self.peers.get(peer.peer_id) is not peer:
                    break

    def _on_monitor_event(self, peer: Dealer, event: int, value: int) -> None:
        """What a DEALER's monitor event means for its peer."""
        if event == EV_CONNECTED:
            if connected_to_itself(value):
                self.lose(peer, "connection refused")
        elif event == EV_HANDSHAKE_OK:
            peer.connected = True
            peer.deadline = None
        elif event in EV_HANDSHAKE_FAILED:
            cause = handshake_cause(event, value, self._curve is not None)
            if self._curve is not None:
                log.warning("%s refused our connection: %s", peer.peer_id, cause)
            self.lose(peer, f"handshake failed: {cause}")
        elif peer.connected and event == EV_DISCONNECTED:
            self.lose(peer, "disconnected")
        elif peer.connected and event == EV_CLOSED:
            self.lose(peer, "closed")
        elif not peer.connected and event == EV_DISCONNECTED:
            peer.reached = True
        elif not peer.connected and event == EV_CONNECT_RETRIED:
            # libzmq failed a connect attempt and would retry. With no TCP connection
            # made (no DISCONNECTED before: just CLOSED), the connect itself failed: on
            # an address nobody listens on, at once.
            self.lose(peer, "connection closed before handshake" if peer.reached
                      else "connection refused")
        # Before the first handshake, CLOSED is the socket of a failed attempt.

    def note_expiry(self, when: float) -> None:
        """A connect deadline or done grace ends at ``when``."""
        if self.next_expiry is None or when < self.next_expiry:
            self.next_expiry = when

    def expire_due(self) -> None:
        """Run the connect timeouts and done graces that are due, if one may be."""
        now = time.monotonic()
        if self.next_expiry is not None and now >= self.next_expiry:
            self._expire(now)

    def _expire(self, now: float) -> None:
        """Connect timeouts and done graces that are due (run only when one may be), and
        the next one's time."""
        self.next_expiry = None
        for peer in list(self.peers.values()):
            if peer.deadline is not None:
                if now >= peer.deadline:
                    self.lose(peer, "connect timeout")
                    continue
                self.note_expiry(peer.deadline)
            if peer.done_at is not None:
                if now >= peer.done_at + DONE_GRACE_S:
                    self.teardown(peer, self._linger_ms)  # over: free its descriptors
                else:
                    self.note_expiry(peer.done_at + DONE_GRACE_S)

    def next_due(self) -> float | None:
        """When the DEALERs next need a look without a signal (a deadline, a done
        grace, the monitor sweep); None when there are none."""
        first = self.next_expiry
        if self.peers and (first is None or self._next_sweep < first):
            first = self._next_sweep
        return first
