"""The session's state and the helpers every part of it uses.

:class:`SessionBase` holds everything a :class:`~p2pfsm.session.core.Session` keeps
(the session machine's data, both roles' instance maps, timers, the step's outputs,
the children's outbox) and the output helpers the session machine's actions and the
owner's outbox application use (emit, send, arm, disarm), the queries the host reads,
and the checks of host-call arguments. It fires no machine itself.
"""

from __future__ import annotations

from p2pfsm.errors import HandshakeMismatch, LocalProtocolError
from p2pfsm.fsm import Tracer, machine
from p2pfsm.protocol import Connect, ConnectAck, Disconnect, Message
from p2pfsm.protocol.validate import bytes_within, ints_within
from p2pfsm.session.child import ChildEnv
from p2pfsm.session.client import ClientLookup, ClientRound
from p2pfsm.session.config import SessionConfig
from p2pfsm.session.inputs import TimerId
from p2pfsm.session.outputs import ArmTimer, DisarmTimer, Output, SendFrame
from p2pfsm.session.server import ServerLookup, ServerRound
from p2pfsm.session.tombstones import Tombstones

_HANDSHAKE_TYPES = (Connect, ConnectAck, Disconnect)
LIVE_STATES = machine("session").state_set("live")
"""Session states in which the peer may still hear from us (models/session.toml [sets])."""
_OPEN = machine("session").state_set("open")
_UNSTARTED = machine("session").state_set("unstarted")


class SessionBase:
    """A session's state, output helpers, queries and host-call checks.

    Args:
        config: our identity, layout and deadlines.
        tracer: when given, records every fired transition.
    """

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
        self._timers: dict[TimerId, float] = {}
        # What the children's actions asked for (applied after each step) and which
        # state-triggered steps are due (the cascade).
        self._env = ChildEnv(config.timeouts, tracer, config.answer_lookups_in_parts)
        self._unsettled: list[ServerRound | str] = []
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
        # Requests the host finished: a supply for one is refused (kept a frame lifetime).
        self._finished = Tombstones(config.timeouts.tombstone)
        # Requests the peer finished (its terminal fetch; its round_seq), until a fetch or
        # lookup of one names a round again: a supply that would open a new round of one
        # is refused at once (kept a frame lifetime).
        self._peer_finished = Tombstones(config.timeouts.tombstone)
        self._store_jobs: dict[int, ServerRound] = {}
        self._writes: dict[int, ServerRound] = {}
        self._served: dict[str, list[ServerLookup]] = {}
        self._tokens: dict[int, ServerLookup] = {}
        self._next_token = 0

    fsm_data = ("peer", "death_reason", "mismatch", "last_disconnect", "_queue")
    """What the session machine's actions write (restored should one raise)."""

    @property
    def tracer(self) -> Tracer | None:
        """Records every fired transition (the session's and its children's) when set."""
        return self._env.tracer

    @tracer.setter
    def tracer(self, tracer: Tracer | None) -> None:
        self._env.tracer = tracer

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
        return self.fsm_state in _OPEN

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

    # ---------------------------------------------------------- output helpers

    def emit(self, output: Output) -> None:
        self._out.append(output)

    def send(self, message: Message) -> None:
        """Send now when ready (or a handshake frame); else queue in order."""
        if self.fsm_state in _OPEN or isinstance(message, _HANDSHAKE_TYPES):
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

    # ------------------------------------------------------- host-call checks
    def _require_started(self, what: str) -> None:
        if self.fsm_state in _UNSTARTED:
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
        if not bytes_within(keys, 1, max_key):  # the loop only names the culprit
            for i, key in enumerate(keys):
                if type(key) is not bytes or not key or len(key) > max_key:
                    raise LocalProtocolError(
                        f"{what}: keys[{i}] must be non-empty bytes of at most {max_key}")
        if len(set(keys)) != len(keys):
            raise LocalProtocolError(f"{what}: duplicate keys")
        if len(keys) > self.config.limits.max_list_items:
            raise LocalProtocolError(
                f"{what}: {len(keys)} keys, more than {self.config.limits.max_list_items}")
        blocks = self.config.num_blocks
        if not ints_within(indexes, 0, blocks - 1):
            for i, idx in enumerate(indexes):
                if type(idx) is not int or not 0 <= idx < blocks:
                    raise LocalProtocolError(
                        f"{what}: index[{i}]={idx!r} outside our {blocks} blocks")
