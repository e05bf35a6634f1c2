"""The adapter's book of loads reported failed whose destination is not released yet.

Where the profile reports an aborted load when its abort is sent (vLLM 0.34.0), the
Session's LoadResult says ``released=False`` and a DestinationReleased follows once the
peer can no longer write. vLLM's manager waits instead on ``LoadResult.deferred_release``,
a ``threading.Event``: :class:`Aborts` keeps each such load's event until its release
(the Session's notice, or a release point of the release such as close), and, as vLLM's
session keeps such a load with its request, whether the host finished that request.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Waiting:
    kv_request_id: str
    finished: bool
    event: threading.Event = field(default_factory=threading.Event)


class Aborts:
    """The release events of loads reported failed before their destination was free."""

    def __init__(self) -> None:
        self._waiting: dict[int, _Waiting] = {}  # load job -> its request and release

    def defer(self, job: int, kv_request_id: str, finished: bool) -> threading.Event:
        """The event set once load ``job``'s destination is free (``finished``: the host
        finished its request already)."""
        waiting = self._waiting[job] = _Waiting(kv_request_id, finished)
        return waiting.event

    def finish(self, kv_request_id: str) -> None:
        """The host finished ``kv_request_id``: its waiting loads say so."""
        for waiting in self._waiting.values():
            if waiting.kv_request_id == kv_request_id:
                waiting.finished = True

    def unfinished_requests(self) -> list[str]:
        """The requests of waiting loads the host has not finished (what vLLM's close
        lists as failed: the manager falls back for them)."""
        return list(dict.fromkeys(w.kv_request_id for w in self._waiting.values()
                                  if not w.finished))

    def release(self, job: int) -> None:
        """Load ``job``'s destination is free (no-op for a job not waiting)."""
        waiting = self._waiting.pop(job, None)
        if waiting is not None:
            waiting.event.set()

    def release_all(self) -> list[int]:
        """Free every waiting destination (a release point such as close); their jobs."""
        jobs = list(self._waiting)
        for waiting in self._waiting.values():
            waiting.event.set()
        self._waiting.clear()
        return jobs

    @property
    def waiting(self) -> bool:
        """True while a load reported failed waits for its release."""
        return bool(self._waiting)
