"""The bench's other processes: started here, read with a deadline, stopped and reaped by
PID, whatever happens in between.

* :class:`Child` -- a Python function in a spawned process, talked to over a pipe.
* :class:`Command` -- a program whose stdout is read line by line.
* :func:`run_to_end` -- a program run to its end under a time bound.

Each is a context manager; leaving it stops the process (asks, waits, kills) and reaps it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from p2pfsm.errors import TransportError

__all__ = ["Child", "Command", "env", "run_to_end"]

_STOP_S = 10.0


def env(**extra: str) -> dict[str, str]:
    """This environment with this checkout first on ``PYTHONPATH`` (a child imports the
    p2pfsm this process runs), plus ``extra``."""
    out = dict(os.environ, **extra)
    here = str(Path(__file__).resolve().parents[3])
    out["PYTHONPATH"] = here + (os.pathsep + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    return out


class _Stops:
    """Context-manager plumbing: ``with X(...) as x`` stops ``x`` on the way out."""

    def stop(self) -> int | None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, _t: type[BaseException] | None, _e: BaseException | None,
                 _tb: TracebackType | None) -> None:
        self.stop()


class Child(_Stops):
    """``target(conn, *args)`` in a daemon process started by ``method`` (``spawn``, or
    ``forkserver`` with ``preload`` imported once for every child).

    :meth:`ask` sends a command tuple and returns the reply of the same tag;
    :meth:`stop` sends ``("stop",)``, waits, then kills, and closes the pipe.
    """

    def __init__(self, target: Callable[..., None], name: str, args: Sequence[Any] = (),
                 method: str = "spawn", preload: Sequence[str] = ()) -> None:
        ctx: Any = multiprocessing.get_context(method)  # spawn or forkserver
        if preload:
            ctx.set_forkserver_preload(list(preload))
        self.conn: Connection
        self.conn, child_end = ctx.Pipe()
        self.proc: BaseProcess = ctx.Process(target=target, args=(child_end, *args),
                                             daemon=True, name=name)
        self.proc.start()
        child_end.close()
        self.name = name

    @property
    def pid(self) -> int:
        """The child's process id."""
        pid = self.proc.pid
        assert pid is not None  # started in __init__
        return pid

    def expect(self, tag: str, timeout: float, pump: Callable[[], object] | None = None
               ) -> tuple[Any, ...]:
        """The child's next message, which must be ``tag`` (or ``("error", text)``, raised),
        calling ``pump`` between looks (or sleeping in the pipe's poll without one)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (not self.proc.is_alive() and not self.conn.poll(0)):
                raise TransportError(f"{self.name}: no {tag!r} reply (exit code "
                                     f"{self.proc.exitcode})")
            if pump is not None:
                pump()
                ready = self.conn.poll(0)
            else:
                ready = self.conn.poll(min(left, 0.05))
            if ready:
                try:
                    msg = self.conn.recv()
                except EOFError:
                    raise TransportError(f"{self.name} exited (code "
                                         f"{self.proc.exitcode})") from None
                if msg[0] == "error" and tag != "error":
                    raise TransportError(f"{self.name} failed: {msg[1]}")
                if msg[0] != tag:
                    raise TransportError(f"{self.name}: expected {tag!r}, got {msg[0]!r}")
                return tuple(msg)

    def ask(self, *cmd: Any, timeout: float = 60.0, pump: Callable[[], object] | None = None
            ) -> tuple[Any, ...]:
        """Send ``cmd``; the reply tagged ``cmd[0]``."""
        self.conn.send(cmd)
        return self.expect(str(cmd[0]), timeout, pump)

    def stop(self) -> int | None:
        """Ask the child to stop, then kill it; reap it; its exit code."""
        if self.proc.is_alive():
            with contextlib.suppress(OSError, ValueError):  # it may have died
                self.conn.send(("stop",))
            self.proc.join(_STOP_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(_STOP_S)
        self.conn.close()
        return self.proc.exitcode


class Command(_Stops):
    """``argv`` started with :func:`env` (and ``extra_env``), stdout piped, stderr
    dropped; :meth:`readline` with a deadline; :meth:`stop` sends ``SIGTERM``, waits, then
    kills, and reaps."""

    def __init__(self, argv: Sequence[str], name: str,
                 extra_env: dict[str, str] | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env(**(extra_env or {})))
        self._buf = bytearray()

    @property
    def pid(self) -> int:
        """The program's process id."""
        return self.proc.pid

    def readline(self, until: float) -> str:
        """The next stdout line (read from the descriptor itself, so that select() sees
        every byte not yet taken); a TransportError at ``until`` (monotonic) or at EOF."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = until - time.monotonic()
            if left <= 0:
                raise TransportError(f"{self.name}: no line within the time bound")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise TransportError(f"{self.name}: exited ({self.proc.wait(_STOP_S)})")
                self._buf += chunk
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf[:] = rest
        return line.decode("utf-8", "replace") + "\n"

    def stop(self, wait: float = _STOP_S) -> int | None:
        """``SIGTERM``, up to ``wait`` s, then ``SIGKILL``; reap; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(_STOP_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def run_to_end(argv: Sequence[str], timeout: float, extra_env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str] | None:
    """Run ``argv`` with :func:`env` to its end, output captured; None when it ran past
    ``timeout`` s (it is killed and reaped then)."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, check=False,
                              env=env(**(extra_env or {})), timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
