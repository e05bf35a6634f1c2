"""One way to run a kill suite in a fresh pytest process: the command, the environment
every mutant run shares, and what comes back (exit code, wall seconds, first failure)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Launched:
    """A finished pytest run: its exit code (None past its time limit), wall seconds,
    the first failing test it names, and its whole output."""

    code: int | None
    seconds: float
    first: str
    output: str


def pytest_command(paths: tuple[str, ...], *plugins: str) -> list[str]:
    """``python -m pytest`` stopping at the first failure, quiet, no cache, with
    ``plugins`` loaded, over ``paths``."""
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           "--no-header", "-rf"]
    for plugin in plugins:
        cmd += ["-p", plugin]
    return [*cmd, *paths]


def environment(where: Path, drop: tuple[str, ...], **extra: str) -> dict[str, str]:
    """This process' environment with ``where`` and its tests first on ``PYTHONPATH``,
    the variables ``drop`` removed unless ``extra`` sets them, and ``extra`` added."""
    env = dict(os.environ)
    inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(where), str(where / "tests"), *inherited])
    for name in drop:
        if name not in extra:
            env.pop(name, None)
    env.update(extra)
    return env


def first_failure(output: str) -> str:
    """The first ``FAILED``/``ERROR`` test id in pytest's output, else its last line."""
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" ", 1)[1].split(" - ")[0]
    return output.strip().splitlines()[-1] if output.strip() else ""


def launch(cmd: list[str], where: Path, env: dict[str, str], timeout: float) -> Launched:
    """Run ``cmd`` in ``where`` and wait for it, at most ``timeout`` seconds (the child
    is killed then, by ``subprocess.run``)."""
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Launched(None, time.monotonic() - start, f"no result within {timeout:.0f} s",
                        "")
    output = proc.stdout + proc.stderr
    return Launched(proc.returncode, time.monotonic() - start, first_failure(output), output)
