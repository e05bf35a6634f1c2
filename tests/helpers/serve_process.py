"""A ``p2pfsm serve`` process for the suites that attack or churn a real server, and the
/proc readings they hold it to (open fds, resident memory). Stopped by its PID."""

from __future__ import annotations

import select
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from p2pfsm.tools.bench import procstat

from .polling import poll_until


def fd_count(pid: int) -> int:
    """Open file descriptors of process ``pid``."""
    return procstat.fds(pid)


def rss(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (VmRSS); a live process always has it."""
    value = procstat.rss(pid)
    if not value:
        raise AssertionError("no VmRSS")
    return value


class ServeProcess:
    """``python -m p2pfsm.tools.cli serve`` on a free loopback port, stderr to ``log``."""

    def __init__(self, log: Path, blocks: int, block_len: int, extra: Sequence[str] = (),
                 start_timeout: float = 60.0, port: int = 0) -> None:
        self.log_path = log
        self._log = open(log, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "p2pfsm.tools.cli", "serve", "--bind", f"tcp://127.0.0.1:{port}",
             "--blocks", str(blocks), "--block-len", str(block_len), *extra],
            stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.pid = self.proc.pid
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], start_timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("serving"):
            self.stop()
            raise AssertionError(f"serve did not start: {line!r}")
        self.addr = line.rsplit("tcp://", 1)[1].strip()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fds(self) -> int:
        return fd_count(self.pid)

    def rss(self) -> int:
        return rss(self.pid)

    def steady_fds(self, timeout: float = 5.0) -> int:
        """The fd count once three reads 100 ms apart agree (at most ``timeout`` s: then
        the last read)."""
        reads: list[int] = []

        def read() -> list[int]:
            reads.append(fd_count(self.pid))
            return reads[-3:]

        last = poll_until(read, lambda r: len(r) == 3 and len(set(r)) == 1, timeout,
                          "a steady fd count", interval=0.1, at_deadline="last")
        return last[-1]

    def kill(self) -> None:
        """SIGKILL, as a crash: the server says nothing to its peers."""
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (the server closes its sessions), SIGKILL if it does not exit."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
