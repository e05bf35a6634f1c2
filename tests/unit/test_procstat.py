"""The bench's /proc readers: per-thread CPU is a share of the process's."""

from __future__ import annotations

import os

from p2pfsm.tools.bench.procstat import cpu_s, thread_cpu_s


def test_thread_cpu_by_name() -> None:
    pid = os.getpid()
    with open(f"/proc/{pid}/task/{pid}/comm", encoding="ascii") as f:
        main_name = f.read().strip()
    mine = thread_cpu_s(pid, main_name)
    every = thread_cpu_s(pid, "")
    assert mine > 0.0  # the test process has run its imports on this thread
    assert mine <= every <= cpu_s(pid)  # live threads' share of the process's total
    assert thread_cpu_s(pid, "no such thread \x01") == 0.0
