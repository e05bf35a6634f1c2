"""A walk checked against the TLA+ spec by TLC trace validation (``--validate-spec``).

Our side of the walk is the list of our session's calls (each named as a spec action,
as a node's trace log names them); the target's side is its own trace log, as ``p2pfsm
serve --trace FILE`` writes it. Both are merged by their CLOCK_MONOTONIC stamps into one
trace (:func:`p2pfsm.tools.verify.traces.merge_logs`: ours is peer ``a``, the target's calls
for our identity peer ``b``) and handed to TLC with ``TraceP2P.tla``: the walk passes
when some behaviour of the spec explains every line. The walk must stay inside the
trace bounds (the walk's spec profile: one request, one key, each host input at most
twice, no frame beside our session, no restart).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from p2pfsm.tools.conform.walk_tester import Call
from p2pfsm.tools.verify.traces import merge_logs, validate

__all__ = ["SpecVerdict", "check_walk"]


@dataclass(frozen=True, slots=True)
class SpecVerdict:
    """What TLC said: ``explained`` (every line consumed), a line of detail, and how many
    calls the merged trace has."""

    explained: bool
    detail: str
    lines: int


def _our_log(path: Path, calls: Sequence[Call], me: str, target: str) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for c in calls:
            if c.action is None:
                continue
            fh.write(json.dumps({"t": int(c.at * 1e9), "node": me, "peer": target,
                                 "action": c.action, "steps": sorted(c.steps)}) + "\n")


def check_walk(calls: Sequence[Call], me: str, target: str, target_log: Path, *,
               timeout: float = 300.0) -> SpecVerdict:
    """Merge our calls with the target's log and run TLC once on the trace.

    Raises:
        p2pfsm.tools.verify.tlc.TlcNotFound: java or the TLC jar is missing.
        ValueError: the target's log is not a trace log.
        RuntimeError: TLC failed to run.
    """
    with tempfile.TemporaryDirectory(prefix="p2pfsm-conform-spec-") as tmp:
        ours = Path(tmp) / "tester.jsonl"
        _our_log(ours, calls, me, target)
        trace = merge_logs(ours, target_log)
    if not any(e.peer == "b" for e in trace):
        return SpecVerdict(False, f"the target's log {target_log} has no call for our "
                           f"identity {me}", len(trace))
    result = validate([trace], timeout=timeout)
    if result.complete:
        return SpecVerdict(True, f"TLC explains all {len(trace)} calls (both sides)",
                           len(trace))
    return SpecVerdict(False, "; ".join(result.incomplete([trace])), len(trace))


