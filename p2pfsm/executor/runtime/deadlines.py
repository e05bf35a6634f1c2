"""When each of an executor's sessions next needs the clock: one entry per session.

A session owns its timers (:mod:`p2pfsm.session.timers`); an executor keeps only each
session's next deadline, in one heap with lazy invalidation, so finding the earliest of
many sessions never scans them. :class:`~p2pfsm.executor.runtime.driver.Driver` notes a session's
deadline after each call it makes and hands out the sessions that are due.

A session that was replaced (a peer's restart) keeps its entry until its timers are
done: its rounds still end on its own clock, and its inputs are its own.
"""

from __future__ import annotations

import heapq
import itertools

from p2pfsm.session import Session


class SessionDeadlines:
    """Each session's next deadline (sessions with no timer armed are not kept)."""

    __slots__ = ("_at", "_serial", "heap")

    def __init__(self) -> None:
        self._at: dict[Session, float] = {}
        # (deadline, serial, peer, session): the serial orders equal deadlines by when
        # they were noted and keeps sessions out of the comparison.
        self.heap: list[tuple[float, int, str, Session]] = []
        self._serial = itertools.count()

    def note(self, peer: str, session: Session) -> None:
        """Read ``session``'s next deadline (after a call that may have changed it)."""
        deadline = session.next_deadline()
        at = self._at
        if deadline is None:
            at.pop(session, None)
            return
        if at.get(session) == deadline:
            return
        at[session] = deadline
        heap = self.heap
        if len(heap) > 2 * len(at) + 16:  # mostly stale entries: rebuild
            heap[:] = [e for e in heap if at.get(e[3]) == e[0]]
            heapq.heapify(heap)
        heapq.heappush(heap, (deadline, next(self._serial), peer, session))

    def earliest(self) -> float | None:
        """The earliest deadline of any session, or None when no timer is armed."""
        heap, at = self.heap, self._at
        while heap and at.get(heap[0][3]) != heap[0][0]:
            heapq.heappop(heap)  # the session's deadline moved or it has none now
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> list[tuple[str, Session]]:
        """Forget and return, earliest first, every session due by ``now`` (each is
        noted again after its next call)."""
        due: list[tuple[str, Session]] = []
        heap, at = self.heap, self._at
        while (nxt := self.earliest()) is not None and nxt <= now:
            _, _, peer, session = heapq.heappop(heap)
            del at[session]
            due.append((peer, session))
        return due

    def __len__(self) -> int:
        return len(self._at)
