"""The mutant job: apply each must-fail mutant and show which suites catch it, how fast.

    PYTHONPATH=. .venv/bin/python -m tests.mutants [--suites stateful,scenarios,replay]
        [--profile ci|long] [NAME ...]
    PYTHONPATH=. .venv/bin/python -m tests.mutants --seeds 10 [NAME ...]

With ``--seeds N`` only the stateful test runs, once per hypothesis seed 0..N-1 (the
control too): the table gives each mutant's catch rate over the seeds, the median
examples and seconds to the first failure of the runs that caught it, and which named
checks fired.

For each mutant: the stateful test alone (examples and seconds to the first failure,
in-process, no shrinking), then the scenario suite and the conformance replay (pytest in
a subprocess under ``-p mutants.plugin``, stopping at the first failure; the replay
needs java and TLC). The real code is run first as the control: it must pass.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from stateful.machine import TwoSessions  # noqa: E402

from mutants.catalogue import MUTANTS  # noqa: E402
from mutants.runner import Outcome, check_of, stateful, suite  # noqa: E402


def _cell(o: Outcome) -> str:
    if not o.caught:
        return f"no ({o.seconds:.0f} s)"
    ex = f"{o.examples} examples, " if o.examples is not None else ""
    return f"yes ({ex}{o.seconds:.1f} s)"


def rates(names: list[str], seeds: int, profile: str, control: bool = True) -> int:
    """The catch rate of the stateful test alone over hypothesis seeds 0..seeds-1."""
    # The real code passes only by running every example: any error is a failure.
    passed = [stateful(None, TwoSessions, profile, s).detail == "passed"
              for s in range(seeds if control else 0)]
    if control:
        print(f"control (real code): passed {sum(passed)}/{seeds} seeds", flush=True)
    print("| mutant | race | caught by stateful alone | median examples | median seconds "
          "| named check that fired (seeds) |")
    print("|---|---|---|---|---|---|")
    missed = 0
    for name in names:
        runs = [stateful(name, TwoSessions, profile, s) for s in range(seeds)]
        hits = [o for o in runs if o.caught]
        missed += len(runs) - len(hits)
        checks = Counter(check_of(o) for o in hits)
        ex = statistics.median(o.examples or 0 for o in hits) if hits else "-"
        sec = f"{statistics.median(o.seconds for o in hits):.1f}" if hits else "-"
        print(f"| `{name}` | {MUTANTS[name].race} | {len(hits)}/{seeds} | {ex} | {sec} | "
              + ", ".join(f"{c} ({n})" for c, n in checks.most_common()) + " |", flush=True)
    return 1 if missed or not all(passed) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.mutants", description=__doc__)
    ap.add_argument("names", nargs="*", help="mutants (default: all)")
    ap.add_argument("--suites", default="stateful,scenarios,replay")
    ap.add_argument("--profile", default="ci", help="hypothesis profile of the stateful run")
    ap.add_argument("--seeds", type=int, default=0,
                    help="catch rates of the stateful test over seeds 0..N-1 (only it runs)")
    ap.add_argument("--no-control", action="store_true",
                    help="with --seeds: skip the control runs of the real code")
    args = ap.parse_args(argv)
    names = args.names or list(MUTANTS)
    suites = args.suites.split(",")
    bad = [n for n in names if n not in MUTANTS]
    if bad:
        ap.error(f"unknown mutants {bad}; known: {', '.join(MUTANTS)}")
    if args.seeds > 0:
        return rates(names, args.seeds, args.profile, not args.no_control)
    if "stateful" in suites:
        control = stateful(None, TwoSessions, args.profile)
        print(f"control (real code), stateful: {control.detail[:6].upper()} "
              f"{control.examples} examples in {control.seconds:.1f} s {control.detail}")
        if control.detail != "passed":
            return 1
    heads = ["stateful alone" if s == "stateful" else s for s in suites]
    print("| mutant | race | " + " | ".join(heads) + " | first failure |")
    missed = 0
    for name in names:
        entry = MUTANTS[name]
        cells = [name, entry.race]
        detail = ""
        for s in suites:
            o = stateful(name, TwoSessions, args.profile) if s == "stateful" else suite(name, s)
            cells.append(_cell(o))
            if s == "stateful" or not detail:
                detail = o.detail
                missed += not o.caught
        print("| " + " | ".join([*cells, detail.replace("|", "/")]) + " |", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
