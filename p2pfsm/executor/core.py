"""What every executor of sessions shares: one output interface and one timer table.

A session's outputs are carried out by an :class:`Executor`, the effects interface that
:class:`~p2pfsm.executor.driver.Driver` hands each output to: the real
:class:`~p2pfsm.executor.node.Node` (ZeroMQ + NIXL), the vLLM adapter and the simulated
:class:`~p2pfsm.sim.world.SimWorld` implement it, and :meth:`Executor.apply` is the
one place that maps an output type to the method that carries it out (a new output type
without a method fails :func:`check_handlers` at import, not silently at run time).

:class:`TimerTable` holds one executor's armed timers: a heap with lazy invalidation
(re-arming or disarming never searches it), read as a mapping ``key -> deadline``.
"""

from __future__ import annotations

import heapq
import itertools
import typing
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from p2pfsm.session import (
    ArmTimer,
    CancelWrite,
    DisarmTimer,
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

K = TypeVar("K", bound=Hashable)

_HANDLERS: dict[type, str] = {
    SendFrame: "send_frame",
    SendToLostPeer: "send_to_lost_peer",
    StartRegistration: "start_registration",
    StartWrite: "start_write",
    CancelWrite: "cancel_write",
    ArmTimer: "arm_timer",
    DisarmTimer: "disarm_timer",
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
}
"""Output type -> the :class:`Executor` method that carries it out."""


class Executor:
    """Carries out one endpoint's session outputs; ``peer`` names the session.

    Subclasses implement every method below except those with a default
    (``frame_ignored``, ``lookup_closed`` and ``round_ended`` need no action from most
    executors; ``send_to_lost_peer`` is ``send_frame`` unless the executor drops a lost
    peer's connection).
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

    def arm_timer(self, peer: str, out: ArmTimer) -> None:
        raise NotImplementedError

    def disarm_timer(self, peer: str, out: DisarmTimer) -> None:
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

    # Not outputs: what the driver tells the effects after a call (nothing by default).
    def session_ready(self, peer: str, session: Session) -> None:
        """A call made ``session`` ready (it was not before)."""

    def session_over(self, peer: str, session: Session) -> None:
        """A call left ``session`` no longer alive (told after every such call)."""


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


class _Tie(Generic[K]):
    """A heap entry's order among equal deadlines: ``str(key)``, then arming order.

    ``str(key)`` (a tuple with a :class:`~p2pfsm.session.TimerId`: ~1.4 us) is made only
    when two deadlines tie, which on a real clock is rare; a seeded simulation ties
    often and gets the same order as ever.
    """

    __slots__ = ("_text", "key", "serial")

    def __init__(self, key: K, serial: int) -> None:
        self.key = key
        self.serial = serial
        self._text: str | None = None

    def _order(self) -> tuple[str, int]:
        if self._text is None:
            self._text = str(self.key)
        return (self._text, self.serial)

    def __lt__(self, other: _Tie[K]) -> bool:
        return self._order() < other._order()


class TimerTable(Mapping[K, float], Generic[K]):
    """Armed timers ``key -> deadline``; :meth:`arm` replaces a timer of the same key.

    The earliest deadline comes first; equal deadlines in ``str(key)`` order (so a
    seeded simulation replays the same way whatever order timers were armed in).
    """

    def __init__(self) -> None:
        self._deadlines: dict[K, float] = {}
        self._heap: list[tuple[float, _Tie[K]]] = []
        self._serial = itertools.count()

    def arm(self, key: K, deadline: float) -> None:
        self._deadlines[key] = deadline
        heapq.heappush(self._heap, (deadline, _Tie(key, next(self._serial))))

    def pop(self, key: K) -> float:
        """Disarm ``key`` and return its deadline; KeyError when it is not armed."""
        return self._deadlines.pop(key)

    def disarm(self, key: K) -> float | None:
        """Forget ``key``; its deadline, or None when it was not armed."""
        return self._deadlines.pop(key, None)

    def earliest(self) -> tuple[float, K] | None:
        """The next timer to fire, or None."""
        heap = self._heap
        while heap and self._deadlines.get(heap[0][1].key) != heap[0][0]:
            heapq.heappop(heap)  # disarmed or re-armed since
        return (heap[0][0], heap[0][1].key) if heap else None

    def pop_due(self, now: float) -> Iterator[K]:
        """Disarm and yield, earliest first, every timer whose deadline is <= ``now``."""
        while (nxt := self.earliest()) is not None and nxt[0] <= now:
            del self._deadlines[nxt[1]]
            yield nxt[1]

    def __getitem__(self, key: K) -> float:
        return self._deadlines[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._deadlines)

    def __len__(self) -> int:
        return len(self._deadlines)

    def __repr__(self) -> str:
        return f"TimerTable({self._deadlines!r})"
