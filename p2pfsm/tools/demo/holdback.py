"""Late blocks for the demo server (``p2pfsm serve --hold-back``): a host whose blocks
arrive some time after a peer asks for them.

A held-back block is stored only ``late_after`` seconds after the server first hears of
the request that asks for it (per peer and request, as vLLM's interop server does): a
fetch of it waits as demand until then, a lookup leaves it pending. The server's loop
runs what is due (:meth:`HoldBack.run_due`) between turns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Final

from p2pfsm.demo_blocks import demo_key

MAX_REQUESTS: Final = 65536
"""Requests whose first sighting is remembered; the oldest are forgotten beyond this."""


class HoldBack:
    """Which keys are late for a request, and the calls waiting for them."""

    def __init__(self, blocks: Iterable[int], late_after: float) -> None:
        self.keys = frozenset(demo_key(b) for b in blocks)
        self.late_after = late_after
        self._due: dict[tuple[str, str], float] = {}  # (peer, request) -> when stored
        self._waiting: list[tuple[float, Callable[[], None]]] = []

    def due(self, peer_id: str, kv_request_id: str) -> float:
        """When the request's held-back blocks are stored (``late_after`` after its
        first sighting)."""
        key = (peer_id, kv_request_id)
        if key not in self._due:
            if len(self._due) >= MAX_REQUESTS:
                del self._due[next(iter(self._due))]
            self._due[key] = time.monotonic() + self.late_after
        return self._due[key]

    def late(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes]) -> list[bytes]:
        """The ``keys`` not stored yet for the request."""
        held = [k for k in keys if k in self.keys]
        if not held or self.due(peer_id, kv_request_id) <= time.monotonic():
            return []
        return held

    def later(self, peer_id: str, kv_request_id: str, call: Callable[[], None]) -> None:
        """Run ``call`` once the request's held-back blocks are stored."""
        self._waiting.append((self.due(peer_id, kv_request_id), call))
        self._waiting.sort(key=lambda w: w[0])

    def next_due(self) -> float | None:
        """The ``time.monotonic()`` of the next waiting call, if any."""
        return self._waiting[0][0] if self._waiting else None

    def run_due(self) -> None:
        """Run every waiting call whose time has come."""
        now = time.monotonic()
        while self._waiting and self._waiting[0][0] <= now:
            _, call = self._waiting.pop(0)
            call()
