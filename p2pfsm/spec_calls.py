"""``Session.handle`` calls named as actions of the TLA+ spec (``tla/P2P.tla``).

One mapping, shared by the simulated tracer (:class:`p2pfsm.tools.verify.traces.TracingWorld`)
and a Node's opt-in trace log (``NodeConfig.trace``): from the session's state before a
call, the input and the machine steps the :class:`~p2pfsm.fsm.Tracer` recorded during
the call, :func:`call_action` names the spec action the call is, or None when the spec
takes no step for it. Which (machine, trigger) an input starts is read from the input
table (``models/inputs.toml``) and its action name derived by :func:`action_name`,
never mapped by hand. Pure: no I/O, and no TLC (the executor
imports it without :mod:`p2pfsm.tools.verify`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from p2pfsm.errors import RemoteProtocolError
from p2pfsm.fsm import TraceRecord, input_table, machine
from p2pfsm.protocol import decode, fetch_round
from p2pfsm.session import (
    FrameReceived,
    HostAnswerLookup,
    HostClose,
    Input,
    PeerGone,
    RegistrationFinished,
    TimerFired,
    TransportLost,
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


_TABLE = input_table()
FRAME_ACTIONS = {name: (row.machine, row.trigger) for name, row in _TABLE.of_kind("frame").items()}
"""Frame type -> the (machine, trigger) its receipt starts (``models/inputs.toml``)."""
TIMER_ACTIONS = {name: (row.machine, row.trigger) for name, row in _TABLE.of_kind("timer").items()}
"""Timer kind (``TimerId.kind``) -> the (machine, trigger) its firing starts."""
_ROWS = {row.event: row for row in _TABLE.inputs if row.kind not in ("frame", "timer")}
_SESSION = machine("session")
_REGISTERING = frozenset(s for t in _SESSION.transitions
                         if t.trigger in _ROWS["RegistrationFinished"].triggers for s in t.sources)
"""Session states a registration result can still reach (else the result is ignored)."""
STALE_STATES = frozenset(s for t in _SESSION.transitions if t.trigger == _TABLE.stale
                         for s in t.sources)
"""Session states that answer a frame as stale (a dead session's peer still sends)."""


def action_of(state: str, event: Input) -> str | None:
    """The spec action an input is, given the session state before it (None: no action)."""
    if isinstance(event, FrameReceived):
        if state not in LIVE_STATES:
            return "NetworkDiscard"
        try:
            msg = event.message if event.message is not None else decode(event.frame)
        except RemoteProtocolError:
            # A malformed frame: the spec has one kind, a fetch still naming its round.
            bad = fetch_round(event.frame) is not None
            return action_name("session", "recv_bad_fetch") if bad else None
        row = _TABLE.of_kind("frame")[msg.TYPE]
        return action_name(row.machine, row.trigger_for(msg))
    if isinstance(event, TimerFired):
        return action_name(*TIMER_ACTIONS[event.timer.kind])
    row = _ROWS[type(event).__name__]
    if isinstance(event, RegistrationFinished) and state not in _REGISTERING:
        return None  # the session ended meanwhile: the result is ignored
    if isinstance(event, TransportLost) and state not in LIVE_STATES:
        return None
    if isinstance(event, HostClose) and state in _SESSION.terminal:
        return None
    return action_name(row.machine, row.trigger_for(event))


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
    if isinstance(event, PeerGone) and not records:
        return None  # a live session, or nothing held: no destination is released
    if isinstance(event, FrameReceived) and any(
            (r.machine, r.trigger) == ("session", _TABLE.stale) for r in records):
        return action_name("session", _TABLE.stale)  # a dead session's answer (or not)
    if isinstance(event, FrameReceived) and state in STALE_STATES and records:
        # The peer's disconnect reaching a dead session: the frame row's own trigger.
        return action_name(records[0].machine, records[0].trigger)
    return action_of(state, event)


def steps_of(records: Iterable[TraceRecord]) -> frozenset[Step]:
    """The (machine, trigger, source, dest) steps of a call's records."""
    return frozenset((r.machine, r.trigger, r.source, r.dest) for r in records)
