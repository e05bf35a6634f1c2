"""Per-request memory that outlives the request for a bounded time.

A frame is assumed to arrive within ``ttl`` seconds of being sent or never (the
executor's heartbeats kill a connection silent for longer). Within that horizon
the session remembers, per kv_request_id, the lowest round number it may use again
(consumer: rounds that ended with an abort may still see a late abort_ack) and the
lookup round whose pins expired (producer: its fetch fails fast). Entries are kept
in expiry order, so purging is O(1) amortized per event; a purge before the oldest
entry's expiry is one comparison (the session purges on every event).
"""

from __future__ import annotations

import math


class Tombstones:
    """An int per key, forgotten ``ttl`` seconds after it was last written."""

    __slots__ = ("_entries", "_purge_at", "ttl")

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._entries: dict[str, tuple[int, float]] = {}
        # No entry expires before this (a lower bound: a pop may make it early).
        self._purge_at = math.inf

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> int | None:
        entry = self._entries.get(key)
        return None if entry is None else entry[0]

    def put(self, key: str, value: int, now: float) -> None:
        self._entries.pop(key, None)
        until = now + self.ttl
        self._entries[key] = (value, until)
        if until < self._purge_at:
            self._purge_at = until

    def pop(self, key: str) -> None:
        self._entries.pop(key, None)

    def entries(self) -> tuple[tuple[str, int, float], ...]:
        """(key, value, expiry) of every entry, oldest write first (for tests)."""
        return tuple((key, value, until) for key, (value, until) in self._entries.items())

    def purge(self, now: float) -> None:
        """Forget the entries whose expiry is ``now`` or earlier."""
        if now < self._purge_at:
            return
        entries = self._entries
        while entries:
            key = next(iter(entries))
            until = entries[key][1]
            if until > now:
                self._purge_at = until
                return
            del entries[key]
        self._purge_at = math.inf
