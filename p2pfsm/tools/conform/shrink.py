"""Delta debugging of a failing walk: drop steps while the target still breaks the rule.

:func:`shrink` is ddmin over the list of steps: it tries the walk without one chunk of
it (halves first, then quarters, ...) and keeps a shorter list whenever that one still
fails the same rule; then it tries each single step in turn, pass after pass, until no
single step can go (the case is 1-minimal), or until its budget of re-runs or seconds
is spent. Every re-run is a fresh walk against the target, so a
kept candidate is a case that failed on its own. A kept run's steps that were skipped
(what they needed was dropped) go too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Shrunk", "clean", "shrink"]

Steps = list[dict[str, Any]]
_KEEP = frozenset({"do", "rid", "blocks", "slots", "ms", "round", "how", "mode"})


def clean(steps: Steps) -> Steps:
    """The steps as a replay takes them: what each run added (notes, skips) dropped."""
    return [{k: v for k, v in s.items() if k in _KEEP} for s in steps]


@dataclass(frozen=True, slots=True)
class Shrunk:
    """The shortest failing list found, and what it took."""

    steps: Steps
    runs: int
    seconds: float
    exhausted: bool
    """True when the budget ran out before no step could go."""


def shrink(steps: Steps, still_fails: Callable[[Steps], Steps | None], *,
           max_runs: int = 24, time_limit: float = 120.0) -> Shrunk:
    """Shrink ``steps``; ``still_fails(candidate)`` re-runs a candidate and returns the
    steps it ran when it failed the same rule (None when it passed or broke another)."""
    started = time.monotonic()
    current, runs, n = clean(steps), 0, 2

    def spent() -> bool:
        return runs >= max_runs or time.monotonic() - started >= time_limit

    while len(current) > 1 and n < len(current) and not spent():
        chunk = -(-len(current) // n)
        for start in range(0, len(current), chunk):
            if spent():
                break
            runs += 1
            ran = still_fails(current[:start] + current[start + chunk:])
            if ran is not None:
                current = clean([s for s in ran if "skipped" not in s])
                n = max(n - 1, 2)
                break
        else:
            n *= 2
    # Then single steps, one pass after another until none can go (1-minimal).
    progressed = True
    while progressed and current and not spent():
        progressed, i = False, 0
        while i < len(current) and not spent():
            runs += 1
            ran = still_fails(current[:i] + current[i + 1:])
            if ran is not None:
                current = clean([s for s in ran if "skipped" not in s])
                progressed = True
            else:
                i += 1
    return Shrunk(current, runs, time.monotonic() - started, bool(current) and spent())
