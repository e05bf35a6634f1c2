"""The mutation score: mutmut over the package's control code, and the models' mutants.

    PYTHONPATH=. .venv/bin/python -m tests.mutants.mutation --sample 200 --seed 0 \\
        --models-sample 40 --jobs 2

(needs ``pip install -e '.[mutation]'``; docs/explanation/verification.md, "Mutation score").

Source mutants: mutmut 3 (``[tool.mutmut]`` in pyproject.toml says what it mutates and
which tests run) copies the package into ``mutants/`` with every mutant behind a
trampoline. This job has mutmut generate them, draws ``--sample`` of them uniformly
(``--seed``; ``--sample 0``: all), lets ``mutmut run`` try exactly those (each against
the tests that reach its function, ``-x``), and reads back each one's verdict.

Model mutants: :mod:`mutants.toml_mutator`, ``--models-sample`` of them drawn the same
way (0: all).

Each part prints killed/total with a 95 % (Wilson) interval when sampled, and every
survivor. ``--only source`` or ``--only models`` runs one part.

``--tests stateful`` scores the stateful tests alone (``tests/stateful``; for a mutant of
``p2pfsm.executor`` also ``tests/integration/test_node_stateful.py``), with CI's
examples and no shrinking (the ``mutation`` hypothesis profile): the same samples (same
``--seed``), the source mutants judged by :mod:`mutants.direct` (each in its own pytest
subprocess, the seconds it took to find each killed one printed), the model mutants by
``tests/stateful`` instead of the whole kill suite.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from mutants import direct, toml_mutator  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MUTANTS_DIR = ROOT / "mutants"
KILLED = {1: "killed", 3: "killed", 36: "timeout", 24: "timeout", -24: "timeout",
          152: "timeout", 255: "timeout", 37: "type check"}
"""mutmut's exit codes that count as detected (the rest: survived, no tests, suspicious)."""

_GENERATE = """
import os
from mutmut.__main__ import (copy_also_copy_files, copy_src_dir, create_mutants,
                             set_mutant_under_test, setup_source_paths,
                             store_lines_covered_by_tests)
set_mutant_under_test("mutant_generation")
os.makedirs("mutants", exist_ok=True)
copy_src_dir()
copy_also_copy_files()
setup_source_paths()
store_lines_covered_by_tests()
create_mutants(1)
"""


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of a proportion k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def score_line(what: str, detected: int, total: int, population: int) -> str:
    pct = 100 * detected / total if total else 0.0
    line = f"{what}: {detected}/{total} killed ({pct:.1f} %)"
    if total < population:
        lo, hi = wilson(detected, total)
        line += (f", a uniform sample of {total} of {population}; 95 % interval "
                 f"{100 * lo:.1f}-{100 * hi:.1f} %")
    return line


def _metas() -> list[Path]:
    return sorted(MUTANTS_DIR.rglob("*.py.meta"))


def generate() -> None:
    """Have mutmut (re)create ``mutants/`` with every mutant of ``[tool.mutmut]``."""
    subprocess.run([sys.executable, "-c", _GENERATE], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)


def source_mutants() -> list[str]:
    names: list[str] = []
    for meta in _metas():
        names += json.loads(meta.read_text())["exit_code_by_key"]
    return sorted(names)


def source_verdicts(names: list[str]) -> dict[str, int | None]:
    wanted = set(names)
    found: dict[str, int | None] = {}
    for meta in _metas():
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if name in wanted:
                found[name] = code
    return found


def _status(code: int | None) -> str:
    if code is None:
        return "not checked"
    return KILLED.get(code, "survived" if code == 0 else f"exit {code}")


def run_source(size: int, seed: int, jobs: int, log: Path, resume: bool = False) -> int:
    generate()
    population = source_mutants()
    chosen = (population if size == 0 or size >= len(population)
              else sorted(random.Random(seed).sample(population, size)))
    todo = chosen
    if resume:  # only those without a verdict yet (mutmut keeps each one's in mutants/)
        known = source_verdicts(chosen)
        todo = [n for n in chosen if known.get(n) is None]
    print(f"source mutants: {len(population)} in all; trying {len(todo)} of a sample of "
          f"{len(chosen)} (seed {seed}); mutmut's log: {log}", flush=True)
    start = time.monotonic()
    if todo:
        with log.open("w") as out:
            subprocess.run(["nice", "-n", "19", sys.executable, "-m", "mutmut", "run",
                            "--max-children", str(jobs), *todo],
                           cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False)
    verdicts = source_verdicts(chosen)
    statuses = Counter(_status(verdicts.get(n)) for n in chosen)
    detected = sum(v for k, v in statuses.items() if k in set(KILLED.values()))
    print(f"  {dict(statuses)} in {time.monotonic() - start:.0f} s")
    print(score_line("source", detected, len(chosen), len(population)))
    survivors = [n for n in chosen if verdicts.get(n) not in KILLED]
    for name in survivors:
        print(f"  survived: {name} (exit {verdicts.get(name)}; `mutmut show {name}`)")
    return len(survivors)


def run_source_direct(size: int, seed: int, jobs: int, tests: str) -> int:
    """The source sample judged by ``tests`` alone (:mod:`mutants.direct`)."""
    generate()
    population = source_mutants()
    # the same draw as run_source's, judged in the order drawn: any first part of a run
    # cut short is a uniform sample too
    chosen = (population if size == 0 or size >= len(population)
              else random.Random(seed).sample(population, size))
    print(f"source mutants: {len(population)} in all; a sample of {len(chosen)} (seed "
          f"{seed}) judged by the {tests} tests alone", flush=True)
    start = time.monotonic()
    statuses: Counter[str] = Counter()
    survivors: list[str] = []
    for i, j in enumerate(direct.judge(chosen, tests, jobs), 1):
        statuses[j.status] += 1
        print(f"  {i:3} {j.status:11} {j.seconds:5.0f} s {j.name}: {j.by[:100]}", flush=True)
        if not j.detected:
            survivors.append(j.name)
    print(f"  {dict(statuses)} in {time.monotonic() - start:.0f} s")
    print(score_line(f"source ({tests} alone)", len(chosen) - len(survivors), len(chosen),
                     len(population)))
    for name in sorted(survivors):
        print(f"  survived: {name} (`mutmut show {name}`)")
    return len(survivors)


def run_models(size: int, seed: int, timeout: float, control: bool = True,
               suite: tuple[str, ...] = toml_mutator.KILL_SUITE) -> int:
    population = toml_mutator.enumerate_mutants()
    chosen = toml_mutator.sample(population, size or None, seed)
    print(f"model mutants: {len(population)} in all; trying {len(chosen)} (seed {seed})",
          flush=True)
    if control:  # the real models, through the same plugin: the suite must pass
        with tempfile.TemporaryDirectory() as tmp:
            for path in toml_mutator.MODELS.glob("*.toml"):
                shutil.copy2(path, Path(tmp) / path.name)
            code, first = toml_mutator.run_suite(Path(tmp), suite, timeout=timeout)
        if code != 0:
            raise SystemExit(f"the kill suite fails on the real models: {first}")
        print("  control (the real models): passed", flush=True)
    statuses: Counter[str] = Counter()
    kinds: Counter[tuple[str, str]] = Counter()
    survivors: list[str] = []
    for v in toml_mutator.run(chosen, suite, timeout=timeout):
        statuses[v.status] += 1
        kinds[(v.mutant.kind, "detected" if v.detected else "survived")] += 1
        print(f"  {v.status:8} {v.seconds:5.0f} s {v.mutant.name}: {v.by[:120]}", flush=True)
        if not v.detected:
            survivors.append(v.mutant.name)
    print(f"  {dict(statuses)}")
    for kind in toml_mutator.KINDS:
        d, s = kinds[(kind, "detected")], kinds[(kind, "survived")]
        if d + s:
            print(f"  {kind}: {d}/{d + s} killed")
    print(score_line(f"models ({' '.join(suite)})", len(chosen) - len(survivors),
                     len(chosen), len(population)))
    for name in survivors:
        print(f"  survived: {name}")
    return len(survivors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, default=200, help="source mutants (0: all)")
    ap.add_argument("--models-sample", type=int, default=40, help="model mutants (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="mutmut's workers")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds before a model mutant's suite counts as hung (killed)")
    ap.add_argument("--only", choices=("source", "models"))
    ap.add_argument("--resume", action="store_true",
                    help="source: try only the sampled mutants mutmut has no verdict for")
    ap.add_argument("--no-control", action="store_true",
                    help="models: skip the run of the suite on the real models")
    ap.add_argument("--log", type=Path, default=MUTANTS_DIR / "run.log")
    ap.add_argument("--tests", choices=("fast", *direct.SUITES), default="fast",
                    help="fast: mutmut and the whole kill suite; stateful: the stateful "
                         "tests alone")
    args = ap.parse_args(argv)
    os.nice(19)
    survivors = 0
    if args.tests != "fast":
        os.environ["HYPOTHESIS_PROFILE"] = direct.PROFILE
    if args.only in (None, "models"):
        suite = toml_mutator.KILL_SUITE if args.tests == "fast" else direct.SUITES[args.tests]
        survivors += run_models(args.models_sample, args.seed, args.timeout,
                                not args.no_control, suite)
    if args.only in (None, "source") and args.tests != "fast":
        survivors += run_source_direct(args.sample, args.seed, args.jobs, args.tests)
    elif args.only in (None, "source"):
        args.log.parent.mkdir(exist_ok=True)
        survivors += run_source(args.sample, args.seed, args.jobs, args.log, args.resume)
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
