"""What ``/proc`` says about a process: CPU seconds, open descriptors, resident memory."""

from __future__ import annotations

import os

__all__ = ["cpu_s", "fds", "rss", "thread_cpu_s"]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads) so far."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int, name_prefix: str) -> float:
    """User + system CPU seconds so far of ``pid``'s live threads whose name starts with
    ``name_prefix`` (e.g. ``ZMQbg/IO`` for libzmq's I/O threads)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm", encoding="ascii", errors="replace") as f:
                if not f.read().startswith(name_prefix):
                    continue
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


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
