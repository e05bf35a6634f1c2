"""Per-request memory that outlives the request for a bounded time.

A frame is assumed to arrive within ``ttl`` seconds of being sent or never (the
executor's heartbeats kill a connection silent for longer). Within that horizon
the session remembers, per kv_request_id, the lowest round number it may use again
(consumer: rounds that ended with an abort may still see a late abort_ack) and the
lookup round whose pins expired (producer: its fetch fails fast). Entries are kept
in expiry order, so purging is O(1) amortized per event; a purge before the oldest
entry's expiry is one comparison (the session purges on every event).

A peer decides how many entries some tables get (one per terminal fetch, say), so each
table holds at most ``cap`` entries and all the tables of a node share one
:class:`TombstoneBudget`: past either, the table's oldest entry is dropped early and
counted (it then behaves as an expired one would). A session that ends empties its
tables (:meth:`Tombstones.clear`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

DEFAULT_MAX_TOMBSTONES = 4096
"""Entries one table keeps at most (SessionConfig.max_tombstones)."""


class TombstoneBudget:
    """Entries all the tables of a node hold together, at most ``limit``; ``on_drop``
    is called for each entry dropped early (by a table's cap or this budget)."""

    __slots__ = ("early_drops", "held", "limit", "on_drop")

    def __init__(self, limit: int, on_drop: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.on_drop = on_drop
        self.held = 0
        self.early_drops = 0

    def count_drop(self) -> None:
        self.early_drops += 1
        if self.on_drop is not None:
            self.on_drop()


class Tombstones:
    """An int per key, forgotten ``ttl`` seconds after it was last written; at most
    ``cap`` keys (and within ``budget``), the oldest dropped early past that."""

    __slots__ = ("_budget", "_entries", "cap", "purge_at", "ttl")

    def __init__(self, ttl: float, cap: int = DEFAULT_MAX_TOMBSTONES,
                 budget: TombstoneBudget | None = None) -> None:
        self.ttl = ttl
        self.cap = cap
        self._budget = budget
        self._entries: dict[str, tuple[int, float]] = {}
        # No entry expires before this (a lower bound: a pop may make it early).
        self.purge_at = math.inf

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> int | None:
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def put(self, key: str, value: int, now: float) -> None:
        entries, budget = self._entries, self._budget
        if entries.pop(key, None) is None and budget is not None:
            budget.held += 1
        # Full (this table, or the node's budget): the oldest entries go early.
        while entries and (len(entries) >= self.cap
                           or (budget is not None and budget.held > budget.limit)):
            del entries[next(iter(entries))]
            if budget is not None:
                budget.held -= 1
                budget.count_drop()
        until = now + self.ttl
        entries[key] = (value, until)
        if until < self.purge_at:
            self.purge_at = until

    def pop(self, key: str) -> None:
        if self._entries.pop(key, None) is not None and self._budget is not None:
            self._budget.held -= 1

    def clear(self) -> None:
        """Forget every entry (the session is over)."""
        if self._budget is not None:
            self._budget.held -= len(self._entries)
        self._entries.clear()
        self.purge_at = math.inf

    def entries(self) -> tuple[tuple[str, int, float], ...]:
        """(key, value, expiry) of every entry, oldest write first (for tests)."""
        return tuple((key, value, until) for key, (value, until) in self._entries.items())

    def purge(self, now: float) -> None:
        """Forget the entries whose expiry is ``now`` or earlier."""
        if now < self.purge_at:
            return
        entries = self._entries
        while entries:
            key = next(iter(entries))
            until = entries[key][1]
            if until > now:
                self.purge_at = until
                return
            del entries[key]
            if self._budget is not None:
                self._budget.held -= 1
        self.purge_at = math.inf


def purge_due(tables: Iterable[Tombstones], now: float) -> None:
    """Purge each of ``tables`` whose earliest expiry is due by ``now`` (the others are
    passed by without a call: a session does this before every input)."""
    for table in tables:
        if now >= table.purge_at:
            table.purge(now)
