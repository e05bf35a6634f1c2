"""Sessions that hold our destinations after they left the peer table.

A failed load whose peer could still write into its destination says
``released=False``; the session that ran it holds that destination until a
DestinationReleased frees it. A session replaced by a new one of its peer, or dropped
from the table once ended, while it holds some is kept here for that notice: its timers
still run on the driver's clock, and ``PeerGone`` still reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping

from p2pfsm.executor.runtime.driver import Driver
from p2pfsm.protocol import Connect
from p2pfsm.session import PeerGone, Session


class Holders:
    """Per peer, its sessions out of the table that still hold destinations."""

    __slots__ = ("_by_peer", "_driver")

    def __init__(self, driver: Driver) -> None:
        self._driver = driver
        self._by_peer: dict[str, list[Session]] = {}

    def keep(self, peer_id: str, old: Session) -> None:
        """``old`` leaves the table while it holds destinations."""
        self._by_peer.setdefault(peer_id, []).append(old)

    def release_if_restarted(self, peer_id: str, session: Session | None,
                             connect: Connect) -> None:
        """A connect of a new incarnation of the peer reaches a session of it that is
        over, or a new session of it became ready with one: the process that could write
        into what the older sessions hold is gone."""
        older = [] if session is None else [session]
        for old in [*older, *self._by_peer.get(peer_id, ())]:
            known = None if old.peer is None else old.peer.incarnation
            if (old.held_destinations and known is not None
                    and connect.incarnation not in (None, known)):
                self._driver.feed(peer_id, PeerGone("peer_restarted"), old)

    def release(self, peer_id: str, current: Session | None, cause: str) -> int:
        """The peer can no longer write into our memory: each of its sessions that is
        over (``current`` and those kept here) releases what it holds. Returns how many
        destinations were released."""
        released = 0
        for old in [*([current] if current is not None else []),
                    *self._by_peer.get(peer_id, ())]:
            if not old.alive and old.held_destinations:
                before = old.held_destinations
                self._driver.feed(peer_id, PeerGone(cause), old)
                released += before - old.held_destinations
        return released

    def kept(self) -> int:
        """The destinations the sessions kept here hold (those holding none any more
        are forgotten, as :meth:`counts` forgets them)."""
        if not self._by_peer:
            return 0
        return sum(self.counts({}).values())

    def counts(self, sessions: Mapping[str, Session]) -> dict[str, int]:
        """Per peer, the destinations held by its session in ``sessions`` and those
        kept here (a session kept here that holds none any more is forgotten)."""
        out: dict[str, int] = {}
        for peer_id, session in sessions.items():
            held = session.held_destinations  # a count over the session's loads: once
            if held:
                out[peer_id] = held
        for peer_id, olds in list(self._by_peer.items()):
            olds[:] = [s for s in olds if s.held_destinations]
            if not olds:
                del self._by_peer[peer_id]
                continue
            out[peer_id] = out.get(peer_id, 0) + sum(s.held_destinations for s in olds)
        return out
