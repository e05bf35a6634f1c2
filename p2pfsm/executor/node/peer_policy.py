"""What a node keeps about its peers beyond their sessions: idle inbound sessions, ended
sessions it still holds, each live session's rejected frames, and how often an identity
comes back.

Each book here only keeps its facts and answers questions, with time as an input; the
node carries out what follows (closing a session, dropping an ended one).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Protocol

from p2pfsm.executor.zmq.admission import NewPeerRate
from p2pfsm.logwindow import LogWindow, clip
from p2pfsm.metrics import NodeMetrics

RESTART_BURST = 3
RESTART_PERIOD_S = 5.0
"""How often one identity may open a new session after its last one ended (a restart, a
reconnect): ``RESTART_BURST`` at once, then one per ``RESTART_PERIOD_S``."""

_log = logging.getLogger("p2pfsm.node")

__all__ = ["EndedSessions", "IdleInbound", "ViolationBudget"]


class _SessionView(Protocol):
    @property
    def alive(self) -> bool: ...
    @property
    def has_pending_work(self) -> bool: ...


class IdleInbound:
    """Sessions a peer opened (not the host), and when their last frame came: closed
    after ``idle_timeout_s`` with nothing pending, looked at about once a second."""

    __slots__ = ("_heard", "_next_check", "check_at", "limit")

    def __init__(self, limit: float | None) -> None:
        self.limit = limit
        self._heard: dict[str, float] = {}
        self._next_check = 0.0
        self.check_at = math.inf
        """When :meth:`due` turns true (inf while the book is empty): a loop compares
        it with the clock instead of calling."""

    def opened_by_peer(self, peer_id: str) -> None:
        """The peer opened the session: subject to idle eviction (heard from now on)."""
        self._heard[peer_id] = 0.0
        self.check_at = self._next_check

    def heard(self, peer_id: str, now: float) -> None:
        """A frame of an inbound session came at ``now`` (ignored for the host's own)."""
        if peer_id in self._heard:
            self._heard[peer_id] = now

    def ours(self, peer_id: str) -> None:
        """The host holds this session (it dialled the peer): never evicted for idleness."""
        self._heard.pop(peer_id, None)
        if not self._heard:
            self.check_at = math.inf

    def due(self, now: float) -> bool:
        """Time to look for idle sessions."""
        return bool(self._heard) and now >= self._next_check

    def idle(self, now: float,
             sessions: Mapping[str, _SessionView]) -> Iterator[tuple[str, float]]:
        """The inbound sessions idle for the limit with nothing pending, with how long;
        each leaves the book as it is named, as does one no longer alive."""
        limit = self.limit
        self._next_check = self.check_at = now + min(1.0, limit or 1.0)
        if limit is None:
            return
        try:
            for peer_id, heard in list(self._heard.items()):
                session = sessions.get(peer_id)
                if session is None or not session.alive:
                    del self._heard[peer_id]
                elif now - heard >= limit and not session.has_pending_work:
                    del self._heard[peer_id]
                    yield peer_id, now - heard
        finally:
            if not self._heard:
                self.check_at = math.inf


class EndedSessions:
    """Peers whose session ended, oldest first: beyond ``history`` of them, those with
    nothing left to do are dropped."""

    __slots__ = ("_ended", "history")

    def __init__(self, history: int) -> None:
        self.history = history
        self._ended: OrderedDict[str, None] = OrderedDict()

    def ended(self, peer_id: str) -> None:
        self._ended[peer_id] = None
        self._ended.move_to_end(peer_id)

    def reopened(self, peer_id: str) -> None:
        self._ended.pop(peer_id, None)

    def to_drop(self, sessions: Mapping[str, _SessionView]) -> list[str]:
        """The ended sessions to drop now, oldest first (each leaves the book); a peer
        whose session is gone or alive again just leaves the book. Reads the book only
        as far as it must: this runs at every session's end."""
        excess = len(self._ended) - self.history
        if excess <= 0:
            return []
        drop: list[str] = []
        leave: list[str] = []
        for peer_id in self._ended:
            if len(drop) >= excess:
                break
            session = sessions.get(peer_id)
            if session is None or session.alive:
                leave.append(peer_id)
            elif not session.has_pending_work:
                drop.append(peer_id)
        for peer_id in leave + drop:
            del self._ended[peer_id]
        return drop


class ViolationBudget:
    """Rejected frames of each peer's live session, against ``max_violations`` (0: no
    budget), and a rate-limited log line for each."""

    __slots__ = ("_counts", "_logs", "budget")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._counts: dict[str, int] = {}
        self._logs: dict[str, LogWindow] = {}

    def new_session(self, peer_id: str) -> None:
        """A new session of the peer starts with a clean count."""
        self._counts.pop(peer_id, None)

    def rejected(self, peer_id: str) -> int:
        """Count one rejected frame of the peer's live session; the count so far."""
        count = self._counts.get(peer_id, 0) + 1
        self._counts[peer_id] = count
        return count

    def log(self, peer_id: str, log: logging.Logger, error: object) -> None:
        """Log a rejected frame of the peer, rate-limited per peer."""
        self._logs.setdefault(peer_id, LogWindow()).emit(
            log.warning, f"rejected frames of peer {peer_id}",
            "peer %s: frame rejected: %s", peer_id, clip(error))

    def crossed(self, count: int) -> bool:
        """``count`` is the first one past the budget (the session is closed for it)."""
        return bool(self.budget) and count == self.budget + 1


class ComeBacks:
    """Which peers whose session ended (or that restarted) may open a new one: at most
    ``RESTART_BURST`` at once, then one per ``RESTART_PERIOD_S``, per identity (each may
    bring a new NIXL agent to load, and a load costs a descriptor for as long as the
    peer's agent lives). Past it the connect is dropped, counted and logged."""

    __slots__ = ("_kind", "_log", "_metrics", "_rate")

    def __init__(self, metrics: NodeMetrics, window: LogWindow, kind: str) -> None:
        self._rate = NewPeerRate(RESTART_BURST, refill=1.0 / RESTART_PERIOD_S)
        self._metrics = metrics
        self._log = window
        self._kind = kind

    def admit(self, peer_id: str, now: float) -> bool:
        """True when the peer may open a new session now."""
        if self._rate.take(peer_id, now):
            return True
        self._metrics.count("restarts_refused")
        self._log.emit(_log.warning, self._kind,
                       "peer %s: comes back more often than %d at once and one per "
                       "%.0f s: its connect dropped", peer_id, RESTART_BURST,
                       RESTART_PERIOD_S)
        return False
