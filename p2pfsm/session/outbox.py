"""Applying a committed step's outbox, and retiring a child its step ended.

A child's actions only append to the step's outbox (:mod:`~p2pfsm.session.child`);
once the step has committed, the session hands the outbox to :func:`apply_outbox`,
which carries it out in order through the session's owner interface and its parts:
frames sent or queued, timers armed and disarmed, executor outputs emitted, what
belongs to a part's tables (write ids, store jobs, pins, bound rounds, expired lookup
rounds, held destinations) handed to that part, the session machine fired for what
ends the session, and a retired load's fetch withdrawn from the queue. :func:`retire`
drops a child whose machine reached a terminal state from the part that owns it. Both
reach the session only through :class:`Applying`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from p2pfsm.fsm import CompiledMachine
from p2pfsm.protocol import Message
from p2pfsm.session.child import (
    Arm,
    BindRound,
    ChildOutput,
    Disarm,
    EndRoles,
    EndSession,
    ExpireLookupRound,
    HoldJob,
    PinHits,
    ReleaseHeld,
    Send,
    WithdrawFetch,
)
from p2pfsm.session.client import ClientLookup, ClientRound
from p2pfsm.session.client_part import ClientPart
from p2pfsm.session.inputs import PeerGone, TimerId
from p2pfsm.session.outputs import Output, StartWrite, StoreResult
from p2pfsm.session.server import ServerLookup, ServerRound
from p2pfsm.session.server_part import ServerPart


class Applying(Protocol):
    """The session, as the outbox's application sees it."""

    machine: ClassVar[CompiledMachine]
    client: ClientPart
    server: ServerPart

    def send(self, message: Message) -> None: ...

    def arm(self, timer: TimerId, delay: float, *, keep: bool = False) -> None: ...

    def disarm(self, timer: TimerId) -> None: ...

    def emit(self, output: Output) -> None: ...

    def step_nested(self, m: CompiledMachine, obj: Any, trigger: str,
                    ev: object = None) -> str: ...

    def end_roles(self, trigger: str) -> None: ...

    def withdraw_fetch(self, kv_request_id: str, round_seq: int) -> None: ...


def apply_outbox(s: Applying, outbox: list[ChildOutput], obj: Any) -> None:
    """Carry out (and empty) ``outbox``, which the step of ``obj`` left, in order."""
    todo = outbox[:]
    outbox.clear()
    for item in todo:
        kind = type(item)
        if kind is Send:  # the common requests first
            s.send(item.message)  # type: ignore[union-attr]
        elif kind is Arm:
            s.arm(item.timer, item.delay, keep=item.keep)  # type: ignore[union-attr]
        elif kind is Disarm:
            s.disarm(item.timer)  # type: ignore[union-attr]
        elif kind is StartWrite:
            s.server.start_write(obj, item.xfer)  # type: ignore[union-attr]
            s.emit(item)  # type: ignore[arg-type]
        elif kind is HoldJob:
            s.server.hold_job(obj, item.job_id)  # type: ignore[union-attr]
        elif kind is StoreResult:
            s.server.store_jobs.pop(item.job_id, None)  # type: ignore[union-attr]
            s.emit(item)  # type: ignore[arg-type]
        elif kind is PinHits:
            s.server.pin_hits(item)  # type: ignore[arg-type]
        elif kind is ExpireLookupRound:
            s.server.expire(item)  # type: ignore[arg-type]
        elif kind is BindRound:
            s.server.bind_round(obj)
        elif kind is EndRoles:
            s.end_roles(item.trigger)  # type: ignore[union-attr]
        elif kind is EndSession:
            s.step_nested(s.machine, s, item.trigger, item)  # type: ignore[union-attr]
        elif kind is WithdrawFetch:
            s.withdraw_fetch(item.kv_request_id, item.round_seq)  # type: ignore[union-attr]
        elif kind is ReleaseHeld:
            cause = PeerGone(item.cause)  # type: ignore[union-attr]
            s.client.release_held(cause, "peer_gone")
        else:
            s.emit(item)  # type: ignore[arg-type]  # an executor output


def retire(s: Applying, obj: object) -> None:
    """Drop a child whose machine reached a terminal state from its part."""
    kind = type(obj)
    if kind is ClientRound:
        s.client.retire_round(obj)  # type: ignore[arg-type]
    elif kind is ClientLookup:
        s.client.retire_lookup(obj)  # type: ignore[arg-type]
    elif kind is ServerRound:
        s.server.retire_round(obj)  # type: ignore[arg-type]
    elif kind is ServerLookup:
        s.server.retire_lookup(obj)  # type: ignore[arg-type]
    else:
        raise TypeError(f"no part retires a {kind.__name__}")
