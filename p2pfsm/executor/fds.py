"""Descriptors this process may still open, checked before the calls that must not run out.

libzmq and UCX end the process, instead of failing the call, when they cannot have a
descriptor at a few places: libzmq resolving a DEALER's source address (``getifaddrs``;
an assertion in ``ip_resolver.cpp``), UCX loading a remote agent whose endpoint it could
only half make (an assertion in ``stubs.c`` at the next progress; measured with one
descriptor free). A control plane flooded with connects holds one descriptor per inbound
connection, accepted by libzmq's I/O thread whatever the node decides, so a flood can
bring a node near its limit. A dial-back (:mod:`p2pfsm.executor.zmq.dealers`) and an agent
load (:mod:`p2pfsm.executor.nixl.agents`) are therefore refused, as a
:class:`~p2pfsm.errors.TransportError`, while fewer than :data:`HEADROOM` are free.

Counting the open descriptors lists ``/proc/self/fd``, which costs in proportion to
their number: under a flood, thousands, once per dial-back. A count is therefore reused
for :data:`RECOUNT_S` while it left more than :data:`SLACK` to spare above the headroom
(and the limit is unchanged); nearer the limit every check counts.
"""

from __future__ import annotations

import errno
import os
import resource
import time
from typing import Final

from p2pfsm.errors import TransportError

__all__ = ["HEADROOM", "RECOUNT_S", "SLACK", "free_descriptors", "require_headroom"]

HEADROOM: Final = 64
"""Free descriptors a dial-back or an agent load needs (each takes a few; the rest covers
the inbound connections libzmq accepts meanwhile)."""
SLACK: Final = 1024
"""Descriptors to spare above :data:`HEADROOM` for a count to be reused: more than the
connections libzmq accepts in :data:`RECOUNT_S` at the rate a loopback flood reaches."""
RECOUNT_S: Final = 0.05
"""How long a count with :data:`SLACK` to spare stands."""
_FD_DIR: Final = "/proc/self/fd"
_counted: tuple[float, int, int] = (float("-inf"), 0, 0)  # (when, soft limit, open)
_clock = time.monotonic


def free_descriptors() -> int | None:
    """How many more descriptors this process may open (its soft ``RLIMIT_NOFILE`` less
    those open), by the last count where it may stand (module doc); None when it cannot
    tell (no limit, or no ``/proc``)."""
    global _counted
    now = _clock()
    when, soft, used = _counted
    if (now - when < RECOUNT_S and soft - used > HEADROOM + SLACK
            and resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft):
        return soft - used
    count = _open_count()
    if count is None:
        return None
    _counted = (now, *count)
    return max(0, count[0] - count[1])


def _open_count() -> tuple[int, int] | None:
    """The soft limit and the descriptors open; None when it cannot tell."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        return soft, len(os.listdir(_FD_DIR))
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return soft, soft  # listing them needs a descriptor too
        return None


def require_headroom(what: str) -> None:
    """Raise :class:`TransportError` (``what``, and why) when fewer than
    :data:`HEADROOM` descriptors are free."""
    free = free_descriptors()
    if free is not None and free < HEADROOM:
        raise TransportError(f"{what}: {free} descriptors free, fewer than {HEADROOM}")
