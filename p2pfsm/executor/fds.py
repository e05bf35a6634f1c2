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
"""

from __future__ import annotations

import errno
import os
import resource
from typing import Final

from p2pfsm.errors import TransportError

__all__ = ["HEADROOM", "free_descriptors", "require_headroom"]

HEADROOM: Final = 64
"""Free descriptors a dial-back or an agent load needs (each takes a few; the rest covers
the inbound connections libzmq accepts meanwhile)."""
_FD_DIR: Final = "/proc/self/fd"


def free_descriptors() -> int | None:
    """How many more descriptors this process may open (its soft ``RLIMIT_NOFILE`` less
    those open); None when it cannot tell (no limit, or no ``/proc``)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        used = len(os.listdir(_FD_DIR))
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            return 0  # listing them needs a descriptor too
        return None
    return max(0, soft - used)


def require_headroom(what: str) -> None:
    """Raise :class:`TransportError` (``what``, and why) when fewer than
    :data:`HEADROOM` descriptors are free."""
    free = free_descriptors()
    if free is not None and free < HEADROOM:
        raise TransportError(f"{what}: {free} descriptors free, fewer than {HEADROOM}")
