"""The host's say over the peers it connected to: forget one, or redial it now.

The node opens a dead session of the host's again by itself (:mod:`p2pfsm.executor.redial`
keeps the book); these calls let the host stop that for one peer, or hurry it. The
peer's state changes go to ``on_peer_state`` (:meth:`NodeState._peer_state`).
"""

from __future__ import annotations

import time

from p2pfsm.executor.node_state import NodeState
from p2pfsm.executor.peer_ids import peer_address
from p2pfsm.fsm import machine
from p2pfsm.session import FailReason, HostClose

__all__ = ["PeerControl"]

_TERMINAL = machine("session").terminal


class PeerControl(NodeState):
    """``disconnect`` and ``redial_now``, host calls of a :class:`~p2pfsm.executor.node.Node`."""

    def disconnect(self, peer_id: str) -> None:
        """Close the session to ``peer_id`` and forget the peer: it is not opened again,
        and the calls that waited for it fail (SESSION_ENDED), as do the open jobs of
        the session it closes. ``connect`` opens it again. A peer with no session is
        only forgotten."""
        peer_id = peer_address(peer_id)
        self._check_open()
        self._check_thread("disconnect")
        ours = self._redials.dialled(peer_id)
        for ev in self._redials.forget(peer_id):
            self._fail_parked(peer_id, ev, FailReason.SESSION_ENDED,
                              "the host disconnected from the peer")
        session = self.sessions.get(peer_id)
        if session is not None and session.state not in _TERMINAL:
            self._queue(peer_id, HostClose(), session)
        if ours:
            self._peer_state(peer_id, "given up", "disconnected by the host")
        self._drain()

    def redial_now(self, peer_id: str) -> bool:
        """Open the session to ``peer_id`` again at the next turn instead of after its
        backoff (the host knows the peer is back); False when no redial of it waits."""
        peer_id = peer_address(peer_id)
        self._check_open()
        self._check_thread("redial_now")
        return self._redials.now(peer_id, time.monotonic())
