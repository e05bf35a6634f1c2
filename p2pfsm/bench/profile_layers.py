"""Where a side's profiled time goes, by layer: one row per room of the code.

:func:`by_layer` sums a :class:`cProfile.Profile`'s own time per layer (the executor's
rooms, the session, the state machines, decode/encode, validation, the host, ZeroMQ,
NIXL). A builtin (``len``, ``isinstance``, a C method) counts for the layer of the
function that called it, split by what each caller spent in it (cProfile records that);
a C method of ZeroMQ, NIXL or msgpack counts for that library.
"""

from __future__ import annotations

import cProfile
import pstats
from typing import Any

__all__ = ["by_layer", "layer_of"]

# First match wins: (path fragment, layer).
_PATHS: tuple[tuple[str, str], ...] = (
    ("/p2pfsm/executor/runtime/driver.py", "executor: driver"),
    ("/p2pfsm/executor/session_timers.py", "executor: timers"),
    ("/p2pfsm/executor/node/effects.py", "executor: effects"),
    ("/p2pfsm/executor/node/writes.py", "executor: effects"),
    ("/p2pfsm/executor/runtime/effects.py", "executor: effects"),
    ("/p2pfsm/executor/node/jobs.py", "executor: effects"),
    ("/p2pfsm/executor/zmq/plane.py", "executor: control plane"),
    ("/p2pfsm/executor/zmq/intake.py", "executor: control plane"),
    ("/p2pfsm/executor/zmq/dealers.py", "executor: control plane"),
    ("/p2pfsm/executor/zmq/events.py", "executor: control plane"),
    ("/p2pfsm/executor/zmq/waker.py", "executor: control plane"),
    ("/p2pfsm/executor/nixl", "executor: data plane"),
    ("/p2pfsm/executor/nixl/layout.py", "executor: data plane"),
    ("/p2pfsm/executor/", "executor: node loop"),
    ("/p2pfsm/protocol/validate", "protocol: validate"),
    ("/p2pfsm/protocol/", "protocol: decode/encode"),
    ("/p2pfsm/fsm/", "fsm: machines"),
    ("/p2pfsm/session/", "session"),
    ("/p2pfsm/demo/", "host (demo server)"),
    ("/p2pfsm/bench/", "bench harness"),
    ("/p2pfsm/", "other p2pfsm"),
    ("/zmq/", "zmq"),
    ("/nixl", "nixl (python)"),
    ("/concurrent/futures/", "futures (threading)"),
    ("/threading.py", "futures (threading)"),
    ("/msgpack/", "protocol: decode/encode"),
)
# C methods (no path) of these libraries count for them.
_C_NAMES: tuple[tuple[str, str], ...] = (
    ("nixl", "nixl (C)"), ("zmq", "zmq"), ("msgpack", "protocol: decode/encode"),
)

Func = tuple[str, int, str]


def layer_of(func: Func) -> str | None:
    """The layer of a profiled function; None for a builtin of no library (its
    callers' layers take it)."""
    path, _line, name = func
    if path == "~":
        low = name.lower()
        return next((layer for frag, layer in _C_NAMES if frag in low), None)
    layer = next((layer for frag, layer in _PATHS if frag in path), None)
    return layer or "other: " + path.rsplit("/", 1)[-1]


def by_layer(prof: cProfile.Profile) -> dict[str, float]:
    """Own seconds per layer (builtins attributed to their callers' layers)."""
    stats: dict[Func, Any] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for func, (_cc, _nc, tt, _ct, callers) in stats.items():
        layer = layer_of(func)
        if layer is not None:
            out[layer] = out.get(layer, 0.0) + tt
            continue
        spent = {caller: row[2] for caller, row in callers.items()}
        total = sum(spent.values())
        if total <= 0:
            out["builtins (no caller)"] = out.get("builtins (no caller)", 0.0) + tt
            continue
        for caller, t in spent.items():
            where = layer_of(caller) or "builtins (no caller)"
            out[where] = out.get(where, 0.0) + tt * t / total
    return out
