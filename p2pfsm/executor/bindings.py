"""Which inbound connection each peer's session is bound to.

A routing id is only a name ("host:port") that any connection may present, and the
ROUTER hands an id over to the newest connection presenting it (so that a restarted
peer whose old connection still looks open can come back). The id alone therefore
does not say who sent a frame; the connection does. A live session is bound to the
connection its peer's latest admitted frame came on. A frame under the same id on
another connection is not the session's unless it is a connect, which the session
judges as a restart or a reconnect of its peer (a new or the same incarnation);
anything else never reaches it (:meth:`~p2pfsm.executor.node_sessions.NodeSessions._on_frame`).

Connections are named by the descriptor libzmq read the frame from
(:attr:`~p2pfsm.executor.zmq_plane.FrameIn.conn`). A descriptor is reused once its
connection has ended, so a connection opened after the session's own ended may be
given the same one: that residue is described in docs/explanation/reliability.md.
"""

from __future__ import annotations


class Bindings:
    """peer id -> the descriptor of its session's connection."""

    def __init__(self) -> None:
        self._conn: dict[str, int] = {}

    def admits(self, peer_id: str, conn: int) -> bool:
        """A frame of ``peer_id`` on ``conn`` may reach its live session: the session is
        not bound yet, ``conn`` is its connection, or libzmq did not say (-1)."""
        bound = self._conn.get(peer_id)
        return bound is None or bound == conn or conn < 0

    def bind(self, peer_id: str, conn: int) -> None:
        """From now on ``peer_id``'s session is the one of connection ``conn``."""
        if conn >= 0:
            self._conn[peer_id] = conn

    def forget(self, peer_id: str) -> None:
        """``peer_id`` has no session any more: its next frame binds afresh."""
        self._conn.pop(peer_id, None)

    def __len__(self) -> int:
        return len(self._conn)
