"""A session's armed timers: the one table of its deadlines.

The session owns its timers (as aioquic's connection does): executors no longer mirror
them. They ask :meth:`~p2pfsm.session.core.Session.next_deadline` when the session next
needs the clock, and feed ``TimerFired(timer)`` for each timer that
:meth:`~p2pfsm.session.core.Session.due_timers` names; one input per firing, so every
firing stays one spec action.

:class:`TimerTable` is a heap with lazy invalidation (re-arming or disarming never
searches it), read as a mapping ``key -> deadline``. Equal deadlines come in
``str(key)`` order, then arming order, so a seeded simulation replays the same way
whatever order its timers were armed in.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class _Tie(Generic[K]):
    """A heap entry's order among equal deadlines: ``str(key)``, then arming order.

    ``str(key)`` (for a :class:`~p2pfsm.session.TimerId`: ~1.4 us) is made only when two
    deadlines tie, which on a real clock is rare; a seeded simulation ties often.
    """

    __slots__ = ("_text", "key", "serial")

    def __init__(self, key: K, serial: int) -> None:
        self.key = key
        self.serial = serial
        self._text: str | None = None

    def __lt__(self, other: _Tie[K]) -> bool:
        # (str(key), serial) of each, each text made once (inline: heapq calls this).
        mine = self._text
        if mine is None:
            mine = self._text = str(self.key)
        theirs = other._text
        if theirs is None:
            theirs = other._text = str(other.key)
        return (mine, self.serial) < (theirs, other.serial)


class TimerTable(Mapping[K, float], Generic[K]):
    """Armed timers ``key -> deadline``; :meth:`arm` replaces a timer of the same key."""

    __slots__ = ("_deadlines", "_heap", "_serial")

    def __init__(self) -> None:
        self._deadlines: dict[K, float] = {}
        self._heap: list[tuple[float, _Tie[K]]] = []
        self._serial = itertools.count()

    def arm(self, key: K, deadline: float) -> None:
        self._deadlines[key] = deadline
        if len(self._heap) > 2 * len(self._deadlines) + 16:  # mostly stale: rebuild
            self._rebuild()
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
        deadlines = self._deadlines
        while heap and deadlines.get(heap[0][1].key) != heap[0][0]:
            heapq.heappop(heap)  # disarmed or re-armed since
        return (heap[0][0], heap[0][1].key) if heap else None

    def due(self, now: float) -> list[K]:
        """Every timer whose deadline is <= ``now``, earliest first (none disarmed)."""
        nxt = self.earliest()
        if nxt is None or nxt[0] > now:
            return []
        deadlines = self._deadlines
        live = sorted(e for e in self._heap
                      if e[0] <= now and deadlines.get(e[1].key) == e[0])
        seen: set[K] = set()
        keys: list[K] = []
        for _, tie in live:  # a key re-armed to the same deadline has two live entries
            if tie.key not in seen:
                seen.add(tie.key)
                keys.append(tie.key)
        return keys

    def view(self) -> Mapping[K, float]:
        """A read-only view of ``key -> deadline``."""
        return MappingProxyType(self._deadlines)

    def _rebuild(self) -> None:
        deadlines = self._deadlines
        self._heap = [e for e in self._heap if deadlines.get(e[1].key) == e[0]]
        heapq.heapify(self._heap)

    def __getitem__(self, key: K) -> float:
        return self._deadlines[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._deadlines)

    def __len__(self) -> int:
        return len(self._deadlines)

    def __repr__(self) -> str:
        return f"TimerTable({self._deadlines!r})"
