"""Shared bits of ``p2pfsm bench`` output: suites, fetch shapes, one loop's summary line."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from typing import Any

from p2pfsm.errors import ConfigError

__all__ = ["SUITES", "Progress", "format_loop", "parse_shape", "quantiles"]

Progress = Callable[[str], None]
"""Called with a line of progress now and then (e.g. to print it on stderr)."""

SUITES = ("fsm", "transfer")
"""What ``--suite all`` runs (``sweep`` is chosen by name: it takes minutes)."""

_UNITS = {"": 1, "B": 1, "KiB": 1024, "MiB": 1024 * 1024}
_SHAPE = re.compile(r"^([1-9][0-9]{0,5})x([1-9][0-9]{0,9})(B|KiB|MiB)?$")


def parse_shape(text: str) -> tuple[int, int]:
    """``"256x64KiB"`` -> (256, 65536); a ConfigError for anything else."""
    m = _SHAPE.match(text.strip())
    if m is None:
        raise ConfigError(f"fetch shape: expected BLOCKSxSIZE such as 256x64KiB, got {text!r}")
    return int(m.group(1)), int(m.group(2)) * _UNITS[m.group(3) or ""]


def format_loop(label: str, got: dict[str, Any]) -> str:
    """One line: median and p10/p90 of a fetch loop's times, its failures."""
    times = sorted(got["times"])
    head = f"{label}: {len(times)} fetches, {got['failures']} failed, " \
           f"{got['verify_failures']} verify failures"
    if not times:
        return head
    cuts = statistics.quantiles(times, n=10, method="inclusive") if len(times) > 1 else times * 9
    return (f"{head}; median {statistics.median(times) * 1e3:.3f} ms "
            f"(p10 {cuts[0] * 1e3:.3f}, p90 {cuts[-1] * 1e3:.3f})")


def quantiles(samples: list[float], scale: float = 1e3) -> dict[str, float]:
    """Median, p10, p90 and p99 (inclusive method) of ``samples``, times ``scale``."""
    ordered = sorted(samples)
    if len(ordered) < 2:
        value = ordered[0] * scale if ordered else float("nan")
        return {"median": value, "p10": value, "p90": value, "p99": value,
                "n": float(len(ordered))}
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return {"median": statistics.median(ordered) * scale, "p10": cuts[9] * scale,
            "p90": cuts[89] * scale, "p99": cuts[98] * scale, "n": float(len(ordered))}
