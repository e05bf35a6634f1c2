"""The adapter's book of aborted load rounds and of loads whose destination waits.

vLLM 0.34.0 reports a load failed when its abort is sent and frees its destination
blocks only once ``LoadResult.deferred_release`` is set. :class:`Aborts` keeps, per
session, which rounds had their ``abort_fetch`` sent (so a second one, the Session's
re-send on the abort-ack timeout, is recognised) and each such load's event until its
destination is free.
"""

from __future__ import annotations

import threading

Round = tuple[str, int]
"""(kv_request_id, round_seq)."""


class Aborts:
    """Aborted rounds, and the release events of loads reported failed early."""

    def __init__(self) -> None:
        self._rounds: dict[Round, int | None] = {}  # aborted round -> its load job
        self._round_of: dict[int, Round] = {}  # load job -> its aborted round
        self._events: dict[int, threading.Event] = {}  # load job -> its release

    def first(self, rnd: Round, job: int | None) -> bool:
        """Record the abort of ``rnd`` (load ``job``); False when it was sent before."""
        if rnd in self._rounds:
            return False
        self._rounds[rnd] = job
        if job is not None:
            self._round_of[job] = rnd
        return True

    def round_over(self, job: int) -> None:
        """Load ``job``'s round ended: no abort of it is sent again."""
        rnd = self._round_of.pop(job, None)
        if rnd is not None:
            self._rounds.pop(rnd, None)

    def defer(self, job: int) -> threading.Event:
        """The event set once load ``job``'s destination is free."""
        event = self._events[job] = threading.Event()
        return event

    def deferred(self, job: int) -> bool:
        """Whether load ``job`` was reported failed and waits for its release."""
        return job in self._events

    def release(self, job: int) -> None:
        """Load ``job``'s destination is free."""
        event = self._events.pop(job, None)
        if event is not None:
            event.set()

    def release_all(self) -> list[int]:
        """Free every waiting destination (a release point such as close); their jobs."""
        jobs = list(self._events)
        for event in self._events.values():
            event.set()
        self._events.clear()
        return jobs

    @property
    def waiting(self) -> bool:
        """True while a load reported failed waits for its release."""
        return bool(self._events)
