"""Deadline polls, for readings that have nothing to wait on (``/proc`` of another
process, a condition a peer process makes true): one bounded loop for every suite.

At the deadline the caller chooses: ``"raise"`` (an AssertionError naming what was
awaited and the last reading) or ``"last"`` (the last reading, for the caller to judge
and report).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")

AtDeadline = Literal["raise", "last"]


def poll_until(read: Callable[[], T], done: Callable[[T], bool], timeout: float, what: str,
               *, interval: float = 0.05, at_deadline: AtDeadline = "raise") -> T:
    """Call ``read()`` every ``interval`` s until ``done(reading)``, at most ``timeout`` s;
    the reading that was done, or at the deadline the last one (``at_deadline="last"``)
    or an AssertionError naming ``what`` (``"raise"``)."""
    deadline = time.monotonic() + timeout
    while True:
        reading = read()
        if done(reading):
            return reading
        if time.monotonic() >= deadline:
            if at_deadline == "last":
                return reading
            last = "" if isinstance(reading, bool) else f" (last reading: {reading!r})"
            raise AssertionError(f"{what}: not within {timeout:.0f} s{last}")
        time.sleep(interval)  # nothing to wait on; bounded by the deadline above


def wait_for(cond: Callable[[], bool], timeout: float, what: str,
             interval: float = 0.05) -> None:
    """Poll ``cond`` until true; AssertionError naming ``what`` after ``timeout`` s."""
    poll_until(cond, bool, timeout, what, interval=interval)
