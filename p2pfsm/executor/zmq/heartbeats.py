"""ZMTP heartbeats, set the same way on a control plane's ROUTER and DEALERs.

Each DEALER PINGs every ``ivl_ms`` and drops its connection after ``timeout_ms`` of
silence; the ROUTER drops an inbound connection whose PINGs stop for their TTL, and
PINGs itself only ``ROUTER_PING_FACTOR`` times as rarely, for peers that send none. So
libzmq drops the TCP connection of a frozen peer (a killed peer's kernel closes it at
once). The TTL a socket sends always outlasts its own PING interval
(:meth:`Heartbeats.ttl_for`), so a peer without heartbeats keeps an idle connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import zmq

from p2pfsm.executor.zmq.admission import check_int

__all__ = ["MAX_TTL_MS", "ROUTER_PING_FACTOR", "Heartbeats"]

MAX_TTL_MS: Final = 6_553_599  # ZMTP carries the TTL in deciseconds, 16 bits.
ROUTER_PING_FACTOR: Final = 6  # the ROUTER's own PINGs, in DEALER heartbeat intervals
_MAX_IVL_MS: Final = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Heartbeats:
    """``ZMQ_HEARTBEAT_IVL``, ``_TIMEOUT`` and ``_TTL`` in ms (vLLM: 2000/10000/10000)."""

    ivl_ms: int
    timeout_ms: int
    ttl_ms: int

    @classmethod
    def checked(cls, ivl_ms: int, timeout_ms: int, ttl_ms: int) -> Heartbeats:
        """The three, each an int >= 0 (the TTL at most what ZMTP carries), else
        :class:`~p2pfsm.errors.ConfigError`."""
        return cls(check_int("heartbeat_ivl_ms", ivl_ms, 0),
                   check_int("heartbeat_timeout_ms", timeout_ms, 0),
                   check_int("heartbeat_ttl_ms", ttl_ms, 0, MAX_TTL_MS))

    def apply(self, sock: zmq.Socket[bytes], every: int = 1) -> None:
        """ZMTP heartbeats on ``sock``: a PING every ``every`` heartbeat intervals.

        A DEALER pings at the interval. The ROUTER pings ``ROUTER_PING_FACTOR`` times as
        rarely: each inbound connection is already pinged by the DEALER at its other end
        (ours and vLLM's set a TTL, which libzmq enforces here: silence past it drops the
        connection), and libzmq answers every PING with a PONG whatever these options
        say. The ROUTER's own rare PING covers a peer that sends none: one whose DEALER
        sets no heartbeats, or one frozen before its first PING (no TTL armed yet)."""
        ivl = min(self.ivl_ms * every, _MAX_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.timeout_ms)
        sock.setsockopt(zmq.HEARTBEAT_TTL, self.ttl_for(ivl))

    def ttl_for(self, ivl_ms: int) -> int:
        """The TTL a socket PINGing every ``ivl_ms`` sends: ``ttl_ms`` when it outlasts
        that interval, else the interval plus the timeout. The TTL tells the *peer* how
        long to wait for our traffic; a peer that sends no heartbeats of its own hears
        from us only at our PINGs, so a TTL shorter than our interval would make it
        drop a healthy, idle connection after every PING."""
        if not ivl_ms or self.ttl_ms > ivl_ms:
            return self.ttl_ms
        return min(ivl_ms + self.timeout_ms, MAX_TTL_MS)
