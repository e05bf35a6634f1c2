"""The session machine (``models/session.toml``): its guards and actions.

Handshake, send gating, death and close. The state the session ends from tells whether
it was ever ready: ``end_work_queued`` (before ``ready``, our frames never left the
queue) and ``end_work_sent`` (from ``ready``) fire different triggers on the open
loads. :data:`SESSION` binds the model to these methods.
"""

from __future__ import annotations

from p2pfsm.errors import HandshakeMismatch, InvalidTransition
from p2pfsm.fsm import CompiledMachine, machine
from p2pfsm.protocol import Connect, ConnectAck, Disconnect, FetchRound, Message, TransferDone
from p2pfsm.session.base import SessionBase
from p2pfsm.session.child import EndRoles
from p2pfsm.session.inputs import RegistrationFinished, TimerId, TransportLost
from p2pfsm.session.outputs import SendFrame, SendToLostPeer, SessionDead, StartRegistration

STALE_ANSWER_INTERVAL_S = 1.0
"""A dead session answers its peer's frames with a disconnect at most this often."""


def _slices(layout: tuple[tuple[int, int, int], ...] | None) -> tuple[int, ...] | None:
    """What two peers' layouts must share: each region's slice length, in order. None
    for a connect without a layout (vLLM's plain region), which pairs only with another
    such connect."""
    return None if layout is None else tuple(entry[2] for entry in layout)


def _said(layout: tuple[tuple[int, int, int], ...] | None) -> str:
    if layout is None:
        return "one plain region (no layout field, as vLLM 0.33.0)"
    return f"{len(layout)} regions of slices {[entry[2] for entry in layout]}"


class SessionMachine(SessionBase):
    """The session machine's guards and actions, and the gate every frame passes."""

    def is_peer_compatible(self, ev: object) -> bool:
        assert isinstance(ev, Connect)
        return self._mismatch(ev) is None

    def is_peer_restarted(self, ev: object) -> bool:
        """A connect from a new incarnation of the peer we hold (both carry one)."""
        assert isinstance(ev, Connect)
        known = None if self.peer is None else self.peer.incarnation
        return known is not None and ev.incarnation is not None and ev.incarnation != known

    def is_peer_reconnected(self, ev: object) -> bool:
        """A connect of the incarnation we hold: the peer lost its side of the session
        (a one-sided transport loss) and connects again (both carry one)."""
        assert isinstance(ev, Connect)
        known = None if self.peer is None else self.peer.incarnation
        return known is not None and ev.incarnation == known

    def _mismatch(self, peer: Connect) -> HandshakeMismatch | None:
        cfg = self.config
        checks: list[tuple[str, object, object]] = [
            ("block_len", cfg.block_len, peer.block_len),
            ("hash_seed", cfg.hash_seed, peer.hash_seed),
            ("config_fingerprint", cfg.config_fingerprint, peer.config_fingerprint),
        ]
        if cfg.expected_peer_id is not None:
            checks.append(("peer_id", cfg.expected_peer_id, peer.peer_id))
        for name, ours, theirs in checks:
            if ours != theirs:
                return HandshakeMismatch(name, ours, theirs)
        if _slices(cfg.layout) != _slices(peer.layout):
            return HandshakeMismatch("layout", _said(cfg.layout), _said(peer.layout))
        if peer.agent_metadata == cfg.agent_metadata or peer.peer_id == cfg.local_id:
            return HandshakeMismatch("agent_metadata", "ours", "ours (a peer posing as us)")
        return None

    def is_round_unserved(self, ev: object) -> bool:
        """No round of ours has the demand of that (kv_request_id, round_seq): a reply
        to the rejected fetch is the only one the consumer gets for it."""
        assert isinstance(ev, FetchRound)
        rnd = self._rounds.get(ev.kv_request_id, {}).get(ev.round_seq)
        return rnd is None or not rnd.demanded

    def fail_bad_fetch(self, ev: object) -> None:
        assert isinstance(ev, FetchRound)
        self.send(TransferDone(ev.kv_request_id, False, ev.round_seq))

    def send_connect(self, _ev: object) -> None:
        cfg = self.config
        self.send(Connect(cfg.local_id, cfg.agent_metadata, cfg.base_addr, cfg.num_blocks,
                          cfg.block_len, cfg.config_fingerprint, cfg.hash_seed,
                          cfg.incarnation, cfg.layout))

    def arm_handshake_timer(self, _ev: object) -> None:
        self.arm(TimerId("handshake"), self.config.timeouts.handshake)

    def disarm_handshake_timer(self, _ev: object) -> None:
        self.disarm(TimerId("handshake"))

    def remember_peer(self, ev: object) -> None:
        assert isinstance(ev, Connect)
        self.peer = ev

    def start_registration(self, ev: object) -> None:
        assert isinstance(ev, Connect)
        self.emit(StartRegistration(ev))

    def send_connect_ack(self, _ev: object) -> None:
        self.send(ConnectAck(self.config.local_id))

    def flush_queue(self, _ev: object) -> None:
        queued, self._queue = self._queue, []
        self._out.extend(SendFrame(m) for m in queued)

    def send_disconnect(self, _ev: object) -> None:
        self.send(Disconnect())
        self.last_disconnect = self.now

    def send_disconnect_to_lost_peer(self, _ev: object) -> None:
        """A dead session tells its peer that it is over: the peer may still hold the
        session live, and our connection to it may be gone (the executor dials it back)."""
        self.emit(SendToLostPeer(Disconnect()))
        self.last_disconnect = self.now

    def is_stale_answer_due(self, _ev: object) -> bool:
        """No disconnect of ours in the last :data:`STALE_ANSWER_INTERVAL_S` (the rate
        limit: one small frame a second to a peer that completed a handshake with us)."""
        last = self.last_disconnect
        return last is None or self.now - last >= STALE_ANSWER_INTERVAL_S

    def answer_stale(self, ev: object) -> None:
        """Tell a peer that still holds the session live that it is over."""
        self.send_disconnect_to_lost_peer(ev)

    def die_mismatch(self, ev: object) -> None:
        assert isinstance(ev, Connect)
        self.mismatch = self._mismatch(ev)
        self._die(f"incompatible peer: {self.mismatch}", self.mismatch)

    def die_duplicate_connect(self, _ev: object) -> None:
        self._die("protocol error: connect after the handshake")

    def die_peer_restarted(self, ev: object) -> None:
        assert isinstance(ev, Connect)
        self.death_reason = "peer restarted"
        self.emit(SessionDead(self.death_reason, restarted_by=ev))

    def die_peer_reconnected(self, ev: object) -> None:
        assert isinstance(ev, Connect)
        self.death_reason = "peer reconnected"
        self.emit(SessionDead(self.death_reason, restarted_by=ev))

    def die_registration_failed(self, ev: object) -> None:
        assert isinstance(ev, RegistrationFinished)
        self._die(f"data-plane registration failed: {ev.reason or 'unknown'}")

    def die_ack_before_connect(self, _ev: object) -> None:
        self._die("protocol error: connect_ack before connect")

    def die_peer_disconnected(self, _ev: object) -> None:
        self._die("peer disconnected")

    def die_handshake_timeout(self, _ev: object) -> None:
        self._die("handshake timed out")

    def die_transport_lost(self, ev: object) -> None:
        assert isinstance(ev, TransportLost)
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

    def _apply_outbox(self, obj: object) -> None:
        raise NotImplementedError  # ChildSteps

    def _end_roles(self, load_trigger: str) -> None:
        """Every machine of both roles learns that the session is gone (the session
        applies the EndRoles an ``end_work_*`` action, always the last, leaves)."""
        raise NotImplementedError  # InputDispatch, which sees both roles

    # ------------------------------------------------------------- frame gate
    def _gate(self, trigger: str, msg: Message) -> None:
        """Fire the session's gate for a non-handshake frame (validate first!)."""
        SESSION.fire(self, trigger, msg)

    def _check_gate(self, trigger: str) -> None:
        if not SESSION.can_fire(self, trigger):
            raise InvalidTransition(SESSION.name, self.fsm_state, trigger)


def _session_committed(_m: CompiledMachine, s: object, _trigger: str, _dest: str) -> None:
    """A session step committed: apply what its actions left in the outbox (EndRoles)."""
    assert isinstance(s, SessionMachine)
    if s._env.outbox:
        s._apply_outbox(s)


SESSION = CompiledMachine(machine("session"), SessionMachine, then=_session_committed)
