"""Rate-limited logging: at most a burst of lines of one kind per window, the rest counted.

A hostile or broken peer can make the same line fire thousands of times a second; one
:class:`LogWindow` per kind of line keeps the log readable and says how many lines it
left out when the window closes. :func:`clip` bounds what a line quotes from a peer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["QUOTE_LIMIT", "LogWindow", "clip"]

QUOTE_LIMIT = 300
"""Characters of a peer's text (a reason, a field) that one log line quotes at most."""


def clip(text: object, limit: int = QUOTE_LIMIT) -> str:
    """``str(text)``, cut to ``limit`` characters with how many were left out: a log
    line quotes a peer's input only this far (a layout of thousands of regions would
    otherwise make one line of kilobytes)."""
    out = str(text)
    if len(out) <= limit:
        return out
    return f"{out[:limit]}... ({len(out) - limit} more characters)"


@dataclass(slots=True)
class LogWindow:
    """At most ``burst`` lines per ``window_s`` seconds; the others are counted and
    reported in one line when the next window opens."""

    burst: int = 5
    window_s: float = 10.0
    window_start: float = float("-inf")
    logged: int = 0
    suppressed: int = 0

    def emit(self, write: Callable[..., None], kind: str, msg: str, *args: object,
             now: float | None = None, **kwargs: Any) -> bool:
        """``write(msg, *args, **kwargs)`` unless past the burst; first, when a window
        closes, ``write`` says how many lines of ``kind`` it left out. ``now``: seconds of
        a monotonic clock (default ``time.monotonic()``). True when the line was written."""
        if now is None:
            now = time.monotonic()
        if now - self.window_start >= self.window_s:
            if self.suppressed:
                write("%d more %s not logged", self.suppressed, kind)
            self.window_start, self.logged, self.suppressed = now, 0, 0
        if self.logged < self.burst:
            self.logged += 1
            write(msg, *args, **kwargs)
            return True
        self.suppressed += 1
        return False
