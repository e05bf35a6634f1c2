"""Input dispatch: which machine each input reaches, read from ``models/inputs.toml``.

Every input class the table names gets its handler at import: frames are decoded and
validated, then a session frame fires its row's trigger on the session machine; any
other frame picks its row's trigger (the first variant whose field matches, e.g. a
terminal fetch), must pass its row's gate (the session machine refuses it, else
nothing changes) and goes with that :class:`~p2pfsm.session.route.Route` to the part
that takes that trigger (:data:`_PART_TAKES`). A timer finds its instance from
:attr:`TimerId.key` by the row's key fields (:data:`_FINDERS`) and fires the row's
trigger; every other input goes to its row's handler (:data:`_HOST`), which checks the
session and hands the call, with the row's trigger, to a part. :data:`HANDLERS` maps
each input type to its handler. An input, key, trigger or handler the table and the
code disagree on is a :class:`~p2pfsm.errors.ModelError` at import.

The handlers are plain functions of the session: they use only its public methods
(its owner interface: :meth:`Session.step`, its machine :attr:`Session.machine`) and
the parts' entry points.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any, Protocol

from p2pfsm.errors import (
    InvalidTransition,
    LocalProtocolError,
    MalformedFrame,
    ModelError,
    RemoteProtocolError,
    UnknownMessageType,
)
from p2pfsm.fsm import CompiledMachine, InputSpec, Tracer, input_table, machine
from p2pfsm.protocol import (
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    FetchRound,
    Message,
    decode,
    fetch_round,
)
from p2pfsm.session import inputs
from p2pfsm.session.checks import check_request_id
from p2pfsm.session.client import CLIENT_LOOKUP, CLIENT_ROUND
from p2pfsm.session.client_part import ClientPart
from p2pfsm.session.config import SessionConfig
from p2pfsm.session.inputs import (
    FrameReceived,
    HostAnswerLookup,
    HostClose,
    HostDecline,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    PeerGone,
    RegistrationFinished,
    TimerFired,
    TimerId,
    TransportLost,
    WriteFinished,
)
from p2pfsm.session.machine import LIVE_STATES
from p2pfsm.session.outputs import FrameIgnored, ProtocolViolation, ReleaseCause
from p2pfsm.session.owner import Owner
from p2pfsm.session.route import Route
from p2pfsm.session.server import SERVER_LOOKUP, SERVER_ROUND
from p2pfsm.session.server_part import ServerPart


class Routed(Owner, Protocol):
    """The session (:class:`~p2pfsm.session.core.Session`), as the dispatch sees it: its
    parts' owner interface, its parts, its config and state, two host-call checks."""

    fsm_state: str
    config: SessionConfig
    client: ClientPart
    server: ServerPart

    @property
    def fsm_label(self) -> str: ...

    @property
    def fsm_tracer(self) -> Tracer | None: ...

    def require_started(self, what: str) -> None: ...

    def take_timer(self, timer: TimerId) -> bool: ...


_SESSION_TERMINAL = machine("session").terminal


# ------------------------------------------------------------------ frames
def _on_frame(s: Routed, ev: FrameReceived) -> None:
    if s.fsm_state not in LIVE_STATES:
        if not s.machine.declares(s.fsm_state, _TABLE.stale) or not _on_stale(s, ev):
            s.emit(FrameIgnored("", f"session is {s.fsm_state}"))
        return
    try:  # _message, inline
        msg = ev.message if ev.message is not None else decode(ev.frame, s.config.limits)
    except UnknownMessageType as exc:
        s.emit(FrameIgnored(str(exc.reason), "unknown message type"))
        return
    except MalformedFrame as exc:
        s.emit(ProtocolViolation(exc))
        _answer_bad_fetch(s, fetch_round(ev.frame, s.config.limits))
        return
    try:
        row, takes = _FRAMES[msg.TYPE]
        trigger = row.trigger_for(msg)
        if takes is None:  # the session machine's own frame
            s.step(s.machine, s, trigger, msg)
        else:
            route, (part, take) = takes[trigger]
            if not s.machine.can_fire(s, route.gate):
                raise InvalidTransition(s.machine.name, s.fsm_state, route.gate)
            take(part(s), msg, route)
    except InvalidTransition as exc:
        s.emit(ProtocolViolation(RemoteProtocolError(
            "type", f"{msg.TYPE} not allowed: {exc}")))
    except RemoteProtocolError as exc:
        s.emit(ProtocolViolation(exc))
        if isinstance(exc, MalformedFrame) and isinstance(msg, Fetch) and msg.keys:
            _answer_bad_fetch(s, FetchRound(msg.kv_request_id, msg.round_seq))


def _message(s: Routed, ev: FrameReceived) -> Message:
    """The frame's message: the one the executor decoded already, else decoded now.

    Raises:
        UnknownMessageType, MalformedFrame: the frame does not decode.
    """
    if ev.message is not None:
        return ev.message
    return decode(ev.frame, s.config.limits)


def _answer_bad_fetch(s: Routed, named: FetchRound | None) -> None:
    """A fetch rejected as malformed that names its round gets transfer_done(false)
    for it, when the session machine accepts that (recv_bad_fetch)."""
    if named is not None and s.machine.can_fire(s, "recv_bad_fetch", named):
        s.step(s.machine, s, "recv_bad_fetch", named)


def _on_stale(s: Routed, ev: FrameReceived) -> bool:
    """A dead session's peer may still hold the session live (a one-sided transport
    loss): a well-formed request or response of it is answered, rate-limited. Its
    disconnect says it ended its side too: True, the frame was taken."""
    try:
        msg = _message(s, ev)
    except RemoteProtocolError:
        return False
    if isinstance(msg, Disconnect):
        row, _takes = _FRAMES[msg.TYPE]
        s.step(s.machine, s, row.trigger_for(msg), msg)
        return True
    if not isinstance(msg, Connect | ConnectAck):
        s.step(s.machine, s, _TABLE.stale, msg)
    return False


PartTake = tuple[Callable[[Routed], Any], Callable[[Any, Any, Route], None]]
_SERVER: Callable[[Routed], Any] = attrgetter("server")
_CLIENT: Callable[[Routed], Any] = attrgetter("client")
_PART_TAKES: dict[tuple[str, str], PartTake] = {
    ("server_round", "recv_fetch"): (_SERVER, ServerPart.on_fetch),
    ("server_round", "recv_terminal_fetch"): (_SERVER, ServerPart.on_terminal_fetch),
    ("server_lookup", "recv_lookup"): (_SERVER, ServerPart.on_lookup),
    ("server_round", "recv_abort_fetch"): (_SERVER, ServerPart.on_abort_fetch),
    ("client_round", "recv_transfer_done"): (_CLIENT, ClientPart.on_transfer_done),
    ("client_round", "recv_abort_ack"): (_CLIENT, ClientPart.on_abort_ack),
    ("client_lookup", "recv_lookup_resp"): (_CLIENT, ClientPart.on_lookup_resp),
}
"""(machine, trigger) of a frame row that is not the session's -> the part that takes it
(how to reach the part from the session, and its method)."""


# -------------------------------------------------------------- host calls
def _on_host_start(s: Routed, ev: HostStart) -> None:
    trigger = _ROWS["HostStart"].trigger
    try:
        s.step(s.machine, s, trigger, ev)
    except InvalidTransition as exc:
        raise LocalProtocolError(f"{trigger} not allowed: {exc}") from exc


def _on_host_close(s: Routed, ev: HostClose) -> None:
    if s.fsm_state in _SESSION_TERMINAL:  # closed: nothing more to do
        return
    s.step(s.machine, s, _ROWS["HostClose"].trigger, ev)


def _on_host_fetch(s: Routed, ev: HostFetch) -> None:
    s.require_started("fetch")
    s.client.on_host_fetch(ev, _ROWS["HostFetch"].trigger)


def _on_host_lookup(s: Routed, ev: HostLookup) -> None:
    s.require_started("lookup")
    s.client.on_host_lookup(ev, _ROWS["HostLookup"].trigger)


def _on_host_supply(s: Routed, ev: HostSupply) -> None:
    s.require_started("supply")
    s.server.on_host_supply(ev, _ROWS["HostSupply"].trigger)


def _on_host_decline(s: Routed, ev: HostDecline) -> None:
    s.require_started("decline")
    s.server.on_host_decline(ev, _ROWS["HostDecline"].trigger)


def _on_host_answer(s: Routed, ev: HostAnswerLookup) -> None:
    s.server.on_host_answer(ev, _ROWS["HostAnswerLookup"].trigger)


def _on_host_finish(s: Routed, ev: HostFinish) -> None:
    """Both parts end the request: the producer refuses supply for it from now on, the
    consumer's loads and lookups of it end, then its served side is closed."""
    s.require_started("finish")
    check_request_id(s.config, ev.kv_request_id, "finish")
    s.server.host_finished(ev.kv_request_id)
    row = _ROWS["HostFinish"]
    fan = dict(row.fanout)
    s.client.finish(ev, row.trigger, fan["client_lookup"])
    s.server.close_request(ev.kv_request_id, fan["server_round"])


def _on_result_registration(s: Routed, ev: RegistrationFinished) -> None:
    trigger = _ROWS["RegistrationFinished"].trigger_for(ev)
    if s.machine.can_fire(s, trigger, ev):
        s.step(s.machine, s, trigger, ev)
    else:
        s.emit(FrameIgnored("", f"registration result in state {s.fsm_state}"))


def _on_result_write(s: Routed, ev: WriteFinished) -> None:
    s.server.on_write(ev, _WRITE.trigger_for(ev))


def _on_result_peer_gone(s: Routed, ev: PeerGone) -> None:
    """The peer's writes are proven over: a session that is over releases what it holds
    (a live one holds nothing past its end: its loads still hear from the peer)."""
    if ev.cause not in _GONE_CAUSES:
        raise LocalProtocolError(f"peer_gone: cause must be one of {sorted(_GONE_CAUSES)}, "
                                 f"got {ev.cause!r}")
    if not s.alive:
        s.client.release_held(ev, _ROWS["PeerGone"].trigger)


_GONE_CAUSES = frozenset({ReleaseCause.PEER_RESTARTED.value, ReleaseCause.DATA_PLANE.value})


def _on_transport_lost(s: Routed, ev: TransportLost) -> None:
    if s.alive:
        s.step(s.machine, s, _ROWS["TransportLost"].trigger, ev)


_HOST: dict[str, Callable[[Routed, Any], None]] = {
    "host_start": _on_host_start,
    "host_close": _on_host_close,
    "host_fetch": _on_host_fetch,
    "host_lookup": _on_host_lookup,
    "host_supply": _on_host_supply,
    "host_decline": _on_host_decline,
    "host_answer": _on_host_answer,
    "host_finish": _on_host_finish,
    "result_registration": _on_result_registration,
    "result_write": _on_result_write,
    "result_peer_gone": _on_result_peer_gone,
    "transport_lost": _on_transport_lost,
}
"""``<kind>_<name>`` of each row that is neither a frame nor a timer -> its handler."""


# ------------------------------------------------------------------ timers
def _on_timer(s: Routed, ev: TimerFired) -> None:
    timer = ev.timer
    if not s.take_timer(timer):
        return  # disarmed, re-armed or early: stale
    row = _TIMERS[timer.kind]
    if row.machine == "session":
        s.step(s.machine, s, row.trigger, ev)
        return
    instance = _FINDERS[row.machine, row.key](s, timer.key)
    s.step(_MACHINES[row.machine], instance, row.trigger, ev)


_TABLE = input_table()
_ROWS = {row.event: row for row in _TABLE.inputs if row.kind not in ("frame", "timer")}
_TIMERS = _TABLE.of_kind("timer")
_WRITE = _ROWS["WriteFinished"]
TIMER_MACHINES: dict[str, str] = {name: row.machine for name, row in _TIMERS.items()}
"""Timer kind -> the machine whose instance it belongs to."""
_MACHINES: dict[str, CompiledMachine] = {
    m.name: m for m in (CLIENT_ROUND, CLIENT_LOOKUP, SERVER_ROUND, SERVER_LOOKUP)}
Finder = Callable[[Routed, tuple[str | int, ...]], object]
_FINDERS: dict[tuple[str, tuple[str, ...]], Finder] = {
    ("session", ()): lambda s, _k: s,
    ("client_round", ("kv_request_id", "round_seq")):
        lambda s, k: s.client.round_at(str(k[0]), int(k[1])),
    ("client_lookup", ("serial",)): lambda s, k: s.client.lookup_by_serial[int(k[0])],
    ("server_round", ("serial",)): lambda s, k: s.server.round_by_serial[int(k[0])],
    ("server_lookup", ("token",)): lambda s, k: s.server.tokens[int(k[0])],
}
"""How a timer's key names its machine's instance (the row's key fields)."""


def _event_class(row: InputSpec) -> type:
    cls = getattr(inputs, row.event, None)
    if not isinstance(cls, type):
        raise ModelError(f"models/inputs.toml: {row.kind} {row.name}: no input {row.event}")
    return cls


def _host_handler(row: InputSpec) -> Callable[[Routed, Any], None]:
    handler = _HOST.get(f"{row.kind}_{row.name}")
    if handler is None:
        raise ModelError(f"models/inputs.toml: no handler _on_{row.kind}_{row.name}")
    return handler


for _row in _TIMERS.values():
    if (_row.machine, _row.key) not in _FINDERS:
        raise ModelError(f"models/inputs.toml: timer {_row.name}: no instance of "
                         f"{_row.machine} is found by {list(_row.key)}")
Handler = Callable[[Routed, Any], None]
HANDLERS: dict[type, Handler] = {
    FrameReceived: _on_frame,
    TimerFired: _on_timer,
    **{_event_class(row): _host_handler(row) for row in _ROWS.values()},
}
"""Input type -> its handler."""


def _part_routes(row: InputSpec) -> dict[str, tuple[Route, PartTake]] | None:
    """A frame row's route and part per trigger it may fire (None: the session's own)."""
    if row.machine == "session":
        return None
    if row.gate is None:
        raise ModelError(f"models/inputs.toml: frame {row.name} to {row.machine} has no gate")
    routes: dict[str, tuple[Route, PartTake]] = {}
    for trigger in row.triggers:
        take = _PART_TAKES.get((row.machine, trigger))
        if take is None:
            raise ModelError(f"models/inputs.toml: no part takes frame {row.name} "
                             f"({row.machine}.{trigger})")
        routes[trigger] = Route(row.gate, trigger), take
    return routes


_FRAMES: dict[str, tuple[InputSpec, dict[str, tuple[Route, PartTake]] | None]] = {
    row.name: (row, _part_routes(row)) for row in _TABLE.of_kind("frame").values()}
"""Frame type -> its row and, unless the session machine takes it, its route and part
per trigger."""
