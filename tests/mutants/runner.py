"""Run a suite under a mutant and say whether, and how fast, it caught it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hypothesis import Phase, seed, settings
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from .install import ENV, installed

ROOT = Path(__file__).resolve().parents[2]
SUITES = {
    "scenarios": ["tests/scenarios"],
    "replay": ["tests/conformance/test_edge_cover.py"],
}
"""The other suites a mutant is tried against (pytest paths, run in a subprocess)."""
SLIP_QUIET = {"P2PFSM_SLIP_QUIET_S": "15"}
"""The environment of a run under a slip: a wait the slip makes endless is the catch,
and 15 s shows it as well as the 60 s the real code's run keeps
(tests/integration/test_node_stateful.py, ``QUIET_S``)."""


@dataclass(frozen=True)
class Outcome:
    caught: bool
    examples: int | None
    seconds: float
    detail: str


def ci_settings(profile: str = "ci") -> settings:
    """The profile of tests/conftest.py, without shrinking (finding is what counts)."""
    try:
        base = settings.get_profile(profile)
    except InvalidArgument:
        spec = importlib.util.spec_from_file_location("_p2pfsm_profiles",
                                                      ROOT / "tests" / "conftest.py")
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        base = settings.get_profile(profile)
    return settings(base, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
                    print_blob=False)


def stateful(mutant: str | None, machine: type[RuleBasedStateMachine],
             profile: str = "ci", seed_: int | None = None) -> Outcome:
    """Run the stateful machine under ``mutant`` (None: the real code); ``seed_`` fixes
    hypothesis' seed (None: the profile's, derandomized in CI)."""
    counter = [0]

    class Counting(machine):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            counter[0] += 1
            super().__init__()

    Counting.__name__ = machine.__name__
    if seed_ is not None:
        Counting = seed(seed_)(Counting)
    start = time.perf_counter()
    try:
        if mutant is None:
            run_state_machine_as_test(Counting, settings=ci_settings(profile))
        else:
            with installed(mutant):
                run_state_machine_as_test(Counting, settings=ci_settings(profile))
    except Exception as exc:  # the failure the suite reports
        found = first_failure(exc)
        first = str(found).strip().splitlines()[0] if str(found).strip() else ""
        # Only a failed check is a catch; anything else (a hypothesis error) is a bug here.
        return Outcome(isinstance(found, AssertionError), counter[0],
                       time.perf_counter() - start, f"{type(found).__name__}: {first}"[:160])
    return Outcome(False, counter[0], time.perf_counter() - start, "passed")


CHECKS = (
    ("sent for job", "TerminalFrameInv (ghost job)"),
    ("rejected a conformant peer", "NoProtocolErrorInv"),
    ("reused a round", "RoundReuseInv"),
    ("may still land", "NoFreeWhileWriteInv (release)"),
    ("landed in block", "NoFreeWhileWriteInv (landing)"),
    ("written while free", "canary"),
    ("unpinned while write", "NoUnpinWhileReadInv"),
    ("wrong bytes", "right bytes"),
    ("second result", "one result per job"),
    ("unowned blocks", "WriteTargetInv"),
    ("outside the peer's region", "WriteTargetInv (region)"),
    ("AssertionError: (", "RoundIsolationInv or, once quiet, a job without result"),
    ("quiescence", "quiescence (teardown)"),
)
"""Which named check a failure's first line comes from (first match wins)."""


def check_of(o: Outcome) -> str:
    """The named check that caught the mutant, from the first line of the failure."""
    if o.detail.startswith("AssertionError: ('"):
        return "exactly one result once quiet (teardown)"
    if o.detail.startswith("AssertionError: ("):
        return "RoundIsolationInv"
    return next((name for key, name in CHECKS if key in o.detail), o.detail[:60])


def first_failure(exc: BaseException) -> BaseException:
    """The check that failed first: a violation inside a step, not the teardown's
    complaint about the state that step left (raised while handling it)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    while exc.__context__ is not None and isinstance(exc.__context__, AssertionError):
        exc = exc.__context__
    return exc


def suite(mutant: str, name: str, timeout: float = 900.0) -> Outcome:
    """Run pytest suite ``name`` in a subprocess under ``mutant``, stopping at the first
    failure."""
    env = dict(os.environ, **{ENV: mutant},
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "mutants.plugin",
           "-p", "no:cacheprovider", "--no-header", "-rN", *SUITES[name]]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Outcome(False, None, time.perf_counter() - start, f"timed out after {timeout}s")
    seconds = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    failed = [ln for ln in lines if ln.startswith("FAILED") or "failed" in ln]
    summary = lines[-1] if lines else proc.stderr.strip()[-160:]
    first = next((ln for ln in lines if ln.startswith("FAILED")), summary)
    return Outcome(proc.returncode == 1 and bool(failed), None, seconds, first[:200])


@dataclass(frozen=True)
class PytestRun:
    """What one pytest subprocess reported."""

    code: int
    failed: tuple[str, ...]
    """The failed tests' ``-rf`` lines: node id, then the failure's first line."""
    summary: str


def pytest_under(mutant: str | None, paths: list[str], timeout: float = 600.0) -> PytestRun:
    """Run pytest ``paths`` in a subprocess with ``mutant`` switched on (None: the real
    code) through :mod:`mutants.plugin`; every test runs (no ``-x``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
               COLUMNS="400")  # -rf lines keep the failure's message
    env.pop(ENV, None)
    if mutant is not None:
        env[ENV] = mutant
        env.update(SLIP_QUIET)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "mutants.plugin", "-p",
           "no:cacheprovider", "-rf", *paths]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        return PytestRun(-1, (), f"timed out after {timeout} s: {exc.stdout!r}"[-400:])
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    failed = tuple(ln.removeprefix("FAILED ") for ln in lines if ln.startswith("FAILED "))
    summary = lines[-1] if lines else proc.stderr.strip()[-400:]
    return PytestRun(proc.returncode, failed, summary)
