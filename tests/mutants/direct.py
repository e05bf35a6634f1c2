"""mutmut's source mutants tried against one chosen suite, without mutmut's runner.

:mod:`mutants.mutation` has mutmut generate the mutants (``mutants/``: a copy of the
package with every mutant behind a trampoline that reads ``MUTANT_UNDER_TEST``); this
module then judges a sample of them against a suite of its own choosing (``--tests
stateful``: the stateful tests alone), each in a fresh pytest subprocess:

1. the tests are copied into ``mutants/tests`` (the suite as it is now);
2. controls: the suite passes with no mutant on, and fails with mutmut's ``fail``
   switch on (the trampolines are really in use);
3. a reach pass: the suite runs once under ``MUTANT_UNDER_TEST=stats`` and
   :mod:`mutants.hits_plugin` writes every mutated function it called (at import too);
4. each sampled mutant whose function the suite reaches runs the suite (``-x``, the
   ``mutation`` hypothesis profile: CI's examples, no shrinking; ``PYTHONHASHSEED=0``,
   so that set orders, too, are the same in every run), and counts as killed
   when a test fails (or the run passes its time limit); one the suite never reaches
   survives without a run ("not reached"). The mutant is planted in the real package
   by :mod:`mutants.mutmut_plugin` (its function's code swapped, no trampolines: the
   suite runs at its own speed); one it cannot plant runs in mutmut's copy instead.

The seconds printed for a killed mutant are the subprocess' wall time until pytest
stopped at the first failure: how long the suite takes to find it, start-up included.
"""

from __future__ import annotations

import importlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import launch, mutmut_plugin

ROOT = Path(__file__).resolve().parents[2]
MUTANTS_DIR = ROOT / "mutants"

SUITES: dict[str, tuple[str, ...]] = {
    "stateful": ("tests/stateful",),
}
"""The suites a mutant can be judged by (pytest paths, relative to the checkout)."""
EXECUTOR_EXTRA: dict[str, tuple[str, ...]] = {
    "stateful": ("tests/integration/test_node_stateful.py",),
}
"""Added to the suite for a mutant of ``p2pfsm.executor`` (the node-level stateful test:
real nodes, ZeroMQ and NIXL), and to the reach pass."""
PROFILE = "mutation"
"""The hypothesis profile of the runs (tests/conftest.py: CI's, without shrinking)."""


@dataclass(frozen=True)
class Judged:
    name: str
    status: str  # "killed", "timeout", "survived", "not reached"
    seconds: float
    by: str  # the first failing test, or ""

    @property
    def detected(self) -> bool:
        return self.status in ("killed", "timeout")


def function_of(mutant: str) -> str:
    """The mutated function's mangled name, as the trampolines record it."""
    return mutant.partition("__mutmut_")[0]


def suite_for(mutant: str, suite: str) -> tuple[str, ...]:
    extra = EXECUTOR_EXTRA.get(suite, ()) if mutant.startswith("p2pfsm.executor.") else ()
    return SUITES[suite] + extra


def sync_tests() -> None:
    """The checkout's tests, as they are now, in mutmut's copy."""
    shutil.copytree(ROOT / "tests", MUTANTS_DIR / "tests", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))


_DROP = ("P2PFSM_MUTANT", "P2PFSM_SLIP", "P2PFSM_MODELS_DIR", "MUTANT_UNDER_TEST",
         mutmut_plugin.ENV)


def _env(where: Path, **extra: str) -> dict[str, str]:
    return launch.environment(where, _DROP, HYPOTHESIS_PROFILE=PROFILE, PYTHONHASHSEED="0",
                              **extra)


def plantable(name: str) -> bool:
    """Whether :mod:`mutants.mutmut_plugin` can plant ``name`` in the real package."""
    module, cls, func = mutmut_plugin.split(name)
    try:
        target = mutmut_plugin.original(importlib.import_module(module), cls, func)
        mutmut_plugin.mutated_code(name, target)
    except (LookupError, AttributeError, SyntaxError, StopIteration):
        return False
    return True


def run_pytest(mutant: str, paths: tuple[str, ...], timeout: float,
               *plugins: str, planted: bool = False,
               **extra: str) -> tuple[int | None, float, str]:
    """pytest ``paths`` with ``mutant`` on, planted in the real package or (``planted``
    false) switched on in ``mutants/``: exit code (None past ``timeout``), wall
    seconds, first failure."""
    where = ROOT if planted else MUTANTS_DIR
    extra = {**extra, **({mutmut_plugin.ENV: mutant} if planted
                         else {"MUTANT_UNDER_TEST": mutant})}
    if planted:
        plugins = (*plugins, "mutants.mutmut_plugin")
    run = launch.launch(launch.pytest_command(paths, *plugins), where,
                        _env(where, **extra), timeout)
    first = run.first
    if run.code not in (0, 1, None) or (mutant in ("", "stats") and run.code):
        log = MUTANTS_DIR / f"control-{mutant or 'clean'}.log"  # not a plain catch: why
        log.write_text(run.output)
        first += f" (pytest's output: {log})"
    return run.code, run.seconds, first


def reached(paths: tuple[str, ...], timeout: float) -> set[str]:
    """Every mutated function the suite calls (mutmut's ``stats`` trampolines)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "hits.json"
        code, seconds, first = run_pytest("stats", paths, timeout, "mutants.hits_plugin",
                                          P2PFSM_HITS=str(out))
        if code != 0 or not out.exists():
            raise SystemExit(f"the reach pass failed ({code}): {first}")
        hits: set[str] = set(json.loads(out.read_text()))
    print(f"  reach pass: {len(hits)} mutated functions called, {seconds:.0f} s", flush=True)
    return hits


def controls(paths: tuple[str, ...], timeout: float) -> float:
    """The suite passes on the real code and fails with every trampoline failing; returns
    the clean run's seconds."""
    code, seconds, first = run_pytest("", paths, timeout, planted=True)
    if code != 0:
        raise SystemExit(f"the suite fails on the real code ({code}): {first}")
    bad, _, first = run_pytest("fail", paths, timeout)
    if bad in (0, None):
        raise SystemExit(f"the suite passes with every mutated function failing: {first}")
    print(f"  control: passes on the real code ({seconds:.0f} s), fails under `fail`",
          flush=True)
    return seconds


def judge(names: list[str], suite: str, jobs: int) -> Iterator[Judged]:
    """Each of ``names`` judged by ``suite``, yielded in the order given (a run cut
    short has judged a first part: drawn in a random order, a uniform sample too)."""
    sync_tests()
    base = SUITES[suite]
    executor = any(n.startswith("p2pfsm.executor.") for n in names)
    full = base + (EXECUTOR_EXTRA.get(suite, ()) if executor else ())
    clean = controls(full, 1800.0)
    limit = max(300.0, 5 * clean)
    hits = reached(full, 1800.0)
    todo = [n for n in names if function_of(n) in hits]

    planted = {n for n in todo if plantable(n)}
    if len(planted) < len(todo):
        print(f"  {len(todo) - len(planted)} run in mutmut's copy (not plantable)", flush=True)

    def one(name: str) -> Judged:
        if function_of(name) not in hits:
            return Judged(name, "not reached", 0.0, "")
        code, seconds, first = run_pytest(name, suite_for(name, suite), limit,
                                          planted=name in planted)
        if code is None:
            return Judged(name, "timeout", seconds, first)
        return Judged(name, "survived" if code == 0 else "killed", seconds,
                      first if code else "")

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        yield from pool.map(one, names)
