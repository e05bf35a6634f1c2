"""Sessions opened again: which peers a node redials, when, and the calls that wait.

A session the host opened with ``connect()`` that dies (not closed by us, no mismatch)
is opened again: at once, then with doubling backoff while attempts fail
(``NodeConfig.reconnect_backoff_s``), each wait drawn at random between half of it and
all of it (so that the peers of a restarted node do not all dial it at one instant),
and at most ``NodeConfig.reconnect_max_attempts`` times in a row without a ready
session. The host may forget a peer (no more redials) or have it redialled now.
Fetches and lookups made meanwhile are parked here with their deadline and go to the
next session, or fail when the deadline passes first. This module only keeps that
book; time is an input (every call that needs it takes ``now``) and the node carries
out what it says.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from p2pfsm.session import HostFetch, HostLookup, SessionDead

__all__ = ["Parked", "Redials"]

Parked = HostFetch | HostLookup
"""A host call that waits for a session to open again."""


class Redials:
    """The redial book of one node.

    Args:
        backoff: ``(first, most)`` seconds between attempts; None: never redial.
        max_attempts: most attempts in a row that fail before the session is ready
            (then the peer is given up); None: no limit.
        rng: the jitter's random source.
    """

    __slots__ = ("_attempts", "_backoff", "_dialled", "_parked", "_rng", "at", "backoff",
                 "max_attempts")

    def __init__(self, backoff: tuple[float, float] | None, max_attempts: int | None = None,
                 rng: random.Random | None = None) -> None:
        self.backoff = backoff
        self.max_attempts = max_attempts
        self._rng = rng or random.Random()
        self._attempts: dict[str, int] = {}  # peer -> redials since it was last ready
        self._dialled: set[str] = set()  # peers the host connect()ed: re-opened on death
        self.at: dict[str, float] = {}
        """Peer -> when to open it again (read it; a loop checks it for emptiness)."""
        self._backoff: dict[str, float] = {}  # peer -> the next wait, while attempts fail
        self._parked: dict[str, list[tuple[float, Parked]]] = {}  # peer -> (deadline, call)

    def __bool__(self) -> bool:
        """Some session waits to be opened again."""
        return bool(self.at)

    def waiting(self, peer_id: str) -> bool:
        """The session to ``peer_id`` is dead and waits to be opened again."""
        return peer_id in self.at

    def host_dialled(self, peer_id: str) -> None:
        """The host opened the session itself: it is ours to redial, none is due now."""
        self._dialled.add(peer_id)
        self.at.pop(peer_id, None)

    def dialled(self, peer_id: str) -> bool:
        """The host opened the session to ``peer_id`` (and has not forgotten it)."""
        return peer_id in self._dialled

    def dialled_ids(self) -> list[str]:
        """Every peer the host opened a session to (and has not forgotten)."""
        return sorted(self._dialled)

    def may_redial(self, peer_id: str, dead: SessionDead, closing: bool) -> bool:
        """Open a dead session of ours again: not after our own close, a mismatch, with
        the node closing, or once ``max_attempts`` attempts in a row have failed."""
        return (self.backoff is not None and peer_id in self._dialled
                and dead.mismatch is None and dead.reason != "closed" and not closing
                and not self.exhausted(peer_id))

    def exhausted(self, peer_id: str) -> bool:
        """``max_attempts`` redials of ``peer_id`` in a row failed before it was ready."""
        return (self.max_attempts is not None
                and self._attempts.get(peer_id, 0) >= self.max_attempts)

    def attempts(self, peer_id: str) -> int:
        """Redials of ``peer_id`` since its session was last ready."""
        return self._attempts.get(peer_id, 0)

    def forget(self, peer_id: str) -> list[Parked]:
        """The host gave ``peer_id`` up: never redialled again (until it connects it
        again); returns the calls that waited for it (they leave the book)."""
        self._dialled.discard(peer_id)
        self.at.pop(peer_id, None)
        self._backoff.pop(peer_id, None)
        self._attempts.pop(peer_id, None)
        return self.take(peer_id)

    def now(self, peer_id: str, now: float) -> bool:
        """Open ``peer_id`` again at ``now`` instead of after its wait; False when no
        redial of it is due."""
        if peer_id not in self.at:
            return False
        self.at[peer_id] = now
        return True

    def schedule(self, peer_id: str, now: float) -> float:
        """Open ``peer_id`` again after the wait returned: none after a session that had
        become ready, then the backoff, doubling up to its most while attempts fail."""
        assert self.backoff is not None
        wait = self._backoff.get(peer_id)  # None: the session had become ready
        first, most = self.backoff
        self._backoff[peer_id] = first if wait is None else min(2 * wait, most)
        self._attempts[peer_id] = self._attempts.get(peer_id, 0) + 1
        drawn = 0.0 if wait is None else wait * (0.5 + 0.5 * self._rng.random())
        self.at[peer_id] = now + drawn
        return drawn

    def ready(self, peer_id: str) -> None:
        """The session became ready: the next death redials at once again."""
        self._backoff.pop(peer_id, None)
        self._attempts.pop(peer_id, None)

    def cancel(self, peer_id: str) -> None:
        """No redial of ``peer_id`` any more (another session replaced it)."""
        self.at.pop(peer_id, None)

    def park(self, peer_id: str, deadline: float, call: Parked) -> None:
        """``call`` waits for the next session to ``peer_id`` until ``deadline``."""
        self._parked.setdefault(peer_id, []).append((deadline, call))

    def take(self, peer_id: str) -> list[Parked]:
        """The calls that waited for ``peer_id``, oldest first (they leave the book)."""
        return [call for _, call in self._parked.pop(peer_id, ())]

    def take_request(self, peer_id: str, kv_request_id: str) -> list[Parked]:
        """The calls of one request that waited for ``peer_id`` (they leave the book)."""
        return self._take_if(peer_id, lambda _, call: call.kv_request_id == kv_request_id)

    def due(self, now: float) -> tuple[list[str], list[tuple[str, Parked]]]:
        """The peers to open again now, and the calls that waited past their deadline
        for the others (they leave the book)."""
        peers: list[str] = []
        expired: list[tuple[str, Parked]] = []
        for peer_id, at in list(self.at.items()):
            if at <= now:
                del self.at[peer_id]
                peers.append(peer_id)
            else:
                expired.extend((peer_id, call) for call in self._take_if(
                    peer_id, lambda deadline, _: deadline <= now))
        return peers, expired

    def next_due(self) -> float | None:
        """The earliest redial or parked deadline; None when no session waits."""
        if not self.at:
            return None
        return min([*self.at.values(),
                    *(d for waiting in self._parked.values() for d, _ in waiting)])

    def end(self) -> list[tuple[str, Parked]]:
        """The node closes: no session opens again; every parked call leaves the book."""
        self.at.clear()
        parked, self._parked = self._parked, {}
        return [(peer_id, call) for peer_id, waiting in parked.items() for _, call in waiting]

    def _take_if(self, peer_id: str, which: Callable[[float, Parked], bool]) -> list[Parked]:
        waiting = self._parked.get(peer_id)
        if not waiting:
            return []
        taken = [call for d, call in waiting if which(d, call)]
        if taken:
            self._parked[peer_id] = [(d, call) for d, call in waiting if not which(d, call)]
        return taken
