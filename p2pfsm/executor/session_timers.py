"""A node's armed session timers: one table for every session, each timer owned.

A timer is keyed by (peer, :class:`~p2pfsm.session.TimerId`) and owned by the session
that armed it: when it fires, its ``TimerFired`` goes to that session, and a session
that replaced another cannot disarm (or be fired) the old one's timers.
"""

from __future__ import annotations

from collections.abc import Iterator

from p2pfsm.executor.core import TimerTable
from p2pfsm.session import Session, TimerId


class SessionTimers:
    """Armed timers of one node's sessions (sessions run on ``time.monotonic()``)."""

    __slots__ = ("_owner", "_table")

    def __init__(self) -> None:
        self._table: TimerTable[tuple[str, TimerId]] = TimerTable()
        self._owner: dict[tuple[str, TimerId], Session] = {}

    def arm(self, peer: str, timer: TimerId, deadline: float, owner: Session) -> None:
        """Arm (or re-arm) ``owner``'s timer to fire at ``deadline``."""
        self._table.arm((peer, timer), deadline)
        self._owner[(peer, timer)] = owner

    def disarm(self, peer: str, timer: TimerId, owner: Session | None) -> None:
        """Disarm the timer if ``owner`` armed it (else it is another session's)."""
        if self._owner.get((peer, timer)) is owner:
            self._table.disarm((peer, timer))
            del self._owner[(peer, timer)]

    def earliest(self) -> float | None:
        """The next deadline, or None when nothing is armed."""
        nxt = self._table.earliest()
        return None if nxt is None else nxt[0]

    def due(self, now: float) -> Iterator[tuple[str, TimerId, Session]]:
        """Disarm and yield, earliest first, every timer due by ``now`` with its owner."""
        for peer, timer in self._table.pop_due(now):
            owner = self._owner.pop((peer, timer), None)
            if owner is not None:
                yield peer, timer, owner
