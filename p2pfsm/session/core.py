"""The sans-IO peer session: one object per peer, both roles, one entry point.

Theory of operation. :meth:`Session.handle` takes one input event and the current
time and returns the outputs it caused, in order. Nothing here touches a socket,
a clock, a thread or NIXL: the executor (real or simulated) turns outputs into
effects and feeds back the resulting events.

Every state change is a transition declared in ``models/``: the session machine
(handshake, gating, death, close) and one machine per load round, lookup, serve
round and served lookup. Frames are decoded and validated completely before any
machine fires; a frame that is malformed, or that no declared transition accepts
in the current state, is rejected with a ProtocolViolation output and changes
nothing. Host misuse raises LocalProtocolError and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from p2pfsm.errors import (
    HandshakeMismatch,
    InvalidTransition,
    LocalProtocolError,
    MalformedFrame,
    RemoteProtocolError,
    UnknownMessageType,
)
from p2pfsm.fsm import CompiledMachine, Tracer, machine
from p2pfsm.protocol import (
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    Lookup,
    LookupResp,
    Message,
    TransferDone,
    check_block_indexes,
    decode,
)
from p2pfsm.session.client import CLIENT_LOOKUP, CLIENT_ROUND, ClientLookup, ClientRound
from p2pfsm.session.config import SessionConfig
from p2pfsm.session.inputs import (
    FrameReceived,
    HostAnswerLookup,
    HostClose,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    Input,
    RegistrationFinished,
    TimerFired,
    TimerId,
    TransportLost,
    WriteFinished,
)
from p2pfsm.session.outputs import (
    ArmTimer,
    DisarmTimer,
    FetchArrived,
    FrameIgnored,
    LoadResult,
    LookupResult,
    Output,
    ProtocolViolation,
    SendFrame,
    SessionDead,
    StartRegistration,
    StoreResult,
)
from p2pfsm.session.server import SERVER_LOOKUP, SERVER_ROUND, LookupPin, ServerLookup, ServerRound
from p2pfsm.session.tombstones import Tombstones

_HANDSHAKE_TYPES = (Connect, ConnectAck, Disconnect)
LIVE_STATES = frozenset({"connecting", "registering", "registering_acked", "awaiting_ack", "ready"})
"""Session states in which the peer may still hear from us."""


class Session:
    """A peer session (both roles) driven only by its declared machines.

    Args:
        config: our identity, layout and deadlines.
        tracer: when given, records every fired transition.
    """

    def __init__(self, config: SessionConfig, tracer: Tracer | None = None) -> None:
        self.config = config
        self.tracer = tracer
        self.fsm_state = SESSION.spec.initial
        self.peer: Connect | None = None
        self.death_reason: str | None = None
        self.mismatch: HandshakeMismatch | None = None
        self.now = 0.0
        self._out: list[Output] = []
        self._queue: list[Message] = []
        self._timers: dict[TimerId, float] = {}
        # consumer role
        self._loads: dict[str, dict[int, ClientRound]] = {}
        self._load_count = 0
        self._load_jobs: set[int] = set()
        # Lowest round number a request may use next: rounds below it ended with an
        # abort whose late abort_ack may still be on the wire (kept a frame lifetime).
        self._round_floor = Tombstones(config.timeouts.tombstone)
        self._lookup_round: dict[str, int] = {}
        self._lookups: dict[str, list[ClientLookup]] = {}
        self._lookup_by_serial: dict[int, ClientLookup] = {}
        self._lookup_serial = 0
        # producer role
        self._rounds: dict[str, dict[int | None, ServerRound]] = {}
        self._round_by_serial: dict[int, ServerRound] = {}
        # Lookup-pinned rounds whose pins expired before their fetch: that fetch fails fast.
        self._expired_lookups = Tombstones(config.timeouts.tombstone)
        self._round_serial = 0
        self._store_jobs: dict[int, ServerRound] = {}
        self._writes: dict[int, ServerRound] = {}
        self._next_xfer = 0
        self._served: dict[str, list[ServerLookup]] = {}
        self._tokens: dict[int, ServerLookup] = {}
        self._next_token = 0

    fsm_data = ("peer", "death_reason", "mismatch", "_queue")
    """What the session machine's actions write (restored should one raise)."""

    # ------------------------------------------------------------------ queries
    @property
    def outputs(self) -> list[Output]:
        """The outputs of the step in progress (machine actions append to it)."""
        return self._out

    @property
    def fsm_outputs(self) -> list[Output]:
        return self._out

    @property
    def fsm_label(self) -> str:
        return self.config.local_id

    @property
    def fsm_tracer(self) -> Tracer | None:
        return self.tracer

    @property
    def state(self) -> str:
        return self.fsm_state

    @property
    def ready(self) -> bool:
        return self.fsm_state == "ready"

    @property
    def alive(self) -> bool:
        return self.fsm_state in LIVE_STATES

    @property
    def has_pending_work(self) -> bool:
        """True while any job, lookup or write is outstanding."""
        return bool(self._loads or self._lookups or self._rounds or self._tokens)

    def open_counts(self) -> dict[str, int]:
        """How many machine instances of each kind are open (for tests and stats)."""
        return {
            "client_round": self._load_count,
            "client_lookup": sum(len(v) for v in self._lookups.values()),
            "server_round": len(self._round_by_serial),
            "server_lookup": len(self._tokens),
            "writes": len(self._writes),
            "timers": len(self._timers),
        }

    # --------------------------------------------------------------- entry point
    def handle(self, event: Input, now: float) -> list[Output]:
        """Consume one event at time ``now``; return the outputs it caused, in order.

        Raises:
            LocalProtocolError: the host call is not allowed now or is malformed;
                the session is unchanged.
        """
        self.now = now
        self._round_floor.purge(now)
        self._expired_lookups.purge(now)
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise LocalProtocolError(f"unknown input {type(event).__name__}")
        try:
            handler(self, event)
        except LocalProtocolError:
            self._out.clear()
            raise
        out, self._out = self._out, []
        return out

    # ---------------------------------------------------------- output helpers
    def emit(self, output: Output) -> None:
        self._out.append(output)

    def send(self, message: Message) -> None:
        """Send now when ready (or a handshake frame); else queue in order."""
        if self.fsm_state == "ready" or isinstance(message, _HANDSHAKE_TYPES):
            self._out.append(SendFrame(message))
        else:
            self._queue.append(message)

    def arm(self, timer: TimerId, delay: float, *, keep: bool = False) -> None:
        if keep and timer in self._timers:
            return
        deadline = self.now + delay
        self._timers[timer] = deadline
        self._out.append(ArmTimer(timer, deadline))

    def disarm(self, timer: TimerId) -> None:
        if self._timers.pop(timer, None) is not None:
            self._out.append(DisarmTimer(timer))

    # -------------------------------------------------- session machine actions
    def is_peer_compatible(self, ev: object) -> bool:
        assert isinstance(ev, Connect)
        return self._mismatch(ev) is None

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
        if peer.agent_metadata == cfg.agent_metadata or peer.peer_id == cfg.local_id:
            return HandshakeMismatch("agent_metadata", "ours", "ours (a peer posing as us)")
        return None

    def send_connect(self, _ev: object) -> None:
        cfg = self.config
        self.send(Connect(cfg.local_id, cfg.agent_metadata, cfg.base_addr, cfg.num_blocks,
                          cfg.block_len, cfg.config_fingerprint, cfg.hash_seed))

    def arm_handshake_timer(self, _ev: object) -> None:
        self.arm(("handshake",), self.config.timeouts.handshake)

    def disarm_handshake_timer(self, _ev: object) -> None:
        self.disarm(("handshake",))

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

    def die_mismatch(self, ev: object) -> None:
        assert isinstance(ev, Connect)
        self.mismatch = self._mismatch(ev)
        self._die(f"incompatible peer: {self.mismatch}", self.mismatch)

    def die_duplicate_connect(self, _ev: object) -> None:
        self._die("protocol error: connect after the handshake")

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
        self._end_roles("session_lost_unsent")

    def end_work_sent(self, _ev: object) -> None:
        """The session ends after it was ready: our frames may have reached the peer."""
        self._queue.clear()
        self._end_roles("session_lost")

    def _die(self, reason: str, mismatch: HandshakeMismatch | None = None) -> None:
        self.death_reason = reason
        self.emit(SessionDead(reason, mismatch))

    def _end_roles(self, load_trigger: str) -> None:
        for rounds in list(self._loads.values()):
            for rnd in list(rounds.values()):
                CLIENT_ROUND.fire(rnd, load_trigger)
        for lookups in list(self._lookups.values()):
            for lk in list(lookups):
                CLIENT_LOOKUP.fire(lk, "session_lost")
        self._lookups.clear()
        self._lookup_by_serial.clear()
        self._lookup_round.clear()
        for served in list(self._tokens.values()):
            SERVER_LOOKUP.fire(served, "request_closed")
        for srv in list(self._round_by_serial.values()):
            SERVER_ROUND.fire(srv, "session_lost")
            self._settle(srv)
        for timer in [t for t in self._timers if t[0] not in ("store", "demand")]:
            self.disarm(timer)

    # ------------------------------------------------------ role bookkeeping
    def forget_load(self, rnd: ClientRound) -> None:
        if rnd.fsm_state == "aborted":
            floor = self._round_floor.get(rnd.kv_request_id) or 0
            self._round_floor.put(rnd.kv_request_id, max(floor, rnd.round_seq + 1), self.now)
        rounds = self._loads[rnd.kv_request_id]
        del rounds[rnd.round_seq]
        if not rounds:
            del self._loads[rnd.kv_request_id]
        self._load_count -= 1
        self._load_jobs.discard(rnd.job_id)

    def bind_store_job(self, job_id: int, rnd: ServerRound) -> None:
        self._store_jobs[job_id] = rnd

    def new_write(self, rnd: ServerRound) -> int:
        xfer = self._next_xfer
        self._next_xfer += 1
        self._writes[xfer] = rnd
        return xfer

    def forget_round(self, rnd: ServerRound) -> None:
        rounds = self._rounds[rnd.kv_request_id]
        del rounds[rnd.round_seq]
        if not rounds:
            del self._rounds[rnd.kv_request_id]
        del self._round_by_serial[rnd.serial]
        for job in rnd.jobs:
            self._store_jobs.pop(job, None)
        self.disarm(("store", rnd.serial))
        self.disarm(("demand", rnd.serial))

    def is_first_lookup(self, served: ServerLookup) -> bool:
        return self._served[served.kv_request_id][0] is served

    def forget_lookup(self, served: ServerLookup) -> None:
        del self._tokens[served.token]
        queue = self._served[served.kv_request_id]
        queue.remove(served)
        if not queue:
            del self._served[served.kv_request_id]

    def pin_lookup_hits(self, kv_request_id: str, round_seq: int, pin: LookupPin) -> None:
        rnd = self._round_for(kv_request_id, round_seq, "lookup")
        SERVER_ROUND.fire(rnd, "lookup_pin", pin)

    def expire_lookup_round(self, rnd: ServerRound) -> None:
        """The lookup pins of ``rnd`` expired before its fetch: that fetch fails fast."""
        assert rnd.round_seq is not None
        self._expired_lookups.put(rnd.kv_request_id, rnd.round_seq, self.now)

    def _round_for(self, kv_request_id: str, round_seq: int | None,
                   origin: str = "host") -> ServerRound:
        rounds = self._rounds.setdefault(kv_request_id, {})
        rnd = rounds.get(round_seq)
        if rnd is None:
            self._round_serial += 1
            rnd = ServerRound(self, self._round_serial, kv_request_id, round_seq, origin)
            rounds[round_seq] = rnd
            self._round_by_serial[rnd.serial] = rnd
        return rnd

    def _server_round(self, kv_request_id: str, round_seq: int | None) -> ServerRound | None:
        rounds = self._rounds.get(kv_request_id)
        return None if rounds is None else rounds.get(round_seq)

    def _client_round(self, kv_request_id: str, round_seq: int) -> ClientRound | None:
        rounds = self._loads.get(kv_request_id)
        return None if rounds is None else rounds.get(round_seq)

    def _settle(self, rnd: ServerRound) -> None:
        if rnd.fsm_state != "done":
            SERVER_ROUND.fire(rnd, "settle")

    def _settle_lookups(self, kv_request_id: str) -> None:
        # Answer in arrival order: stop at the first lookup that must still wait.
        while self._served.get(kv_request_id):
            head = self._served[kv_request_id][0]
            if SERVER_LOOKUP.fire(head, "settle") != "answered":
                return

    def _alloc_round(self, kv_request_id: str) -> int:
        """The round for a new load or lookup round of ``kv_request_id``.

        Like vLLM 0.33.0, a request with nothing open starts again at round 0 (its PD
        producers supply only round 0). A round number is never given to two rounds
        that could both still receive frames: live rounds are skipped, and so are rounds
        that ended with an abort whose duplicate abort_ack may still arrive (for a frame
        lifetime, Timeouts.tombstone). Channels are FIFO, so nothing else of an ended
        round can arrive after its terminal frame.
        """
        seq = self._round_floor.get(kv_request_id) or 0
        live = self._loads.get(kv_request_id)
        if live:
            seq = max(seq, max(live) + 1)
        return seq

    # --------------------------------------------------------------- frames
    def _on_frame(self, ev: FrameReceived) -> None:
        if self.fsm_state not in LIVE_STATES:
            self.emit(FrameIgnored("", f"session is {self.fsm_state}"))
            return
        try:
            msg = decode(ev.frame, self.config.limits)
        except UnknownMessageType as exc:
            self.emit(FrameIgnored(str(exc.reason), "unknown message type"))
            return
        except MalformedFrame as exc:
            self.emit(ProtocolViolation(exc))
            return
        try:
            _FRAME_HANDLERS[type(msg)](self, msg)
        except InvalidTransition as exc:
            self.emit(ProtocolViolation(RemoteProtocolError(
                "type", f"{msg.TYPE} not allowed: {exc}")))
        except RemoteProtocolError as exc:
            self.emit(ProtocolViolation(exc))

    def _gate(self, trigger: str, msg: Message) -> None:
        """Fire the session's gate for a non-handshake frame (validate first!)."""
        SESSION.fire(self, trigger, msg)

    def _check_gate(self, trigger: str) -> None:
        if not SESSION.can_fire(self, trigger):
            raise InvalidTransition(SESSION.name, self.fsm_state, trigger)

    def _on_connect(self, msg: Connect) -> None:
        SESSION.fire(self, "recv_connect", msg)

    def _on_connect_ack(self, msg: ConnectAck) -> None:
        SESSION.fire(self, "recv_connect_ack", msg)

    def _on_disconnect(self, msg: Disconnect) -> None:
        SESSION.fire(self, "recv_disconnect", msg)

    def _on_fetch(self, msg: Fetch) -> None:
        self._check_gate("recv_request")
        assert self.peer is not None  # the gate admits requests only after the peer's connect
        if msg.is_terminal:
            self._gate("recv_request", msg)
            self._close_request(msg.kv_request_id, "recv_terminal_fetch")
            return
        check_block_indexes(msg, self.peer.num_blocks)
        if len(set(msg.keys)) != len(msg.keys):
            raise MalformedFrame("keys", "duplicate keys in one fetch")
        rnd = self._server_round(msg.kv_request_id, msg.round_seq)
        if rnd is None and self._expired_lookups.get(msg.kv_request_id) == msg.round_seq:
            # The lookup pins of this round expired before the fetch: it can never be
            # served, so fail it now rather than let the consumer wait (vLLM P7).
            self._gate("recv_request", msg)
            self._expired_lookups.pop(msg.kv_request_id)
            self.send(TransferDone(msg.kv_request_id, False, msg.round_seq))
            return
        if rnd is None:
            unbound = self._server_round(msg.kv_request_id, None)
            if unbound is not None and unbound.fsm_state in ("supplied", "supply_closed"):
                rnd = unbound
        if rnd is not None and not SERVER_ROUND.can_fire(rnd, "recv_fetch", msg):
            raise RemoteProtocolError(
                "round_seq", f"duplicate fetch for {msg.kv_request_id}/{msg.round_seq}")
        self._gate("recv_request", msg)
        if rnd is not None and rnd.round_seq is None:
            rounds = self._rounds[msg.kv_request_id]
            del rounds[None]
            rnd.round_seq = msg.round_seq
            rounds[msg.round_seq] = rnd
        rnd = self._round_for(msg.kv_request_id, msg.round_seq)
        supplied = tuple(k for k in msg.keys if k in rnd.supply)
        SERVER_ROUND.fire(rnd, "recv_fetch", msg)
        self.emit(FetchArrived(msg.kv_request_id, msg.round_seq, msg.keys, supplied))
        self._settle(rnd)

    def _on_lookup(self, msg: Lookup) -> None:
        self._check_gate("recv_request")
        rnd = self._server_round(msg.kv_request_id, msg.round_seq)
        if rnd is not None and rnd.demanded:
            raise RemoteProtocolError(
                "round_seq", f"lookup for {msg.kv_request_id}/{msg.round_seq} after its fetch")
        self._gate("recv_request", msg)
        self._next_token += 1
        served = ServerLookup(self, self._next_token, msg.kv_request_id, msg.round_seq, msg.keys)
        self._tokens[served.token] = served
        self._served.setdefault(msg.kv_request_id, []).append(served)
        SERVER_LOOKUP.fire(served, "recv_lookup", msg)
        self._settle_lookups(msg.kv_request_id)

    def _on_abort_fetch(self, msg: AbortFetch) -> None:
        self._check_gate("recv_request")
        self._gate("recv_request", msg)
        rnd = self._server_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            # Nothing of that round is in flight (unknown or already ended): ack at once.
            self.send(AbortAck(msg.kv_request_id, msg.round_seq))
            return
        SERVER_ROUND.fire(rnd, "recv_abort_fetch", msg)
        self._settle(rnd)

    def _on_transfer_done(self, msg: TransferDone) -> None:
        self._check_gate("recv_response")
        rnd = self._client_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            self.emit(FrameIgnored(msg.TYPE, "no open load for this round (late or duplicate)"))
            return
        self._gate("recv_response", msg)
        CLIENT_ROUND.fire(rnd, "recv_transfer_done", msg)

    def _on_abort_ack(self, msg: AbortAck) -> None:
        self._check_gate("recv_response")
        rnd = self._client_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            self.emit(FrameIgnored(msg.TYPE, "no open load for this round (late or duplicate)"))
            return
        if not CLIENT_ROUND.can_fire(rnd, "recv_abort_ack", msg):
            raise RemoteProtocolError("round_seq", "abort_ack for a round we did not abort")
        self._gate("recv_response", msg)
        CLIENT_ROUND.fire(rnd, "recv_abort_ack", msg)

    def _on_lookup_resp(self, msg: LookupResp) -> None:
        self._check_gate("recv_response")
        lookups = self._lookups.get(msg.kv_request_id, [])
        same = [lk for lk in lookups if lk.keys == msg.keys]
        match = next((lk for lk in same if lk.fsm_state == "probing"), same[0] if same else None)
        if match is None:
            self.emit(FrameIgnored(msg.TYPE, "no open lookup with these keys"))
            return
        self._gate("recv_response", msg)
        CLIENT_LOOKUP.fire(match, "recv_lookup_resp", msg)
        self._drop_closed_lookups(msg.kv_request_id)

    def _drop_closed_lookups(self, kv_request_id: str) -> None:
        lookups = self._lookups.get(kv_request_id)
        if lookups is None:
            return
        for lk in lookups:
            if lk.fsm_state not in ("probing", "expired"):
                del self._lookup_by_serial[lk.serial]
        lookups[:] = [lk for lk in lookups if lk.fsm_state in ("probing", "expired")]
        if not lookups:
            del self._lookups[kv_request_id]

    def _close_request(self, kv_request_id: str, trigger: str) -> None:
        """The request ended (terminal fetch or host finish): close its served side."""
        self._expired_lookups.pop(kv_request_id)
        for served in list(self._served.get(kv_request_id, ())):
            SERVER_LOOKUP.fire(served, "request_closed")
        for rnd in list(self._rounds.get(kv_request_id, {}).values()):
            if SERVER_ROUND.can_fire(rnd, trigger):
                SERVER_ROUND.fire(rnd, trigger)
                self._settle(rnd)

    # ------------------------------------------------------------ host calls
    def _on_start(self, ev: HostStart) -> None:
        self._host_fire(SESSION, self, "host_start", ev)

    def _on_close(self, ev: HostClose) -> None:
        if self.fsm_state == "closed":
            return
        SESSION.fire(self, "host_close", ev)

    def _host_fire(self, m: CompiledMachine, obj: object, trigger: str, ev: object) -> None:
        try:
            m.fire(obj, trigger, ev)  # type: ignore[arg-type]
        except InvalidTransition as exc:
            raise LocalProtocolError(f"{trigger} not allowed: {exc}") from exc

    def _require_started(self, what: str) -> None:
        if self.fsm_state == "idle":
            raise LocalProtocolError(f"{what}: the session is not started (HostStart first)")

    def _check_request_id(self, kv_request_id: str, what: str) -> None:
        """A request id our peer's decoder accepts (else the frame would be dropped there)."""
        limit = self.config.limits.max_str_len
        if type(kv_request_id) is not str or not kv_request_id:
            raise LocalProtocolError(f"{what}: kv_request_id must be a non-empty str, "
                                     f"got {kv_request_id!r}")
        if len(kv_request_id.encode("utf-8", "surrogatepass")) > limit:
            raise LocalProtocolError(f"{what}: kv_request_id longer than {limit} bytes")

    def _check_keys(self, keys: tuple[bytes, ...], indexes: tuple[int, ...], what: str,
                    kv_request_id: str) -> None:
        self._check_request_id(kv_request_id, what)
        if len(keys) != len(indexes):
            raise LocalProtocolError(f"{what}: {len(keys)} keys but {len(indexes)} indexes")
        max_key = self.config.limits.max_key_bytes
        for i, key in enumerate(keys):
            if type(key) is not bytes or not key or len(key) > max_key:
                raise LocalProtocolError(
                    f"{what}: keys[{i}] must be non-empty bytes of at most {max_key}")
        if len(set(keys)) != len(keys):
            raise LocalProtocolError(f"{what}: duplicate keys")
        if len(keys) > self.config.limits.max_list_items:
            raise LocalProtocolError(
                f"{what}: {len(keys)} keys, more than {self.config.limits.max_list_items}")
        for i, idx in enumerate(indexes):
            if type(idx) is not int or not 0 <= idx < self.config.num_blocks:
                raise LocalProtocolError(
                    f"{what}: index[{i}]={idx!r} outside our {self.config.num_blocks} blocks")

    def _on_host_fetch(self, ev: HostFetch) -> None:
        self._require_started("fetch")
        self._check_keys(ev.keys, ev.dest_indexes, "fetch", ev.kv_request_id)
        if ev.job_id in self._load_jobs:
            raise LocalProtocolError(f"fetch: job {ev.job_id} is already loading")
        if not self.alive:
            self.emit(LoadResult(ev.job_id, ev.kv_request_id, False, True))
            return
        if not ev.keys:
            self.emit(LoadResult(ev.job_id, ev.kv_request_id, True, True))
            return
        seq = self._lookup_round.pop(ev.kv_request_id, None)
        if seq is None:
            seq = self._alloc_round(ev.kv_request_id)
        rnd = ClientRound(self, ev.job_id, ev.kv_request_id, seq, ev.keys, ev.dest_indexes)
        self._loads.setdefault(ev.kv_request_id, {})[seq] = rnd
        self._load_count += 1
        self._load_jobs.add(ev.job_id)
        CLIENT_ROUND.fire(rnd, "host_fetch", ev)

    def _on_host_lookup(self, ev: HostLookup) -> None:
        self._require_started("lookup")
        self._check_keys(ev.keys, tuple(0 for _ in ev.keys), "lookup", ev.kv_request_id)
        if not self.alive or not ev.keys:
            self.emit(LookupResult(ev.kv_request_id, ev.keys, (False,) * len(ev.keys), False))
            return
        seq = self._lookup_round.get(ev.kv_request_id)
        if seq is None:
            seq = self._alloc_round(ev.kv_request_id)
            self._lookup_round[ev.kv_request_id] = seq
        self._lookup_serial += 1
        lk = ClientLookup(self, self._lookup_serial, ev.kv_request_id, seq, ev.keys)
        self._lookups.setdefault(ev.kv_request_id, []).append(lk)
        self._lookup_by_serial[lk.serial] = lk
        CLIENT_LOOKUP.fire(lk, "host_lookup", ev)

    def _on_host_supply(self, ev: HostSupply) -> None:
        self._require_started("supply")
        self._check_keys(ev.keys, ev.local_indexes, "supply", ev.kv_request_id)
        if ev.job_id in self._store_jobs:
            raise LocalProtocolError(f"supply: job {ev.job_id} is already pinned")
        if self.fsm_state in ("dead", "closed"):
            self.emit(StoreResult(ev.job_id, False))
            return
        rnd = self._supply_target(ev)
        SERVER_ROUND.fire(rnd, "host_supply", ev)
        self._settle(rnd)

    def _supply_target(self, ev: HostSupply) -> ServerRound:
        """The round PD supply (which names no round) belongs to.

        The PD round whose demand names one of the keys; else the parked unbound round;
        else the latest PD round that has ended its supply (it rejects the job at once);
        else a new unbound round that the next fetch of the request adopts.
        """
        rounds = [r for r in self._rounds.get(ev.kv_request_id, {}).values()
                  if r.origin == "host"]
        for rnd in rounds:
            if rnd.demand and any(k in rnd.demand for k in ev.keys):
                return rnd
        unbound = self._server_round(ev.kv_request_id, None)
        if unbound is not None:
            return unbound
        closed = [r for r in rounds if r.fsm_state != "serving"]
        if closed:
            return closed[-1]
        serving = [r for r in rounds if r.fsm_state == "serving"]
        return serving[-1] if serving else self._round_for(ev.kv_request_id, None)

    def _on_host_answer(self, ev: HostAnswerLookup) -> None:
        served = self._tokens.get(ev.token)
        if ev.hits and ev.job_id is None:
            raise LocalProtocolError("answer_lookup: hits need the job_id that pins them")
        if ev.job_id is not None and ev.job_id in self._store_jobs:
            raise LocalProtocolError(f"answer_lookup: job {ev.job_id} is already pinned")
        if served is None:
            # The lookup ended meanwhile (terminal fetch, finish, death): free the pins now.
            if ev.hits and ev.job_id is not None:
                self.emit(StoreResult(ev.job_id, False))
            return
        unknown = [k for k in (*ev.hits, *ev.pending) if k not in served.pending]
        if unknown:
            raise LocalProtocolError(f"answer_lookup: keys not pending in lookup {ev.token}")
        for idx in ev.hits.values():
            if type(idx) is not int or not 0 <= idx < self.config.num_blocks:
                raise LocalProtocolError(f"answer_lookup: index {idx!r} for key outside region")
        rnd = self._server_round(served.kv_request_id, served.round_seq)
        if ev.hits and rnd is not None and not SERVER_ROUND.can_fire(rnd, "lookup_pin"):
            self.emit(StoreResult(ev.job_id or 0, False))
            ev = HostAnswerLookup(ev.token, {}, None, ev.pending)
        SERVER_LOOKUP.fire(served, "host_answer", ev)
        self._settle_lookups(served.kv_request_id)

    def _on_host_finish(self, ev: HostFinish) -> None:
        self._require_started("finish")
        self._check_request_id(ev.kv_request_id, "finish")
        rid = ev.kv_request_id
        for rnd in list(self._loads.get(rid, {}).values()):
            CLIENT_ROUND.fire(rnd, "host_finish", ev)
        for lk in list(self._lookups.get(rid, ())):
            CLIENT_LOOKUP.fire(lk, "host_finish", ev)
        self._drop_closed_lookups(rid)
        open_round = self._lookup_round.pop(rid, None)
        if open_round is not None and self.alive:
            self.send(Fetch(rid, (), (), open_round))
        self._close_request(rid, "host_finish")

    # ------------------------------------------------------- executor events
    def _on_registration(self, ev: RegistrationFinished) -> None:
        trigger = "registration_done" if ev.ok else "registration_failed"
        if SESSION.can_fire(self, trigger, ev):
            SESSION.fire(self, trigger, ev)
        else:
            self.emit(FrameIgnored("", f"registration result in state {self.fsm_state}"))

    def _on_write(self, ev: WriteFinished) -> None:
        rnd = self._writes.pop(ev.xfer, None)
        if rnd is None:
            raise LocalProtocolError(f"write {ev.xfer} is not in flight")
        SERVER_ROUND.fire(rnd, "write_done" if ev.ok else "write_failed", ev)
        self._settle(rnd)

    def _on_transport_lost(self, ev: TransportLost) -> None:
        if self.alive:
            SESSION.fire(self, "transport_lost", ev)

    def _on_timer(self, ev: TimerFired) -> None:
        timer = ev.timer
        if self._timers.get(timer) is None or self._timers[timer] > self.now:
            return  # disarmed, re-armed or early: stale
        del self._timers[timer]
        kind = timer[0]
        if kind == "handshake":
            SESSION.fire(self, "timer_handshake", ev)
        elif kind in ("load", "abort_ack"):
            load = self._loads[str(timer[1])][int(timer[2])]
            CLIENT_ROUND.fire(load, f"timer_{kind}", ev)
        elif kind == "lookup":
            lookup = self._lookup_by_serial[int(timer[1])]
            CLIENT_LOOKUP.fire(lookup, "timer_lookup", ev)
            self._drop_closed_lookups(lookup.kv_request_id)
        elif kind == "demand":
            rnd = self._round_by_serial[int(timer[1])]
            SERVER_ROUND.fire(rnd, "timer_demand", ev)
            self._settle(rnd)
        elif kind == "store":
            rnd = self._round_by_serial[int(timer[1])]
            SERVER_ROUND.fire(rnd, "timer_store", ev)
        elif kind == "lookup_pending":
            served = self._tokens[int(timer[1])]
            SERVER_LOOKUP.fire(served, "timer_lookup_pending", ev)
            self._settle_lookups(served.kv_request_id)


SESSION = CompiledMachine(machine("session"), Session)

_HANDLERS: dict[type, Callable[[Session, object], None]] = {
    FrameReceived: Session._on_frame,  # type: ignore[dict-item]
    TimerFired: Session._on_timer,  # type: ignore[dict-item]
    RegistrationFinished: Session._on_registration,  # type: ignore[dict-item]
    WriteFinished: Session._on_write,  # type: ignore[dict-item]
    TransportLost: Session._on_transport_lost,  # type: ignore[dict-item]
    HostStart: Session._on_start,  # type: ignore[dict-item]
    HostFetch: Session._on_host_fetch,  # type: ignore[dict-item]
    HostLookup: Session._on_host_lookup,  # type: ignore[dict-item]
    HostSupply: Session._on_host_supply,  # type: ignore[dict-item]
    HostAnswerLookup: Session._on_host_answer,  # type: ignore[dict-item]
    HostFinish: Session._on_host_finish,  # type: ignore[dict-item]
    HostClose: Session._on_close,  # type: ignore[dict-item]
}

_FRAME_HANDLERS: dict[type, Callable[[Session, Message], None]] = {
    Connect: Session._on_connect,  # type: ignore[dict-item]
    ConnectAck: Session._on_connect_ack,  # type: ignore[dict-item]
    Disconnect: Session._on_disconnect,  # type: ignore[dict-item]
    Fetch: Session._on_fetch,  # type: ignore[dict-item]
    Lookup: Session._on_lookup,  # type: ignore[dict-item]
    AbortFetch: Session._on_abort_fetch,  # type: ignore[dict-item]
    TransferDone: Session._on_transfer_done,  # type: ignore[dict-item]
    AbortAck: Session._on_abort_ack,  # type: ignore[dict-item]
    LookupResp: Session._on_lookup_resp,  # type: ignore[dict-item]
}
