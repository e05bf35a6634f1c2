"""What a control plane reports, and what libzmq says of the message a frame came in.

:meth:`~p2pfsm.executor.zmq.plane.ControlPlane.poll` returns a list of :data:`ControlEvent`:
a :class:`FrameIn` for each frame let in, a :class:`PeerLost` once per lost peer.
:func:`frame_meta` and :func:`conn_of` read a received message's ZeroMQ metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

import zmq

__all__ = ["ControlEvent", "FrameIn", "PeerLost", "conn_of", "frame_meta"]


@dataclass(frozen=True, slots=True)
class FrameIn:
    """One control frame received from ``peer_id`` (its routing id, i.e. its local_id) on
    connection ``conn`` (the descriptor libzmq read it from; -1 when unknown)."""

    peer_id: str
    frame: bytes
    conn: int = field(default=-1, compare=False)


@dataclass(frozen=True, slots=True)
class PeerLost:
    """The connection to ``peer_id`` is gone; its DEALER has been closed.

    Reported once per loss. ``reason`` is one of ``"disconnected"``, ``"closed"``,
    ``"handshake failed: CAUSE"`` (the cause as :func:`~p2pfsm.executor.zmq.curve.handshake_cause`
    tells it), ``"connection refused"`` (the TCP connect failed: refused, or
    the host is unreachable), ``"connection closed before handshake"``,
    ``"connect timeout"``, ``"send queue full"``, ``"send failed: ..."`` or
    ``"not connected"`` (a send to an id with no DEALER).
    """

    peer_id: str
    reason: str


ControlEvent: TypeAlias = FrameIn | PeerLost


def conn_of(message: zmq.Frame) -> int:
    """The descriptor of the connection ``message`` came on (-1 when libzmq cannot say)."""
    try:
        return int(message.get(zmq.SRCFD))
    except (zmq.ZMQError, TypeError, ValueError):
        return -1


def frame_meta(frame: zmq.Frame, name: str) -> str | None:
    """A message's ZeroMQ metadata property ``name`` (``Peer-Address``, ``User-Id``), or
    None when libzmq has none or it is not text."""
    try:
        value = frame.get(name)
    except (zmq.ZMQError, UnicodeDecodeError):
        return None
    return value if isinstance(value, str) else None
