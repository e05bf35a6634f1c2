"""Integration tests that run the executor's transports in real, separate processes.

Shared helper: :class:`Child`, a process started with the ``spawn`` start method that
talks to the test over a pipe. Every wait on it is bounded by a deadline and fails with
a message naming what was awaited; :meth:`Child.stop` always ends the process (asks
first, then SIGKILL) and is called from a ``finally`` or fixture teardown.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from helpers.ports import free_port as free_port  # re-exported for the tests here

_SPAWN = multiprocessing.get_context("spawn")


class Child:
    """A spawned helper process and the parent's end of its command pipe."""

    def __init__(self, target: Callable[..., None], *args: Any, name: str = "child") -> None:
        self.name = name
        self.conn, child_end = _SPAWN.Pipe()
        self.proc = _SPAWN.Process(target=target, args=(child_end, *args), name=name, daemon=True)
        self.proc.start()
        child_end.close()

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def recv(self, timeout: float, what: str) -> Any:
        """The next message from the child, or an AssertionError after ``timeout`` s."""
        if not self.conn.poll(timeout):
            raise AssertionError(
                f"{self.name} (pid {self.proc.pid}, alive={self.proc.is_alive()}): "
                f"no {what} within {timeout:.1f} s"
            )
        try:
            return self.conn.recv()
        except EOFError:
            raise AssertionError(
                f"{self.name} exited (code {self.proc.exitcode}) before sending {what}"
            ) from None

    def expect(self, tag: str, timeout: float) -> tuple[Any, ...]:
        """The next message, which must be a tuple starting with ``tag``."""
        msg = self.recv(timeout, repr(tag))
        assert isinstance(msg, tuple) and msg and msg[0] == tag, f"expected {tag!r}, got {msg!r}"
        return msg

    def request(self, *msg: Any, reply: str, timeout: float = 10.0) -> tuple[Any, ...]:
        self.send(*msg)
        return self.expect(reply, timeout)

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the child to stop, then kill it if it has not exited in ``timeout`` s."""
        if self.proc.is_alive():
            try:
                os.kill(self.pid, signal.SIGCONT)  # in case a test froze it
                self.conn.send(("stop",))
            except (OSError, ValueError):
                pass
            # Keep reading what it still reports, so it cannot block on a full pipe.
            deadline = time.monotonic() + timeout
            while self.proc.is_alive() and (remaining := deadline - time.monotonic()) > 0:
                ready = multiprocessing.connection.wait([self.conn, self.proc.sentinel], remaining)
                if self.conn in ready:
                    try:
                        self.conn.recv()
                    except (EOFError, OSError):
                        self.proc.join(remaining)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout)
        self.conn.close()


def wait_until(
    step: Callable[[], list[Any]],
    done: Callable[[list[Any]], bool],
    timeout: float,
    what: str,
) -> list[Any]:
    """Call ``step`` (which must itself wait a bounded time, e.g. ``poll(ms)``) and
    accumulate what it returns until ``done(accumulated)`` or the deadline."""
    deadline = time.monotonic() + timeout
    seen: list[Any] = []
    while True:
        seen.extend(step())
        if done(seen):
            return seen
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {what} within {timeout:.1f} s; saw {seen[-20:]!r}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a whole process (all threads), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rpartition(")")[2].split()
    # Fields after the command name start at field 3 (state); utime/stime are 14/15.
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def drive_nodes(nodes: list[Any], done: Callable[[], bool], what: str,
                timeout: float = 30.0) -> None:
    """Step several nodes of this process in turn until ``done()``; fail naming
    ``what`` after ``timeout`` s."""
    end = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < end, f"no {what} within {timeout} s"
        for node in nodes:
            node.step(0.005)


def drive(node: Any, done: Callable[[], bool], timeout: float, what: str) -> None:
    """Run a Node's loop until ``done()``; fail naming ``what`` (and the node's dropped
    frames and deaths) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {what} within {timeout:.1f} s; drops="
                                 f"{node.control.drop_counts} deaths={dict(node.deaths)}")
        node.step(min(left, 0.05))
