"""A benchmark's helper process: spawned, driven over a pipe, always stopped."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection

__all__ = ["BenchChild"]


class BenchChild:
    """``target(conn)`` in a spawned daemon process; :meth:`stop` ends it (asks with
    ``("stop",)``, then kills it) and closes the pipe."""

    def __init__(self, target: Callable[[Connection], None], name: str) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.conn, child_end = spawn.Pipe()
        self.proc = spawn.Process(target=target, args=(child_end,), daemon=True, name=name)
        self.proc.start()
        child_end.close()

    def stop(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(OSError, ValueError):  # it may have died
                self.conn.send(("stop",))
            self.proc.join(10.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10.0)
        self.conn.close()
