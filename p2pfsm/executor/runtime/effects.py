"""What every executor of sessions shares: one output interface.

A session's outputs are carried out by an :class:`Executor`, the effects interface that
:class:`~p2pfsm.executor.runtime.driver.Driver` hands each output to: the real
:class:`~p2pfsm.executor.node.Node` (ZeroMQ + NIXL), the vLLM adapter and the simulated
:class:`~p2pfsm.sim.world.SimWorld` implement it, and :meth:`Executor.apply` is the
one place that maps an output type to the method that carries it out (a new output type
without a method fails :func:`check_handlers` at import, not silently at run time).

Timers are not outputs: a session owns them and says when it next needs the clock
(:meth:`Session.next_deadline <p2pfsm.session.core.Session.next_deadline>`).
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from p2pfsm.session import (
    CancelWrite,
    DestinationReleased,
    FetchArrived,
    FrameIgnored,
    LoadResult,
    LookupClosed,
    LookupRequest,
    LookupResult,
    Output,
    ProtocolViolation,
    RoundEnded,
    SendFrame,
    SendToLostPeer,
    Session,
    SessionDead,
    StartRegistration,
    StartWrite,
    StoreResult,
)

_HANDLERS: dict[type, str] = {
    SendFrame: "send_frame",
    SendToLostPeer: "send_to_lost_peer",
    StartRegistration: "start_registration",
    StartWrite: "start_write",
    CancelWrite: "cancel_write",
    LoadResult: "load_result",
    StoreResult: "store_result",
    LookupResult: "lookup_result",
    LookupRequest: "lookup_request",
    LookupClosed: "lookup_closed",
    FetchArrived: "fetch_arrived",
    RoundEnded: "round_ended",
    ProtocolViolation: "protocol_violation",
    FrameIgnored: "frame_ignored",
    SessionDead: "session_dead",
    DestinationReleased: "destination_released",
}
"""Output type -> the :class:`Executor` method that carries it out."""


class Executor:
    """Carries out one endpoint's session outputs; ``peer`` names the session.

    Subclasses implement every method below except those with a default
    (``frame_ignored``, ``lookup_closed``, ``round_ended`` and ``destination_released``
    need no action from most executors; ``send_to_lost_peer`` is ``send_frame`` unless
    the executor drops a lost peer's connection).
    """

    def apply(self, peer: str, out: Output) -> None:
        """Carry out one output (the only type dispatch of every executor)."""
        getattr(self, _HANDLERS[type(out)])(peer, out)

    def send_frame(self, peer: str, out: SendFrame) -> None:
        raise NotImplementedError

    def send_to_lost_peer(self, peer: str, out: SendToLostPeer) -> None:
        """A dead session's frame to a peer that may be unreachable now (default: sent as
        any frame; an executor that drops a lost peer's connection dials it back)."""
        self.send_frame(peer, out)

    def start_registration(self, peer: str, out: StartRegistration) -> None:
        raise NotImplementedError

    def start_write(self, peer: str, out: StartWrite) -> None:
        raise NotImplementedError

    def cancel_write(self, peer: str, out: CancelWrite) -> None:
        raise NotImplementedError

    def load_result(self, peer: str, out: LoadResult) -> None:
        raise NotImplementedError

    def store_result(self, peer: str, out: StoreResult) -> None:
        raise NotImplementedError

    def lookup_result(self, peer: str, out: LookupResult) -> None:
        raise NotImplementedError

    def lookup_request(self, peer: str, out: LookupRequest) -> None:
        raise NotImplementedError

    def lookup_closed(self, peer: str, out: LookupClosed) -> None:
        """The host may drop its context of the lookup (nothing to do by default)."""

    def fetch_arrived(self, peer: str, out: FetchArrived) -> None:
        raise NotImplementedError

    def round_ended(self, peer: str, out: RoundEnded) -> None:
        """A round the host heard of takes no more supply (nothing to do by default)."""

    def protocol_violation(self, peer: str, out: ProtocolViolation) -> None:
        raise NotImplementedError

    def frame_ignored(self, peer: str, out: FrameIgnored) -> None:
        """A benign stale frame was dropped (nothing to do by default)."""

    def session_dead(self, peer: str, out: SessionDead) -> None:
        raise NotImplementedError

    def destination_released(self, peer: str, out: DestinationReleased) -> None:
        """A destination reported held is free now (nothing to do by default)."""

    # Not outputs: what the driver tells the effects after a call (nothing by default).
    def session_ready(self, peer: str, session: Session) -> None:
        """A call made ``session`` ready (it was not before)."""

    def session_over(self, peer: str, session: Session) -> None:
        """A call left ``session`` no longer alive (told after every such call)."""


def handler_names() -> tuple[str, ...]:
    """The :class:`Executor` method of every output type, and the two that are told of
    sessions (``session_ready``, ``session_over``)."""
    return (*_HANDLERS.values(), "session_ready", "session_over")


def bound_handlers(effects: Executor) -> dict[type, Callable[[str, Any], None]] | None:
    """``effects``' handler of each output type, bound (what :meth:`Executor.apply`
    looks up per output); None when its class overrides ``apply``."""
    if type(effects).apply is not Executor.apply:
        return None
    return {kind: getattr(effects, name) for kind, name in _HANDLERS.items()}


def check_handlers() -> None:
    """Every member of :data:`~p2pfsm.session.Output` has an :class:`Executor` method."""
    members = set(typing.get_args(Output))
    missing = members - _HANDLERS.keys()
    if missing:
        names = sorted(t.__name__ for t in missing)
        raise TypeError(f"outputs without an Executor method: {names}")
    for name in _HANDLERS.values():
        if not callable(getattr(Executor, name, None)):
            raise TypeError(f"Executor has no method {name}")


check_handlers()
