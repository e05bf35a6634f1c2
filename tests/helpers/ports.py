"""A loopback port a test process may bind later (a peer restarted on the port it had).

A port found by binding port 0 comes from the kernel's ephemeral range, the same range
it draws every outgoing connection's source port from: between the finding and the
binding another connection may take it. :func:`free_port` draws below that range
instead, where the kernel assigns no port by itself, and checks that nobody holds it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000
_TRIES = 200


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` outside the ephemeral range that nobody holds now."""
    high = _ephemeral_low()
    for _ in range(_TRIES):
        port = random.randrange(_LOWEST, high) if high > _LOWEST else 0
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            found: int = s.getsockname()[1]
            return found
    raise RuntimeError(f"no free port of {host} in {_TRIES} tries below {high}")
