"""libzmq socket monitors: the events a DEALER's monitor reports, read without blocking.

Every DEALER of the control plane has a monitor (an inproc PAIR) subscribed to the few
events the plane acts on; a CURVE ROUTER has one for refused handshakes. This module
holds the event numbers, the subscription masks and the reader; what an event means
for a peer is decided by :class:`~p2pfsm.executor.zmq.plane.ControlPlane`.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Final

import zmq

__all__ = ["DEALER_MASK", "connected_to_itself", "fd_of", "monitor_events"]

EV_CONNECTED: Final = int(zmq.EVENT_CONNECTED)
EV_HANDSHAKE_OK: Final = int(zmq.EVENT_HANDSHAKE_SUCCEEDED)
EV_HANDSHAKE_NO_DETAIL: Final = int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
EV_HANDSHAKE_PROTOCOL: Final = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
EV_AUTH_FAILED: Final = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
EV_HANDSHAKE_FAILED: Final = frozenset(
    {EV_HANDSHAKE_NO_DETAIL, EV_HANDSHAKE_PROTOCOL, EV_AUTH_FAILED})
EV_DISCONNECTED: Final = int(zmq.EVENT_DISCONNECTED)
EV_CLOSED: Final = int(zmq.EVENT_CLOSED)
EV_CONNECT_RETRIED: Final = int(zmq.EVENT_CONNECT_RETRIED)

HANDSHAKE_FAILURES_MASK: Final = EV_HANDSHAKE_NO_DETAIL | EV_HANDSHAKE_PROTOCOL | EV_AUTH_FAILED
"""A ROUTER's monitor: refused handshakes only (CURVE), to count and log them."""

DEALER_MASK: Final = (
    EV_CONNECTED | EV_HANDSHAKE_OK | EV_DISCONNECTED | EV_CLOSED | EV_CONNECT_RETRIED
    | HANDSHAKE_FAILURES_MASK
)
"""Only what a DEALER's monitor is acted on for. While a connection keeps failing to come
up, libzmq repeats CLOSED/DISCONNECTED and CONNECT_RETRIED every reconnect interval; the
first CONNECT_RETRIED (or a handshake failure) before the handshake ends the peer, and
CLOSED/DISCONNECTED end it once it has connected, so none of them piles up."""

_HEADER: Final = struct.Struct("=HI")  # uint16 event id, uint32 value, no padding
_POLLIN: Final = int(zmq.POLLIN)  # plain ints: enum arithmetic costs on every turn
_EVENTS: Final = int(zmq.EVENTS)


def fd_of(sock: zmq.Socket[bytes]) -> int:
    """The socket's notification descriptor (ZMQ_FD), for epoll."""
    fd = sock.getsockopt(zmq.FD)
    assert isinstance(fd, int)
    return fd


def monitor_events(monitor: zmq.Socket[bytes],
                   limit: int | None = None) -> Iterator[tuple[int, int, bytes]]:
    """``(event, value, endpoint)`` of each event ``monitor`` holds, oldest first, without
    blocking; at most ``limit`` messages are read (None: until it is empty). Malformed
    messages are skipped. Stop iterating at any time: the rest stays queued."""
    count = 0
    while limit is None or count < limit:
        count += 1
        # Checking EVENTS first avoids raising zmq.Again on every empty look.
        if not int(monitor.getsockopt(_EVENTS)) & _POLLIN:
            return
        try:
            parts = monitor.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        if not parts or len(parts[0]) != _HEADER.size:
            continue
        event, value = _HEADER.unpack(parts[0])
        yield event, value, parts[1] if len(parts) > 1 else b""


def connected_to_itself(fd: int) -> bool:
    """The TCP socket ``fd`` is connected to itself. A connect to a port nobody listens on
    may be given that very port as its source (the port is in the ephemeral range: TCP's
    simultaneous open then connects the socket to itself), and a DEALER happily completes
    the ZMTP handshake with itself: a dial-back to such an id would hold a connection
    that nothing ever answers. Any error (``fd`` gone meanwhile) answers False."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        return bool(sock.getsockname() == sock.getpeername())
    except OSError:
        return False
    finally:
        sock.detach()  # libzmq's descriptor: never closed here
