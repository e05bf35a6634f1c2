"""The sans-IO peer session: one object per peer, both roles, one entry point.

Theory of operation. :meth:`Session.handle` takes one input event and the current
time and returns the outputs it caused, in order. Nothing here touches a socket,
a clock, a thread or NIXL: the executor (real or simulated) turns outputs into
effects and feeds back the resulting events.

Every state change is a transition declared in ``models/``: the session machine
(handshake, gating, death, close) and one machine per load round, lookup, serve
round and served lookup (the session's children). A child never calls into the
session: its actions append to an outbox the session applies once the step has
committed; a child whose machine reaches a terminal state is retired; the models'
state-triggered ``settle`` transitions then run in one loop to a fixed point
(:mod:`~p2pfsm.session.steps`). Frames are decoded and validated completely before any
machine fires; a frame that is malformed, or that no declared transition accepts
in the current state, is rejected with a ProtocolViolation output and changes
nothing. Host misuse raises LocalProtocolError and changes nothing.

The shape: the session *holds* two parts, :class:`~p2pfsm.session.client_part.ClientPart`
(load rounds, lookups, round numbers) and :class:`~p2pfsm.session.server_part.ServerPart`
(serve rounds, served lookups, store jobs, writes, tokens), each owning its tables and
reaching the session through the small :class:`~p2pfsm.session.owner.Owner` interface
that :class:`Session` implements (send, arm, disarm, emit, now; three ways to fire a
machine: step, step_nested, settle). The session keeps
the session machine (its guards and actions are methods here; its data is
:attr:`Session.fsm_data`), the timers, the step's outputs and the children's outbox.
:mod:`~p2pfsm.session.dispatch` routes each input to the session or a part; tests and
tools read the session through :attr:`Session.view` (:mod:`~p2pfsm.session.view`).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, ClassVar

from p2pfsm.errors import HandshakeMismatch, LocalProtocolError
from p2pfsm.fsm import CompiledMachine, Tracer, machine
from p2pfsm.protocol import (
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    FetchRound,
    Message,
    TransferDone,
)
from p2pfsm.session.child import (
    ChildEnv,
    EndRoles,
    ReleaseHeld,
)
from p2pfsm.session.client import ClientRound
from p2pfsm.session.client_part import ClientPart
from p2pfsm.session.config import SessionConfig
from p2pfsm.session.dispatch import HANDLERS, TIMER_MACHINES
from p2pfsm.session.inputs import (
    HostFetch,
    HostLookup,
    HostSupply,
    Input,
    RegistrationFinished,
    TimerId,
    TransportLost,
)
from p2pfsm.session.machine import (
    LIVE_STATES,
    OPEN_STATES,
    STALE_ANSWER_INTERVAL_S,
    UNSTARTED_STATES,
    handshake_mismatch,
)
from p2pfsm.session.outbox import apply_outbox, retire
from p2pfsm.session.outputs import (
    ABORT_ACK_TIMED_OUT,
    LOOKUP_TIMED_OUT,
    FailReason,
    LoadResult,
    LookupResult,
    Output,
    SendFrame,
    SendToLostPeer,
    SessionDead,
    StartRegistration,
    StoreResult,
)
from p2pfsm.session.server_part import ServerPart
from p2pfsm.session.steps import run_cascade
from p2pfsm.session.timers import TimerTable
from p2pfsm.session.tombstones import purge_due
from p2pfsm.session.view import SessionView

__all__ = ["LIVE_STATES", "SESSION", "Session"]

_HANDSHAKE_TYPES = (Connect, ConnectAck, Disconnect)
_HOLDING = machine("client_round").state_set("holding")
_OVER = "the session is not alive"
"""Why a job of a host call on a session that is over fails (its result's detail)."""


class Session:
    """A peer session (both roles) driven only by its declared machines.

    Args:
        config: our identity, layout and deadlines.
        tracer: when given, records every fired transition.
    """

    fsm_data = ("peer", "death_reason", "mismatch", "last_disconnect", "_queue")
    """What the session machine's actions write (restored should one raise)."""
    machine: ClassVar[CompiledMachine]
    """The session machine (``models/session.toml``) bound to this class: :data:`SESSION`."""

    def __init__(self, config: SessionConfig, tracer: Tracer | None = None) -> None:
        self.config = config
        self.fsm_state = machine("session").initial
        self.peer: Connect | None = None
        self.death_reason: str | None = None
        self.mismatch: HandshakeMismatch | None = None
        self.last_disconnect: float | None = None  # when we last sent one (dead: rate limit)
        self.now = 0.0
        self._out: list[Output] = []
        self._queue: list[Message] = []
        self._handing_off = False  # while the flush hands loads off, sends still queue
        self._timers: TimerTable[TimerId] = TimerTable()
        # What the children's actions asked for (applied after each step).
        self._env = ChildEnv(config.timeouts, tracer, config.answer_lookups_in_parts,
                             config.behaviour)
        self.client: ClientPart = ClientPart(self, config, self._env)
        self.server: ServerPart = ServerPart(self, config, self._env)
        self._view = SessionView(self)
        self._tombstones = (*self.client.tombstone_tables(), *self.server.tombstone_tables())

    def forget_tombstones(self) -> None:
        """Empty the per-request tables (the session is over: an ended session keeps
        none; the executor calls this when it reports the death)."""
        for table in self._tombstones:
            table.clear()

    # ------------------------------------------------------------ entry point
    def handle(self, event: Input, now: float) -> list[Output]:
        """Consume one event at time ``now``; return the outputs it caused, in order.

        Raises:
            LocalProtocolError: the host call is not allowed now or is malformed;
                the session is unchanged.
        """
        self.now = now
        purge_due(self._tombstones, now)
        handler = HANDLERS.get(type(event))
        if handler is None:
            raise LocalProtocolError(f"unknown input {type(event).__name__}")
        try:
            handler(self, event)
        except LocalProtocolError:
            self._out.clear()
            self._env.outbox.clear()
            raise
        out, self._out = self._out, []
        return out

    # ---------------------------------------------------------------- queries
    @property
    def view(self) -> SessionView:
        """A read-only view of the session's state, for tests, fuzzers and replay."""
        return self._view

    @property
    def tracer(self) -> Tracer | None:
        """Records every fired transition (the session's and its children's) when set."""
        return self._env.tracer

    @tracer.setter
    def tracer(self, tracer: Tracer | None) -> None:
        self._env.tracer = tracer

    outputs = property(attrgetter("_out"), doc="The outputs of the step in progress.")

    fsm_outputs = property(attrgetter("_out"))  # C getters: read on every step

    @property
    def fsm_label(self) -> str:
        return self.config.local_id

    fsm_tracer = property(attrgetter("_env.tracer"))

    @property
    def state(self) -> str:
        return self.fsm_state

    @property
    def ready(self) -> bool:
        return self.fsm_state in OPEN_STATES

    @property
    def alive(self) -> bool:
        return self.fsm_state in LIVE_STATES

    @property
    def held_destinations(self) -> int:
        """Load jobs reported with ``released=False`` whose DestinationReleased is still
        to come (their destinations held)."""
        client = self.client
        return len(client.held) + sum(
            1 for rounds in client.loads.values() for r in rounds.values()
            if r.fsm_state in _HOLDING)

    @property
    def has_pending_work(self) -> bool:
        """True while any job, lookup or write is outstanding."""
        return self.client.busy or self.server.busy

    def open_counts(self) -> dict[str, int]:
        """How many machine instances of each kind are open (for tests and stats)."""
        client, server = self.client, self.server
        return {
            "client_round": client.load_count,
            "client_lookup": sum(len(v) for v in client.lookups.values()),
            "server_round": len(server.round_by_serial),
            "server_lookup": len(server.tokens),
            "writes": len(server.writes),
            "timers": len(self._timers),
        }

    def next_deadline(self) -> float | None:
        """When this session next needs the clock (its earliest armed timer), or None.

        An executor wakes then and feeds ``TimerFired`` for each of :meth:`due_timers`;
        the answer changes only when :meth:`handle` is called."""
        nxt = self._timers.earliest()
        return None if nxt is None else nxt[0]

    def next_timer(self) -> tuple[float, TimerId] | None:
        """The earliest armed timer and its deadline (ties in ``str(timer)`` order)."""
        return self._timers.earliest()

    def due_timers(self, now: float) -> list[TimerId]:
        """The timers due by ``now``, in the order to fire them (each one input:
        ``TimerFired(timer)``; one that an earlier firing disarmed is then ignored)."""
        return self._timers.due(now)

    def check_host_call(self, ev: HostFetch | HostLookup) -> None:
        """Raise LocalProtocolError for what this session would refuse in ``ev`` (its
        arguments), changing nothing: for a host call held back to be fed later."""
        self.client.check_host_call(ev)

    # ------------------------------------------- the parts' owner interface
    def emit(self, output: Output) -> None:
        self._out.append(output)

    def send(self, message: Message) -> None:
        """Send now when ready (or a handshake frame; a terminal fetch the client part
        withholds is dropped); else queue in order."""
        if isinstance(message, _HANDSHAKE_TYPES) or (
                self.fsm_state in OPEN_STATES and not self._handing_off):
            if not self.client.withheld(message):
                self._out.append(SendFrame(message))
        else:
            self._queue.append(message)

    def withdraw_fetch(self, kv_request_id: str, round_seq: int) -> None:
        self._queue = [m for m in self._queue if not (isinstance(m, Fetch) and m.keys  # retired
                       and (m.kv_request_id, m.round_seq) == (kv_request_id, round_seq))]

    def arm(self, timer: TimerId, delay: float, *, keep: bool = False) -> None:
        if keep and timer in self._timers:
            return
        self._timers.arm(timer, self.now + delay)

    def disarm(self, timer: TimerId) -> None:
        self._timers.disarm(timer)

    # The three ways to fire a machine (the session's own, ``self.machine``, or a child).
    def step(self, m: CompiledMachine, obj: Any, trigger: str, ev: object = None) -> str:
        """An input's step of ``obj`` (committed: :meth:`_committed`), then
        :meth:`settle`; the new state."""
        dest: str = m.fires[trigger](obj, ev, self._committed)
        server = self.server
        if server.unsettled:
            run_cascade(server.unsettled, server.settle_one)
        return dest

    def step_nested(self, m: CompiledMachine, obj: Any, trigger: str,
                    ev: object = None) -> str:
        """A step inside another (a gate, an answer, a settle, pins of a lookup): committed
        like :meth:`step`, the settling left to the step that holds it; the new state."""
        return m.fires[trigger](obj, ev, self._committed)

    def settle(self) -> None:
        """Fire the models' state-triggered transitions until none is due (a fixed point)."""
        if self.server.unsettled:
            run_cascade(self.server.unsettled, self.server.settle_one)

    def require_started(self, what: str) -> None:
        """Refuse a host call before HostStart."""
        if self.fsm_state in UNSTARTED_STATES:
            raise LocalProtocolError(f"{what}: the session is not started (HostStart first)")

    def take_timer(self, timer: TimerId) -> bool:
        """Disarm a fired timer and say True when it is due (else it is stale:
        disarmed, re-armed or early)."""
        deadline = self._timers.get(timer)
        if deadline is None or deadline > self.now:
            return False
        self._timers.pop(timer)
        return True

    # ------------------------------------------------------- children's steps
    def _committed(self, m: CompiledMachine, obj: Any, trigger: str, dest: str) -> None:
        """Apply the outbox, retire the child if terminal, note what must cascade.

        Runs before the dispatcher records the step, so steps it causes (a lookup's hits
        pinned into a round) are recorded first, nested in it."""
        outbox = self._env.outbox
        if outbox:
            apply_outbox(self, outbox, obj)
        if obj is self:  # the session machine itself: its owner is the host
            return
        if dest in m.spec.terminal:
            retire(self, obj)
        elif type(obj) is ClientRound:
            self.client.note(obj)
            return  # the server part notes only its own children
        self.server.note(m, obj, trigger, dest)

    def end_roles(self, trigger: str) -> None:
        """Every machine of both parts learns that the session is gone (the session
        applies the EndRoles an ``end_work_*`` action leaves). A timer the ending arms (a
        held destination's bounded hold) stays armed."""
        doomed = [t for t in self._timers if TIMER_MACHINES[t.kind] != "server_round"]
        self.client.end(trigger)
        self.server.end()
        for timer in doomed:
            self.disarm(timer)

    # ---------------------------------------- the session machine: guards
    def is_peer_compatible(self, ev: Connect) -> bool:
        return handshake_mismatch(self.config, ev) is None

    def is_peer_restarted(self, ev: Connect) -> bool:
        """A connect from a new incarnation of the peer we hold (both carry one)."""
        known = None if self.peer is None else self.peer.incarnation
        return known is not None and ev.incarnation is not None and ev.incarnation != known

    def is_peer_reconnected(self, ev: Connect) -> bool:
        """A connect of the incarnation we hold: the peer lost its side of the session
        (a one-sided transport loss) and connects again (both carry one)."""
        known = None if self.peer is None else self.peer.incarnation
        return known is not None and ev.incarnation == known

    def is_round_unserved(self, ev: FetchRound) -> bool:
        """No round of ours has the demand of that (kv_request_id, round_seq): a reply
        to the rejected fetch is the only one the consumer gets for it."""
        rnd = self.server.server_round(ev.kv_request_id, ev.round_seq)
        return rnd is None or not rnd.demanded

    def is_stale_answer_due(self, _ev: object) -> bool:
        """No disconnect of ours in the last :data:`STALE_ANSWER_INTERVAL_S` (the rate
        limit: one small frame a second to a peer that completed a handshake with us)."""
        last = self.last_disconnect
        return last is None or self.now - last >= STALE_ANSWER_INTERVAL_S

    # --------------------------------------- the session machine: actions
    def fail_bad_fetch(self, ev: FetchRound) -> None:
        self.send(TransferDone(ev.kv_request_id, False, ev.round_seq))

    def ack_unknown_abort(self, ev: AbortFetch) -> None:
        self.send(AbortAck(ev.kv_request_id, ev.round_seq))

    def fail_expired_fetch(self, ev: Fetch) -> None:
        self.send(TransferDone(ev.kv_request_id, False, ev.round_seq))

    def send_terminal_fetch(self, ev: FetchRound) -> None:
        self.send(Fetch(ev.kv_request_id, (), (), ev.round_seq))

    def fail_fetch_over(self, ev: HostFetch) -> None:
        self.emit(LoadResult(ev.job_id, ev.kv_request_id, False, True,
                             FailReason.SESSION_ENDED, _OVER))

    def fail_lookup_over(self, ev: HostLookup) -> None:
        self.emit(LookupResult(ev.kv_request_id, ev.keys, (False,) * len(ev.keys), False,
                               FailReason.SESSION_ENDED, _OVER))

    def fail_supply_over(self, ev: HostSupply) -> None:
        self.emit(StoreResult(ev.job_id, False, FailReason.SESSION_ENDED, _OVER))

    def send_connect(self, _ev: object) -> None:
        cfg = self.config
        self.send(Connect(cfg.local_id, cfg.agent_metadata, cfg.base_addr, cfg.num_blocks,
                          cfg.block_len, cfg.config_fingerprint, cfg.hash_seed,
                          cfg.incarnation, cfg.layout, cfg.layout_names,
                          cfg.config_digests))

    def arm_handshake_timer(self, _ev: object) -> None:
        self.arm(TimerId("handshake"), self.config.timeouts.handshake)

    def disarm_handshake_timer(self, _ev: object) -> None:
        self.disarm(TimerId("handshake"))

    def remember_peer(self, ev: Connect) -> None:
        self.peer = ev

    def start_registration(self, ev: Connect) -> None:
        self.emit(StartRegistration(ev))

    def send_connect_ack(self, _ev: object) -> None:
        self.send(ConnectAck(self.config.local_id))

    def flush_queue(self, _ev: object) -> None:
        """Queued loads handed off (``ClientPart.hand_off``), then the queue, in order."""
        self._handing_off = True
        try:
            self.client.hand_off(self.take_timer)
        finally:
            self._handing_off = False
        queued, self._queue = self._queue, []
        self._out.extend(SendFrame(m) for m in queued if not self.client.withheld(m))

    def send_disconnect(self, _ev: object) -> None:
        self.send(Disconnect())
        self.last_disconnect = self.now

    def send_disconnect_to_lost_peer(self, _ev: object) -> None:
        """A dead session tells its peer that it is over: the peer may still hold the
        session live, and our connection to it may be gone (the executor dials it back)."""
        self.emit(SendToLostPeer(Disconnect()))
        self.last_disconnect = self.now

    def answer_stale(self, ev: object) -> None:
        """Tell a peer that still holds the session live that it is over."""
        self.send_disconnect_to_lost_peer(ev)

    def die_mismatch(self, ev: Connect) -> None:
        self.mismatch = handshake_mismatch(self.config, ev)
        self._die(f"incompatible peer: {self.mismatch}", self.mismatch)

    def die_duplicate_connect(self, _ev: object) -> None:
        self._die("protocol error: connect after the handshake")

    def die_peer_restarted(self, ev: Connect) -> None:
        self.death_reason = "peer restarted"
        self.emit(SessionDead(self.death_reason, restarted_by=ev))

    def die_peer_reconnected(self, ev: Connect) -> None:
        self.death_reason = "peer reconnected"
        self.emit(SessionDead(self.death_reason, restarted_by=ev))

    def die_abort_ack_timeout(self, _ev: object) -> None:
        self._die(ABORT_ACK_TIMED_OUT)

    def die_lookup_timeout(self, _ev: object) -> None:
        self._die(LOOKUP_TIMED_OUT)

    def release_held_restarted(self, _ev: object) -> None:
        """The peer's new incarnation connected: its old process, the one that could
        write into the destinations this session holds, is gone."""
        self._env.outbox.append(ReleaseHeld("peer_restarted"))

    def die_registration_failed(self, ev: RegistrationFinished) -> None:
        self._die(f"data-plane registration failed: {ev.reason or 'unknown'}")

    def die_ack_before_connect(self, _ev: object) -> None:
        self._die("protocol error: connect_ack before connect")

    def die_peer_disconnected(self, _ev: object) -> None:
        self._die("peer disconnected")

    def die_handshake_timeout(self, _ev: object) -> None:
        self._die("handshake timed out")

    def die_transport_lost(self, ev: TransportLost) -> None:
        self._die(f"transport lost: {ev.reason}")

    def end_work_queued(self, _ev: object) -> None:
        """The session ends before it was ready: our frames never left the queue."""
        self._queue.clear()
        self._env.outbox.append(EndRoles("session_lost_unsent"))

    def end_work_sent(self, _ev: object) -> None:
        """The session ends after it was ready: our frames may have reached the peer."""
        self._queue.clear()
        self._env.outbox.append(EndRoles("session_lost"))

    def _die(self, reason: str, mismatch: HandshakeMismatch | None = None) -> None:
        self.death_reason = reason
        self.emit(SessionDead(reason, mismatch))


def _session_committed(_m: CompiledMachine, s: Session, _trigger: str, _dest: str) -> None:
    """A session step committed: apply what its actions left in the outbox (EndRoles)."""
    outbox = s._env.outbox
    if outbox:
        apply_outbox(s, outbox, s)


SESSION = CompiledMachine(machine("session"), Session, then=_session_committed)
Session.machine = SESSION
