"""TLC runs that a test session shares, started on a thread of their own.

The conformance suite checks a few configs once per session (the gate and each profile's
gate with their graphs dumped, every must-fail config). They take minutes of one core,
so the session starts them in the background as collection ends and moves the tests
that read them to the end of the run: TLC works on the second core while the rest of
the suite runs. A fixture asks for a run by name and waits for it; a run nobody started
is run at once, in the asking thread. Closing kills what still runs.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from p2pfsm.tools.verify import tlc

Started = Callable[[subprocess.Popen[bytes]], None]
Job = Callable[[Path, Started | None], tlc.TlcResult]
"""A run: given a folder for its dumps and the callback TLC's process is handed to."""


class BackgroundRuns:
    """Named TLC runs, one at a time, in the order they were started."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="p2pfsm-tlc-runs-"))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tlc-background")
        self._futures: dict[str, Future[tlc.TlcResult]] = {}
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._closed = False

    def start(self, name: str, job: Job) -> None:
        """Queue ``job`` under ``name`` (a name already queued is left as it is)."""
        if name not in self._futures and not self._closed:
            self._futures[name] = self._pool.submit(self._run, job)

    def result(self, name: str, job: Job) -> tlc.TlcResult:
        """The run named ``name``: waited for where it was started, else run here."""
        future = self._futures.get(name)
        if future is None:
            return job(self.folder, None)
        return future.result()

    def close(self) -> None:
        """Drop the runs not begun, kill the one running, wait for its thread, and
        remove the dumps."""
        with self._lock:
            self._closed = True
            for proc in self._running:
                proc.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, job: Job) -> tlc.TlcResult:
        procs: list[subprocess.Popen[bytes]] = []

        def started(proc: subprocess.Popen[bytes]) -> None:
            with self._lock:
                procs.append(proc)
                self._running.add(proc)
                if self._closed:
                    proc.kill()

        try:
            return job(self.folder, started)
        finally:
            with self._lock:
                self._running.difference_update(procs)
