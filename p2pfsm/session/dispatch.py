"""Input dispatch: which machine each input reaches.

Frames are decoded and validated, then passed to the role that owns their instance;
handshake frames, host start/close/finish, registration results, transport loss and
timers are routed here. :data:`HANDLERS` maps each input type to its handler.
"""

from __future__ import annotations

from collections.abc import Callable

from p2pfsm.errors import (
    InvalidTransition,
    LocalProtocolError,
    MalformedFrame,
    RemoteProtocolError,
    UnknownMessageType,
)
from p2pfsm.fsm import CompiledMachine
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
    decode,
)
from p2pfsm.session.base import LIVE_STATES
from p2pfsm.session.client import CLIENT_LOOKUP, CLIENT_ROUND
from p2pfsm.session.consumer import ConsumerRole
from p2pfsm.session.inputs import (
    FrameReceived,
    HostAnswerLookup,
    HostClose,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    RegistrationFinished,
    TimerFired,
    TransportLost,
    WriteFinished,
)
from p2pfsm.session.machine import SESSION
from p2pfsm.session.outputs import FrameIgnored, ProtocolViolation
from p2pfsm.session.producer import ProducerRole
from p2pfsm.session.server import SERVER_LOOKUP, SERVER_ROUND


class InputDispatch(ConsumerRole, ProducerRole):
    """Routes every input to the machine instance that receives it."""

    def _on_frame(self, ev: FrameReceived) -> None:
        if self.fsm_state not in LIVE_STATES:
            if self.fsm_state == "dead":
                self._on_stale(ev)
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

    def _on_stale(self, ev: FrameReceived) -> None:
        """A dead session's peer may still hold the session live (a one-sided transport
        loss): a well-formed request or response of it is answered, rate-limited."""
        try:
            msg = decode(ev.frame, self.config.limits)
        except RemoteProtocolError:
            return
        if not isinstance(msg, Connect | ConnectAck | Disconnect):
            SESSION.fire(self, "recv_stale", msg)

    def _on_connect(self, msg: Connect) -> None:
        SESSION.fire(self, "recv_connect", msg)

    def _on_connect_ack(self, msg: ConnectAck) -> None:
        SESSION.fire(self, "recv_connect_ack", msg)

    def _on_disconnect(self, msg: Disconnect) -> None:
        SESSION.fire(self, "recv_disconnect", msg)

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

    def _on_registration(self, ev: RegistrationFinished) -> None:
        trigger = "registration_done" if ev.ok else "registration_failed"
        if SESSION.can_fire(self, trigger, ev):
            SESSION.fire(self, trigger, ev)
        else:
            self.emit(FrameIgnored("", f"registration result in state {self.fsm_state}"))

    def _on_transport_lost(self, ev: TransportLost) -> None:
        if self.alive:
            SESSION.fire(self, "transport_lost", ev)

    def _on_timer(self, ev: TimerFired) -> None:
        timer = ev.timer
        if self._timers.get(timer) is None or self._timers[timer] > self.now:
            return  # disarmed, re-armed or early: stale
        del self._timers[timer]
        kind, key = timer
        if kind == "handshake":
            SESSION.fire(self, "timer_handshake", ev)
        elif kind in ("load", "abort_ack"):
            load = self._loads[str(key[0])][int(key[1])]
            CLIENT_ROUND.fire(load, f"timer_{kind}", ev)
        elif kind == "lookup":
            lookup = self._lookup_by_serial[int(key[0])]
            CLIENT_LOOKUP.fire(lookup, "timer_lookup", ev)
            self._drop_closed_lookups(lookup.kv_request_id)
        elif kind == "demand":
            rnd = self._round_by_serial[int(key[0])]
            SERVER_ROUND.fire(rnd, "timer_demand", ev)
            self._settle(rnd)
        elif kind == "store":
            rnd = self._round_by_serial[int(key[0])]
            SERVER_ROUND.fire(rnd, "timer_store", ev)
        elif kind == "lookup_pending":
            served = self._tokens[int(key[0])]
            SERVER_LOOKUP.fire(served, "timer_lookup_pending", ev)
            self._settle_lookups(served.kv_request_id)

    def _end_roles(self, load_trigger: str) -> None:
        self._end_consumer(load_trigger)
        self._end_producer()
        for timer in [t for t in self._timers if t.kind not in ("store", "demand")]:
            self.disarm(timer)


HANDLERS: dict[type, Callable[[InputDispatch, object], None]] = {
    FrameReceived: InputDispatch._on_frame,  # type: ignore[dict-item]
    TimerFired: InputDispatch._on_timer,  # type: ignore[dict-item]
    RegistrationFinished: InputDispatch._on_registration,  # type: ignore[dict-item]
    WriteFinished: InputDispatch._on_write,  # type: ignore[dict-item]
    TransportLost: InputDispatch._on_transport_lost,  # type: ignore[dict-item]
    HostStart: InputDispatch._on_start,  # type: ignore[dict-item]
    HostFetch: InputDispatch._on_host_fetch,  # type: ignore[dict-item]
    HostLookup: InputDispatch._on_host_lookup,  # type: ignore[dict-item]
    HostSupply: InputDispatch._on_host_supply,  # type: ignore[dict-item]
    HostAnswerLookup: InputDispatch._on_host_answer,  # type: ignore[dict-item]
    HostFinish: InputDispatch._on_host_finish,  # type: ignore[dict-item]
    HostClose: InputDispatch._on_close,  # type: ignore[dict-item]
}
"""Input type -> its handler."""

_FRAME_HANDLERS: dict[type, Callable[[InputDispatch, Message], None]] = {
    Connect: InputDispatch._on_connect,  # type: ignore[dict-item]
    ConnectAck: InputDispatch._on_connect_ack,  # type: ignore[dict-item]
    Disconnect: InputDispatch._on_disconnect,  # type: ignore[dict-item]
    Fetch: InputDispatch._on_fetch,  # type: ignore[dict-item]
    Lookup: InputDispatch._on_lookup,  # type: ignore[dict-item]
    AbortFetch: InputDispatch._on_abort_fetch,  # type: ignore[dict-item]
    TransferDone: InputDispatch._on_transfer_done,  # type: ignore[dict-item]
    AbortAck: InputDispatch._on_abort_ack,  # type: ignore[dict-item]
    LookupResp: InputDispatch._on_lookup_resp,  # type: ignore[dict-item]
}
