"""Which inbound connection each peer's session is bound to.

A routing id is only a name ("host:port") that any connection may present; the ROUTER
reads only the first connection presenting a live id (a twin's is never read), and a
new connection under the id only once that one ended. A live session is bound to the
connection its peer's latest admitted frame came on. A frame under the same id on
another connection therefore comes after the session's own connection ended, from the
host it came from (:mod:`p2pfsm.executor.zmq.intake`): a connect the session judges
as a restart or a reconnect of its peer (a new or the same incarnation); anything else
carries the session over to the new connection, as libzmq's own reconnect does
(:meth:`~p2pfsm.executor.node.peers.Peers.on_frame`).

Connections are named by the descriptor libzmq read the frame from
(:attr:`~p2pfsm.executor.zmq.plane.FrameIn.conn`). A descriptor is reused once its
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
