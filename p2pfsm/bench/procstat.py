"""What ``/proc`` says about a process: CPU seconds, open descriptors, resident memory."""

from __future__ import annotations

import os

__all__ = ["cpu_s", "fds", "rss"]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fds(pid: int) -> int:
    """How many descriptors ``pid`` has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(pid: int) -> int:
    """Resident memory of ``pid`` in bytes (``VmRSS``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
