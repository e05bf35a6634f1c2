"""A node's peers: one session each, opened, fed its frames, ready, dead, opened again.

One :class:`~p2pfsm.session.Session` per peer. A peer's first frame (its connect)
opens an inbound session; :meth:`Peers.dial` (the host's ``Node.connect``) opens ours. A
frame from a new connection of the session's peer (its own ended) carries the session
over to it (:mod:`p2pfsm.executor.node.bindings`). A session that dies is remembered
(:attr:`Peers.deaths`), leaves the data plane, and is opened again when the host dialled
it (:mod:`p2pfsm.executor.node.redials`) or when the peer restarted; idle inbound sessions and
ones past their rejected-frame budget are closed (:mod:`p2pfsm.executor.node.peer_policy`).
The host's say over the peers it dialled (``disconnect``, ``redial_now``) ends here too.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from p2pfsm.errors import LocalProtocolError, RemoteProtocolError, TransportError
from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.executor.node.bindings import Bindings
from p2pfsm.executor.node.config import NodeConfig
from p2pfsm.executor.node.holders import Holders
from p2pfsm.executor.node.jobs import OpenJobs
from p2pfsm.executor.node.peer_policy import ComeBacks, EndedSessions, IdleInbound, ViolationBudget
from p2pfsm.executor.node.redials import Parked, Redials
from p2pfsm.executor.runtime.driver import Driver
from p2pfsm.executor.zmq.peer_ids import misnamed_dials, peer_address
from p2pfsm.executor.zmq.plane import ControlPlane
from p2pfsm.fsm import machine
from p2pfsm.logwindow import LogWindow, clip
from p2pfsm.metrics import NodeMetrics
from p2pfsm.protocol import DEFAULT_LIMITS, Connect, Message, decode, encode
from p2pfsm.session import (
    FailReason,
    FrameReceived,
    HostClose,
    HostStart,
    Input,
    ProtocolViolation,
    Session,
    SessionConfig,
    SessionDead,
    TransportLost,
)
from p2pfsm.session.tombstones import TombstoneBudget
from p2pfsm.spec_log import CallHook

log = logging.getLogger("p2pfsm.node")

_TERMINAL = machine("session").terminal  # closed: nothing more to do


HOSTILE_LINES = "lines about refused peers"
"""The kind of the lines :attr:`Peers.hostile_log` limits: ones a peer makes fire at will
(a refused handshake or registration, a session that dies before its handshake)."""

FRAME_LIMITS = DEFAULT_LIMITS
"""The limits every session of a node decodes its frames with, and the node too where it
must see whether a frame is a connect (it hands that decoded message on)."""


def _decoded(frame: bytes) -> Message | None:
    """The frame's message, as the peer's session would decode it; None when it does not
    decode (the session finds that out again, and says why)."""
    try:
        return decode(frame, FRAME_LIMITS)
    except RemoteProtocolError:
        return None


class Peers:
    """A node's sessions, one per peer, from open to end, and what it knows of its peers.

    Built by the node from its config, identity (``local_id``, ``incarnation``), planes,
    metrics, driver, open jobs (their ready waits are answered here) and call hook (its
    tracer goes to each session); ``closed`` says whether the node is closed (no session
    opens again then); ``peer_state`` and ``fail_parked`` are its effects'
    (:class:`~p2pfsm.executor.node.effects.NodeEffects`).
    """

    def __init__(self, config: NodeConfig, local_id: str, incarnation: int,
                 control: ControlPlane, data: DataPlane, metrics: NodeMetrics,
                 driver: Driver, jobs: OpenJobs, hook: CallHook | None,
                 closed: Callable[[], bool], peer_state: Callable[[str, str, str], None],
                 fail_parked: Callable[[str, Parked, FailReason, str], None]) -> None:
        self._config = config
        self._local_id = local_id
        self._incarnation = incarnation
        self._control = control
        self._data = data
        self._metrics = metrics
        self._driver = driver
        self._peer_state = peer_state
        self._fail_parked = fail_parked
        self._jobs = jobs
        self._hook = hook
        self._closed = closed
        self.sessions: dict[str, Session] = {}
        self.deaths: OrderedDict[str, SessionDead] = OrderedDict()
        self.violations: deque[tuple[str, ProtocolViolation]] = deque(maxlen=config.history)
        self.redials = Redials(config.reconnect_backoff_s,  # sessions opened again
                               config.reconnect_max_attempts)
        # Lines a peer can make fire at will (refused handshakes and registrations,
        # sessions that die before their handshake): one window for them all.
        self.hostile_log = LogWindow(10, 10.0)
        self._holders = Holders(driver)  # sessions out of the table holding destinations
        self._ended = EndedSessions(config.history)  # peers whose session ended
        # Every session's tombstones together (SessionConfig.tombstone_budget).
        self._tombstones = TombstoneBudget(
            config.max_node_tombstones, lambda: metrics.count("tombstones_dropped"))
        self._started_at: dict[str, float] = {}
        self._foreign_log = LogWindow()
        # New sessions of an identity whose last one ended.
        self._comebacks = ComeBacks(metrics, self.hostile_log, HOSTILE_LINES)
        self._bindings = Bindings()
        self._violations = ViolationBudget(config.max_violations)  # of the live session
        self.idle = IdleInbound(config.idle_timeout_s)  # inbound sessions' last frames
        self._incarnations: OrderedDict[str, int | None] = OrderedDict()  # peers' last seen

    # ------------------------------------------------------------- the table
    def session(self, peer_id: str) -> Session:
        """The peer's session now; a LocalProtocolError without one."""
        try:
            return self.sessions[peer_address(peer_id)]
        except KeyError:
            raise LocalProtocolError(f"no session to {peer_id}; connect first") from None

    def loop_gauges(self) -> tuple[int, int]:
        """The loop's two gauges in one pass: the sessions in the table that are alive,
        and the destinations held by the peers' sessions (:meth:`held_destinations`)."""
        alive = held = 0
        for session in self.sessions.values():
            if session.alive:
                alive += 1
            held += session.held_destinations
        return alive, held + self._holders.kept()

    def queue(self, peer_id: str, event: Input, session: Session | None = None) -> None:
        """Queue ``event`` for ``session`` (default: the peer's session now)."""
        self._driver.queue(peer_id, event, session or self.sessions.get(peer_id))

    def death_reason(self, peer_id: str) -> str:
        dead = self.deaths.get(peer_id)
        return f"session to {peer_id} died: {dead.reason if dead else 'unknown'}"

    def dial(self, peer_id: str) -> Session:
        """Open (or return) our session to ``peer_id``."""
        session = self.sessions.get(peer_id)
        if session is not None and session.alive:
            return session
        self.redials.host_dialled(peer_id)
        self._control.connect(peer_id)
        self._bindings.forget(peer_id)  # a new session: bound by the peer's first frame
        session = self.new_session(peer_id)
        self.idle.ours(peer_id)  # never evicted for idleness
        self._peer_state(peer_id, "connecting", "")
        self._feed_parked(peer_id, session)
        return session

    def disconnect(self, peer_id: str) -> None:
        """Close the session to ``peer_id`` and forget the peer (``Node.disconnect``)."""
        ours = self.redials.dialled(peer_id)
        for ev in self.redials.forget(peer_id):
            self._fail_parked(peer_id, ev, FailReason.SESSION_ENDED,
                              "the host disconnected from the peer")
        session = self.sessions.get(peer_id)
        if session is not None and session.state not in _TERMINAL:
            self.queue(peer_id, HostClose(), session)
        if ours:
            self._peer_state(peer_id, "given up", "disconnected by the host")

    def close_all(self) -> None:
        """The node closes: every session that is not closed yet closes, and no session
        opens again (:meth:`end_parked`)."""
        for peer in list(self.sessions):
            if self.sessions[peer].state not in _TERMINAL:
                self.queue(peer, HostClose())
        self.end_parked()

    def new_session(self, peer_id: str) -> Session:
        """Open a new session to ``peer_id`` in the table (it replaces the peer's last)."""
        cfg = self._config
        profile, timeouts = cfg.session_profile(peer_id)
        session = Session(SessionConfig(
            local_id=self._local_id,
            agent_metadata=self._data.metadata,
            base_addr=self._data.base_addr,
            num_blocks=cfg.num_blocks,
            block_len=cfg.block_len,
            hash_seed=cfg.hash_seed,
            config_fingerprint=cfg.config_fingerprint,
            expected_peer_id=peer_id,
            timeouts=timeouts,
            incarnation=self._incarnation,
            layout=self._data.layout.wire(),
            layout_names=self._data.layout.names,
            config_digests=cfg.config_digests,
            max_lookups_per_request=cfg.max_lookups_per_request,
            answer_lookups_in_parts=cfg.answer_lookups_in_parts,
            limits=FRAME_LIMITS,
            max_tombstones=cfg.max_tombstones,
            tombstone_budget=self._tombstones,
            profile=profile,
        ), None if self._hook is None else self._hook.tracer)
        old = self.sessions.get(peer_id)
        if old is not None and old.held_destinations:
            # Replaced while it holds destinations: kept for their release notice (its
            # timers still run on the driver's clock; PeerGone still reaches it).
            self._holders.keep(peer_id, old)
        self.sessions[peer_id] = session
        self._violations.new_session(peer_id)
        self._ended.reopened(peer_id)
        self.deaths.pop(peer_id, None)
        self._started_at[peer_id] = time.monotonic()
        self._driver.feed(peer_id, HostStart(), session)
        return session

    def on_frame(self, peer_id: str, frame: bytes, conn: int = -1) -> None:
        session = self.sessions.get(peer_id)
        # Decoded here only where the node must know whether it is a connect; the session
        # is then handed the message and does not decode the frame again.
        msg: Message | None = None
        if session is not None and session.alive and not self._bindings.admits(peer_id, conn):
            # Not the session's connection (p2pfsm.executor.node.bindings): the peer's own
            # connection ended and it connected again from its host (libzmq hands a live
            # id to no other connection). A connect the session judges as its peer's
            # restart or reconnect; anything else resumes the session on the new one.
            msg = _decoded(frame)
            if not isinstance(msg, Connect):
                self._resumed(peer_id)
        if session is None or (not session.alive and not session.has_pending_work):
            # A new peer (or a restarted one) opens with its connect. Anything else is a
            # straggler of a session that is over (e.g. the disconnect that follows a
            # mismatch): restarting on it would make two incompatible peers restart
            # each other's sessions forever, so it goes to the old session (ignored).
            msg = _decoded(frame)
            if isinstance(msg, Connect) and session is not None:
                self._holders.release_if_restarted(peer_id, session, msg)
            if not isinstance(msg, Connect) or (
                    session is not None and not self._comebacks.admit(peer_id, time.monotonic())):
                if session is not None:
                    self.queue(peer_id, FrameReceived(frame, msg))
                return
            self._misnamed_dials(peer_id)
            self.new_session(peer_id)
            self.idle.opened_by_peer(peer_id)  # subject to idle eviction
            if self.redials.waiting(peer_id):
                self._opened_by_peer(peer_id)
        self._bindings.bind(peer_id, conn)
        self.idle.heard(peer_id, time.monotonic())
        self.queue(peer_id, FrameReceived(frame, msg))

    def release_held(self, peer_id: str, cause: str = "data_plane") -> int:
        """The host proves that ``peer_id`` can no longer write into our memory
        (``Node.release_held``); how many destinations were released."""
        return self._holders.release(peer_id, self.sessions.get(peer_id), cause)

    def held_destinations(self) -> dict[str, int]:
        """Per peer, destinations held for a DestinationReleased still to come."""
        return self._holders.counts(self.sessions)

    def _misnamed_dials(self, peer_id: str) -> None:
        """A peer opened a session as ``peer_id`` while a session we dialled to the same
        address under another name (``connect("localhost:P")`` to a peer that calls
        itself ``127.0.0.1:P``) waits for its handshake, which can never come: that
        session dies at once saying which id to connect to, and is not redialled."""
        sessions = self.sessions
        # Our own dials (few), not every session (a flood's many).
        waiting = [p for p in self.redials.dialled_ids()
                   if (s := sessions.get(p)) is not None and s.alive and not s.ready]
        for other in misnamed_dials(peer_id, waiting):
            why = (f"the peer at {other} calls itself {peer_id}: a peer id is the "
                   f"host:port the peer names itself by; connect to {peer_id!r}")
            log.warning("peer %s: %s", other, why)
            for ev in self.redials.forget(other):
                self._fail_parked(other, ev, FailReason.SESSION_ENDED, why)
            self._peer_state(other, "given up", why)
            self.queue(other, TransportLost(why), self.sessions[other])

    def _resumed(self, peer_id: str) -> None:
        """A live session's peer sends on a new connection (its own ended: a transport
        drop its libzmq recovered from): the session carries on there."""
        self._metrics.count("connections_resumed")
        self._foreign_log.emit(
            log.info, "sessions resumed on a new connection", "peer %s: its connection "
            "ended and it sent on a new one from its host: the session carries on there",
            peer_id)

    def on_ready(self, peer_id: str, session: Session) -> None:
        self._control.mark_ready(peer_id)  # out of the pending budget (or refused: full)
        started = self._started_at.pop(peer_id, None)
        if started is not None:
            self._metrics.observe("handshake_seconds", time.monotonic() - started)
        self._metrics.count("handshakes")
        self.redials.ready(peer_id)
        self._note_incarnation(peer_id, session)
        if self.redials.dialled(peer_id):
            self._peer_state(peer_id, "ready", "")
        log.info("peer %s ready", peer_id)
        if session.peer is not None:
            self._holders.release_if_restarted(peer_id, None, session.peer)
        for fut in self._jobs.ready_waiters.pop(peer_id, ()):
            if not fut.done():
                fut.set_result(session)

    def on_death(self, peer_id: str, dead: SessionDead) -> None:
        ended = self.sessions.get(peer_id)
        if ended is not None:
            ended.forget_tombstones()  # an ended session keeps none
        self.deaths[peer_id] = dead
        self.deaths.move_to_end(peer_id)
        while len(self.deaths) > self._config.history:
            self.deaths.popitem(last=False)
        self._metrics.count("deaths")
        never_ready = self._started_at.pop(peer_id, None) is not None
        if dead.mismatch is not None:
            self._metrics.count("handshakes_rejected")
            self.hostile_log.emit(log.warning, HOSTILE_LINES,
                                  "peer %s rejected: handshake field %r differs (%s)",
                                  peer_id, clip(dead.mismatch.field), clip(dead.mismatch))
        elif dead.reason == "closed":
            log.info("peer %s: session closed", peer_id)
        elif never_ready:
            # A peer that never finished a handshake: what a flood is made of.
            self.hostile_log.emit(log.warning, HOSTILE_LINES,
                                  "peer %s down: %s", peer_id, clip(dead.reason))
        else:
            log.warning("peer %s down: %s", peer_id, clip(dead.reason))
        error = TransportError(f"session to {peer_id} died: {dead.reason}")
        for fut in self._jobs.ready_waiters.pop(peer_id, ()):
            if not fut.done():
                fut.set_exception(error)
        if peer_id in self._data.peers:
            # A WRITE to the peer still running stays in flight until it ends (its
            # source may still be read); its WriteFinished then reaches the dead
            # session's draining round, which releases the pins only then.
            self._data.remove_peer(peer_id)
        if not self._control.closed:
            self._control.mark_done(peer_id)  # its connection gives up its slot
        self._ended.ended(peer_id)
        self._prune_ended()
        restart = dead.restarted_by
        if restart is not None:
            self._metrics.count("restarts" if dead.reason == "peer restarted" else "reconnects")
            self._incarnations[peer_id] = restart.incarnation  # counted here
            old = self.sessions.get(peer_id)
            self._driver.defer(lambda: self._serve_restart(peer_id, old, restart))
        elif self.redials.may_redial(peer_id, dead, self._closed()):
            wait = self.redials.schedule(peer_id, time.monotonic())
            log.info("peer %s: opening the session again in %.1f s", peer_id, wait)
            self._peer_state(peer_id, "lost", dead.reason)
        elif self.redials.dialled(peer_id):
            self._given_up(peer_id, dead)

    def _note_incarnation(self, peer_id: str, session: Session) -> None:
        """Count a restart the session's end did not tell (the peer died, and its new
        process connected to a new session): a ready peer whose incarnation differs
        from the one last seen."""
        new = None if session.peer is None else session.peer.incarnation
        if new is None:
            return
        known = self._incarnations.pop(peer_id, None)
        if known is not None and known != new:
            self._metrics.count("restarts")
        self._incarnations[peer_id] = new
        while len(self._incarnations) > self._config.history:
            self._incarnations.popitem(last=False)

    def _given_up(self, peer_id: str, dead: SessionDead) -> None:
        """A session the host opened died and is not opened again."""
        why = dead.reason
        if self.redials.exhausted(peer_id):
            why = (f"{self.redials.attempts(peer_id)} attempts in a row failed; the last: "
                   f"{dead.reason}")
            log.warning("peer %s given up: %s", peer_id, why)
            for ev in self.redials.forget(peer_id):  # a later connect() starts afresh
                self._fail_parked(peer_id, ev, FailReason.SESSION_ENDED, f"given up: {why}")
        self._peer_state(peer_id, "given up", why)

    def redial_due(self, now: float) -> None:
        """Open the sessions whose redial is due; fail the calls that waited past their
        deadline for the others."""
        peers, expired = self.redials.due(now)
        for peer_id in peers:
            self._redial(peer_id)
        for peer_id, ev in expired:
            self._fail_parked(peer_id, ev, FailReason.SESSION_ENDED,
                              "no session to the peer within the deadline: it is being "
                              f"opened again ({self.death_reason(peer_id)})")

    def _redial(self, peer_id: str) -> None:
        if self._closed():
            return  # close() gave every parked call its result
        session = self.sessions.get(peer_id)
        if session is not None and session.alive:
            # A session opened meanwhile (_opened_by_peer has cancelled the redial then;
            # a guard): the calls that waited for one go to it.
            self._feed_parked(peer_id, session)
            return
        self._metrics.count("redials")
        self.dial(peer_id)  # feeds the calls parked for the peer

    def _opened_by_peer(self, peer_id: str) -> None:
        """The peer opened a session while ours waited to be opened again (it restarted
        and connected to us first): that session replaces the redial, at once. It is
        ours as the host dialled the peer (never evicted for idleness, opened again when
        it dies), and the calls that waited go to it now, not at the redial's time (up
        to the backoff's most later, or past their own deadline)."""
        self.redials.cancel(peer_id)
        self.idle.ours(peer_id)
        log.info("peer %s connected to us while its session waited to be opened again: "
                 "that session replaces the redial", peer_id)
        self._feed_parked(peer_id, self.sessions[peer_id])

    def _feed_parked(self, peer_id: str, session: Session) -> None:
        """The calls that waited for a session to the peer, to ``session`` (which
        queues them until it is ready)."""
        for ev in self.redials.take(peer_id):
            self._driver.feed(peer_id, ev, session)

    def end_parked(self) -> None:
        """The node closes: no session opens again, and the calls that waited for one
        fail as the jobs of a closed session do (SESSION_ENDED, saying why)."""
        for peer_id, ev in self.redials.end():
            self._fail_parked(peer_id, ev, FailReason.SESSION_ENDED,
                              "the node closed while it waited for the session to open "
                              "again")

    def _serve_restart(self, peer_id: str, old: Session | None, connect: Connect) -> None:
        """The connect that ended ``old`` (a new incarnation of the peer) opens a fresh
        session, once the old one has reported all its work and left the data plane."""
        if self._closed() or self._control.closed or self.sessions.get(peer_id) is not old:
            return
        if not self._comebacks.admit(peer_id, time.monotonic()):
            return  # the connect is dropped; the peer's next one is judged again
        self.new_session(peer_id)
        self.idle.opened_by_peer(peer_id)
        self.idle.heard(peer_id, time.monotonic())
        self.queue(peer_id, FrameReceived(encode(connect), connect))

    def _prune_ended(self) -> None:
        """Drop ended sessions with nothing left to do beyond ``history`` of them."""
        for peer_id in self._ended.to_drop(self.sessions):
            old = self.sessions.pop(peer_id)
            if old.held_destinations:  # kept for the release notice it still owes
                self._holders.keep(peer_id, old)
            self._bindings.forget(peer_id)

    def evict_idle(self, now: float) -> None:
        """Close inbound sessions idle for ``idle_timeout_s`` (checked about once a second)."""
        if not self.idle.due(now):
            return
        for peer_id, idle_s in self.idle.idle(now, self.sessions):
            log.info("peer %s: idle for %.0f s, closing its session", peer_id, idle_s)
            self._metrics.count("idle_closes")
            self.queue(peer_id, HostClose(), self.sessions[peer_id])

    def on_violation(self, peer_id: str, violation: ProtocolViolation) -> None:
        """A frame of the peer was rejected: kept, counted, and the session closed once
        past its budget."""
        self.violations.append((peer_id, violation))
        self._metrics.count("violations")
        count = self._violations.rejected(peer_id)
        session = self._driver.applying
        if self._violations.crossed(count) and session is not None:
            log.warning("peer %s: %d rejected frames (budget %d): closing the session",
                        peer_id, count, self._violations.budget)
            self._metrics.count("violation_closes")
            self._driver.defer(lambda: self._close_for_violations(peer_id, session))
        self._violations.log(peer_id, log, violation.error)

    def _close_for_violations(self, peer_id: str, session: Session) -> None:
        if self.sessions.get(peer_id) is session and session.state not in _TERMINAL:
            self._driver.feed(peer_id, HostClose(), session)

    def cancel_fetch(self, peer_id: str, kv_request_id: str,
                     finish: Callable[[str, str], None]) -> None:
        """A cancelled fetch: its request is finished (``finish``) unless the session is
        already over (a fetch still waiting for its session to open again fails at
        once)."""
        for ev in self.redials.take_request(peer_id, kv_request_id):
            self._fail_parked(peer_id, ev, FailReason.FINISHED,
                              "cancelled while it waited for the session to open again")
        session = self.sessions.get(peer_id)
        if self._closed() or session is None or not session.alive:
            return
        with contextlib.suppress(LocalProtocolError):  # ended meanwhile: result on its way
            finish(peer_id, kv_request_id)
        log.info("fetch of %s from %s cancelled: request finished", kv_request_id, peer_id)

    def holds_ended_session(self, peer_id: str) -> bool:
        """We keep a session of ``peer_id`` that is over: its peer's frames still reach
        it (a dead session answers a peer that holds it live, however long ago)."""
        session = self.sessions.get(peer_id)
        return session is not None and not session.alive
