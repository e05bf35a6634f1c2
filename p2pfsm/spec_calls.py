"""``Session.handle`` calls named as actions of the TLA+ spec (``tla/P2P.tla``).

One mapping, shared by the simulated tracer (:class:`p2pfsm.verify.traces.TracingWorld`)
and a Node's opt-in trace log (``NodeConfig.trace``): from the session's state before a
call, the input and the machine steps the :class:`~p2pfsm.fsm.Tracer` recorded during
the call, :func:`call_action` names the spec action the call is, or None when the spec
takes no step for it. Action names are derived from (machine, trigger) by
:func:`action_name`, never mapped by hand. Pure: no I/O, and no TLC (the executor
imports it without :mod:`p2pfsm.verify`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from p2pfsm.fsm import TraceRecord
from p2pfsm.protocol import Fetch, decode
from p2pfsm.session import (
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
    TransportLost,
    WriteFinished,
)
from p2pfsm.session.core import LIVE_STATES

Step = tuple[str, str, str, str]
"""(machine, trigger, source, dest) of one fired transition."""


def pascal(snake: str) -> str:
    """``recv_transfer_done`` -> ``RecvTransferDone``."""
    return "".join(part[:1].upper() + part[1:] for part in snake.split("_") if part)


def action_name(machine: str, trigger: str) -> str:
    """The TLA+ action that starts ``trigger`` on ``machine``."""
    return pascal(machine) + pascal(trigger)


FRAME_ACTIONS = {
    "connect": ("session", "recv_connect"),
    "connect_ack": ("session", "recv_connect_ack"),
    "disconnect": ("session", "recv_disconnect"),
    "lookup": ("server_lookup", "recv_lookup"),
    "abort_fetch": ("server_round", "recv_abort_fetch"),
    "transfer_done": ("client_round", "recv_transfer_done"),
    "abort_ack": ("client_round", "recv_abort_ack"),
    "lookup_resp": ("client_lookup", "recv_lookup_resp"),
}
"""Frame type -> the (machine, trigger) its receipt starts (fetch: see action_of)."""
TIMER_ACTIONS = {
    "handshake": ("session", "timer_handshake"),
    "load": ("client_round", "timer_load"),
    "abort_ack": ("client_round", "timer_abort_ack"),
    "lookup": ("client_lookup", "timer_lookup"),
    "store": ("server_round", "timer_store"),
    "demand": ("server_round", "timer_demand"),
    "lookup_pending": ("server_lookup", "timer_lookup_pending"),
}
"""Timer kind (``TimerId[0]``) -> the (machine, trigger) its firing starts."""
_HOST_ACTIONS: dict[type, tuple[str, str]] = {
    HostStart: ("session", "host_start"),
    HostClose: ("session", "host_close"),
    HostFetch: ("client_round", "host_fetch"),
    HostLookup: ("client_lookup", "host_lookup"),
    HostSupply: ("server_round", "host_supply"),
    HostAnswerLookup: ("server_lookup", "host_answer"),
    HostFinish: ("client_round", "host_finish"),
}


def action_of(state: str, event: Input) -> str | None:
    """The spec action an input is, given the session state before it (None: no action)."""
    if isinstance(event, FrameReceived):
        if state not in LIVE_STATES:
            return "NetworkDiscard"
        msg = decode(event.frame)
        if isinstance(msg, Fetch):
            trigger = "recv_terminal_fetch" if msg.is_terminal else "recv_fetch"
            return action_name("server_round", trigger)
        return action_name(*FRAME_ACTIONS[msg.TYPE])
    if isinstance(event, TimerFired):
        return action_name(*TIMER_ACTIONS[str(event.timer[0])])
    if isinstance(event, WriteFinished):
        return action_name("server_round", "write_done" if event.ok else "write_failed")
    if isinstance(event, RegistrationFinished):
        if state not in ("registering", "registering_acked"):
            return None  # the session ended meanwhile: the result is ignored
        return action_name("session", "registration_done" if event.ok
                           else "registration_failed")
    if isinstance(event, TransportLost):
        return action_name("session", "transport_lost") if state in LIVE_STATES else None
    if isinstance(event, HostClose) and state == "closed":
        return None
    machine_trigger = _HOST_ACTIONS.get(type(event))
    return None if machine_trigger is None else action_name(*machine_trigger)


def call_action(state: str, event: Input, records: Sequence[TraceRecord]) -> str | None:
    """The spec action one ``Session.handle`` call was (None: the spec takes no step).

    Args:
        state: the session's state before the call.
        event: the input handled.
        records: what the Tracer recorded during the call.
    """
    if isinstance(event, TimerFired) and not records:
        return None  # a stale timer (disarmed or re-armed): it fires nothing
    if isinstance(event, HostAnswerLookup) and not records:
        return None  # the lookup had ended: the host's pins go back, no machine moves
    if isinstance(event, FrameReceived) and any(
            (r.machine, r.trigger) == ("session", "recv_stale") for r in records):
        return action_name("session", "recv_stale")  # a dead session's answer (or not)
    return action_of(state, event)


def steps_of(records: Iterable[TraceRecord]) -> frozenset[Step]:
    """The (machine, trigger, source, dest) steps of a call's records."""
    return frozenset((r.machine, r.trigger, r.source, r.dest) for r in records)
