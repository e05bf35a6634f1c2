"""Input dispatch: which machine each input reaches, read from ``models/inputs.toml``.

Every input class the table names gets its handler at import: frames are decoded and
validated, then a session frame fires its row's trigger here and any other frame goes
to the role handler ``_on_<type>`` that finds (or creates) its instance; a timer finds
its instance from :attr:`TimerId.key` by the row's key fields and fires the row's
trigger; every other input goes to ``_on_<kind>_<name>``. :data:`HANDLERS` maps each
input type to its handler. An input, key or handler the table and the code disagree
on is a :class:`~p2pfsm.errors.ModelError` at import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from p2pfsm.errors import (
    InvalidTransition,
    LocalProtocolError,
    MalformedFrame,
    ModelError,
    RemoteProtocolError,
    UnknownMessageType,
)
from p2pfsm.fsm import CompiledMachine, InputSpec, input_table
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
from p2pfsm.session.base import LIVE_STATES
from p2pfsm.session.client import CLIENT_LOOKUP, CLIENT_ROUND
from p2pfsm.session.consumer import ConsumerRole
from p2pfsm.session.inputs import (
    FrameReceived,
    HostClose,
    HostFinish,
    HostStart,
    RegistrationFinished,
    TimerFired,
    TransportLost,
)
from p2pfsm.session.machine import SESSION
from p2pfsm.session.outputs import FrameIgnored, ProtocolViolation
from p2pfsm.session.producer import ProducerRole
from p2pfsm.session.server import SERVER_LOOKUP, SERVER_ROUND


class InputDispatch(ConsumerRole, ProducerRole):
    """Routes every input to the machine instance that receives it."""

    def _on_frame(self, ev: FrameReceived) -> None:
        if self.fsm_state not in LIVE_STATES:
            if not SESSION.declares(self.fsm_state, _TABLE.stale) or not self._on_stale(ev):
                self.emit(FrameIgnored("", f"session is {self.fsm_state}"))
            return
        try:
            msg = decode(ev.frame, self.config.limits)
        except UnknownMessageType as exc:
            self.emit(FrameIgnored(str(exc.reason), "unknown message type"))
            return
        except MalformedFrame as exc:
            self.emit(ProtocolViolation(exc))
            self._answer_bad_fetch(fetch_round(ev.frame, self.config.limits))
            return
        try:
            row, handler = _FRAME_HANDLERS[msg.TYPE]
            handler(self, row, msg)
        except InvalidTransition as exc:
            self.emit(ProtocolViolation(RemoteProtocolError(
                "type", f"{msg.TYPE} not allowed: {exc}")))
        except RemoteProtocolError as exc:
            self.emit(ProtocolViolation(exc))
            if isinstance(exc, MalformedFrame) and isinstance(msg, Fetch) and msg.keys:
                self._answer_bad_fetch(FetchRound(msg.kv_request_id, msg.round_seq))

    def _answer_bad_fetch(self, named: FetchRound | None) -> None:
        """A fetch rejected as malformed that names its round gets transfer_done(false)
        for it, when the session machine accepts that (recv_bad_fetch)."""
        if named is not None and SESSION.can_fire(self, "recv_bad_fetch", named):
            SESSION.fire(self, "recv_bad_fetch", named)

    def _on_stale(self, ev: FrameReceived) -> bool:
        """A dead session's peer may still hold the session live (a one-sided transport
        loss): a well-formed request or response of it is answered, rate-limited. Its
        disconnect says it ended its side too: True, the frame was taken."""
        try:
            msg = decode(ev.frame, self.config.limits)
        except RemoteProtocolError:
            return False
        if isinstance(msg, Disconnect):
            row, _handler = _FRAME_HANDLERS[msg.TYPE]
            SESSION.fire(self, row.trigger_for(msg), msg)
            return True
        if not isinstance(msg, Connect | ConnectAck):
            SESSION.fire(self, _TABLE.stale, msg)
        return False

    def _on_session_frame(self, row: InputSpec, msg: Message) -> None:
        SESSION.fire(self, row.trigger_for(msg), msg)

    def _on_role_frame(self, row: InputSpec, msg: Message) -> None:
        _ROLE_FRAME_HANDLERS[row.name](self, msg)

    # ------------------------------------------------------------ host calls

    def _on_host_start(self, ev: HostStart) -> None:
        self._host_fire(SESSION, self, _ROWS["HostStart"].trigger, ev)

    def _on_host_close(self, ev: HostClose) -> None:
        if self.fsm_state in SESSION.spec.terminal:  # closed: nothing more to do
            return
        SESSION.fire(self, _ROWS["HostClose"].trigger, ev)

    def _host_fire(self, m: CompiledMachine, obj: object, trigger: str, ev: object) -> None:
        try:
            m.fire(obj, trigger, ev)  # type: ignore[arg-type]
        except InvalidTransition as exc:
            raise LocalProtocolError(f"{trigger} not allowed: {exc}") from exc

    def _on_host_finish(self, ev: HostFinish) -> None:
        self._require_started("finish")
        self._check_request_id(ev.kv_request_id, "finish")
        rid = ev.kv_request_id
        self._finished.put(rid, 0, self.now)  # a supply for it is refused from now on
        row = _ROWS["HostFinish"]
        fan = dict(row.fanout)
        for rnd in list(self._loads.get(rid, {}).values()):
            self._step(CLIENT_ROUND, rnd, row.trigger, ev)
        for lk in list(self._lookups.get(rid, ())):
            self._step(CLIENT_LOOKUP, lk, fan["client_lookup"], ev)
        open_round = self._lookup_round.pop(rid, None)
        if open_round is not None and self.alive:
            self.send(Fetch(rid, (), (), open_round))
        self._close_request(rid, fan["server_round"])

    def _on_result_registration(self, ev: RegistrationFinished) -> None:
        trigger = _ROWS["RegistrationFinished"].trigger_for(ev)
        if SESSION.can_fire(self, trigger, ev):
            SESSION.fire(self, trigger, ev)
        else:
            self.emit(FrameIgnored("", f"registration result in state {self.fsm_state}"))

    def _on_transport_lost(self, ev: TransportLost) -> None:
        if self.alive:
            SESSION.fire(self, _ROWS["TransportLost"].trigger, ev)

    _on_result_write = ProducerRole._on_write

    def _on_timer(self, ev: TimerFired) -> None:
        timer = ev.timer
        if self._timers.get(timer) is None or self._timers[timer] > self.now:
            return  # disarmed, re-armed or early: stale
        del self._timers[timer]
        row = _TIMERS[timer.kind]
        instance = _FINDERS[row.machine, row.key](self, timer.key)
        self._step(_MACHINES[row.machine], instance, row.trigger, ev)

    def _end_roles(self, load_trigger: str) -> None:
        self._end_consumer(load_trigger)
        self._end_producer()
        for timer in [t for t in self._timers if _TIMERS[t.kind].machine != "server_round"]:
            self.disarm(timer)


_TABLE = input_table()
_ROWS = {row.event: row for row in _TABLE.inputs if row.kind not in ("frame", "timer")}
_TIMERS = _TABLE.of_kind("timer")
_MACHINES: dict[str, CompiledMachine] = {
    m.name: m for m in (SESSION, CLIENT_ROUND, CLIENT_LOOKUP, SERVER_ROUND, SERVER_LOOKUP)}
Finder = Callable[[InputDispatch, tuple[str | int, ...]], object]
_FINDERS: dict[tuple[str, tuple[str, ...]], Finder] = {
    ("session", ()): lambda s, _k: s,
    ("client_round", ("kv_request_id", "round_seq")):
        lambda s, k: s._loads[str(k[0])][int(k[1])],
    ("client_lookup", ("serial",)): lambda s, k: s._lookup_by_serial[int(k[0])],
    ("server_round", ("serial",)): lambda s, k: s._round_by_serial[int(k[0])],
    ("server_lookup", ("token",)): lambda s, k: s._tokens[int(k[0])],
}
"""How a timer's key names its machine's instance (the row's key fields)."""


def _handler(name: str) -> Callable[[InputDispatch, Any], None]:
    handler = getattr(InputDispatch, name, None)
    if handler is None:
        raise ModelError(f"models/inputs.toml: no handler InputDispatch.{name}")
    return cast(Callable[[InputDispatch, Any], None], handler)


def _event_class(row: InputSpec) -> type:
    cls = getattr(inputs, row.event, None)
    if not isinstance(cls, type):
        raise ModelError(f"models/inputs.toml: {row.kind} {row.name}: no input {row.event}")
    return cls


for _row in _TIMERS.values():
    if (_row.machine, _row.key) not in _FINDERS:
        raise ModelError(f"models/inputs.toml: timer {_row.name}: no instance of "
                         f"{_row.machine} is found by {list(_row.key)}")

Handler = Callable[[InputDispatch, object], None]
HANDLERS: dict[type, Handler] = {
    FrameReceived: cast(Handler, InputDispatch._on_frame),
    TimerFired: cast(Handler, InputDispatch._on_timer),
    **{_event_class(row): _handler(f"_on_{row.kind}_{row.name}") for row in _ROWS.values()},
}
"""Input type -> its handler."""

_ROLE_FRAME_HANDLERS: dict[str, Callable[[InputDispatch, Message], None]] = {
    row.name: _handler(f"_on_{row.name}")
    for row in _TABLE.of_kind("frame").values() if row.machine != "session"}
FrameHandler = Callable[[InputDispatch, InputSpec, Message], None]
_FRAME_HANDLERS: dict[str, tuple[InputSpec, FrameHandler]] = {
    row.name: (row, InputDispatch._on_session_frame if row.machine == "session"
               else InputDispatch._on_role_frame)
    for row in _TABLE.of_kind("frame").values()}
"""Frame type -> its row and handler."""
