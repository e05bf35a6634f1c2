"""A failing walk as a counterexample in the models' terms, and its replay file.

:func:`render` prints the case the way ``p2pfsm check`` prints a counterexample:
numbered steps, each the walk's action, then every call of our session it caused (the
input, the session state before and after, each machine step it fired as
``tester MACHINE INSTANCE: SOURCE -> DEST (TRIGGER)``, the frames it sent), and at the
end the rule broken and what came. :func:`write_replay` and :func:`read_replay` keep the
steps as JSON, for ``p2pfsm conform --replay FILE``.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2pfsm.errors import ConfigError
from p2pfsm.tools.conform.walk_run import MISSING, WalkFailure
from p2pfsm.tools.conform.walk_tester import Call

__all__ = ["LEGEND", "describe_step", "read_replay", "render", "render_case", "write_replay"]

LEGEND = (
    "Each step: the walk's action, then every call of our session during it:",
    "  INPUT  [session BEFORE -> AFTER]  what our session was handed (a host call, a frame",
    "      of the target, a timer)",
    "  tester MACHINE INSTANCE: SOURCE -> DEST (TRIGGER)  a machine step it fired (models/)",
    "  sent FRAME  a frame our session sent",
)
_WIDTH = 100


def _blocks(blocks: Sequence[int]) -> str:
    return "[" + ", ".join("missing" if b == MISSING else str(b) for b in blocks) + "]"


def describe_step(step: dict[str, Any]) -> str:
    """One step in words."""
    do = step.get("do")
    if do == "fetch":
        text = (f"fetch {step['rid']}: demo blocks {_blocks(step['blocks'])} into our "
                f"blocks {step['slots']}")
    elif do == "lookup":
        text = f"lookup {step['rid']}: demo blocks {_blocks(step['blocks'])}"
    elif do == "finish":
        text = f"finish {step['rid']}"
    elif do == "dup-ack":
        text = "a second connect_ack (beside our session)"
    elif do == "stale-abort":
        text = (f"abort_fetch {step['rid']} round {step.get('round', 0)} (beside our "
                "session: its round ended or is racing its end)")
    elif do == "unknown-type":
        text = "a frame of an unknown type"
    elif do == "consumer":
        text = (f"launch the consumer: mode {step.get('mode', 'pd')}, demo blocks "
                f"{_blocks(step.get('blocks', []))}, one fetch per serve step")
    elif do == "serve":
        how = step.get("how", "supply")
        text = {"supply": "serve its next fetch: WRITEs, then transfer_done(true)",
                "decline": "serve its next fetch: transfer_done(false) (declined)",
                "hold": f"serve its next fetch: hold our blocks back {step.get('ms', 0)} "
                        "ms, then WRITEs and transfer_done(true)"}.get(str(how), f"serve {how}")
    elif do == "lookups":
        text = ("answer its lookups split: two lookup_resp frames" if step.get("how") ==
                "split" else "answer its lookups whole: one lookup_resp frame")
    elif do == "wait":
        text = f"wait {step.get('ms', 0)} ms"
    elif do == "delay":
        text = f"fault: hold our sends {step.get('ms', 0)} ms (keep reading)"
    elif do == "reorder":
        text = f"fault: no NIXL progress {step.get('ms', 0)} ms (keep reading frames)"
    elif do == "pause":
        text = f"fault: paused {step.get('ms', 0)} ms (no reading, no progress, no timers)"
    elif do == "restart":
        text = ("fault: we die (no disconnect) and come back on the same host:port, a new "
                "NIXL agent and incarnation")
    else:
        text = f"{do}"
    if step.get("note"):
        text += f" ({step['note']})"
    if step.get("skipped"):
        text += f" -- skipped: {step['skipped']}"
    return text


def _call_lines(call: Call, pad: str) -> list[str]:
    lines = _wrap(f"{call.input}  [session {call.before} -> {call.after}]", pad)
    for r in call.records:
        who = f"tester {r.machine}" + (f" {r.instance}" if r.machine != "session" else "")
        lines += _wrap(f"{who}: {r.source} -> {r.dest} ({r.trigger})", pad + "  ")
    for frame in call.sent:
        lines += _wrap(f"sent {frame}", pad + "  ")
    return lines


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, width=_WIDTH, initial_indent=indent,
                         subsequent_indent=indent + "    ", break_long_words=False,
                         break_on_hyphens=False) or [indent]


def render(steps: Sequence[dict[str, Any]], calls: Sequence[Call],
           failure: WalkFailure | None, *, legend: bool = True,
           first: str = "handshake (our connect; the target's connect and connect_ack)",
           last: str = "end of the walk: finish every open request, wait for every "
                       "load's result") -> str:
    """The walk as numbered steps (0: ``first``, the handshake; the last: ``last``, the
    end of the walk)."""
    lines: list[str] = [*LEGEND, ""] if legend else []
    by_step: dict[int, list[Call]] = {}
    for c in calls:
        by_step.setdefault(c.step, []).append(c)
    heads = [first, *(describe_step(s) for s in steps), last]
    end = len(heads) - 1
    for i, head in enumerate(heads):
        if i == end and i not in by_step:
            continue
        lines += _wrap(f"{i:>3}  {head}", "")
        for call in by_step.get(i, []):
            lines += _call_lines(call, " " * 7)
    if failure is not None:
        lines.append("")
        lines += _wrap(f"broken ({failure.rule}): {failure.expected}", "")
        lines += _wrap(f"got: {failure.got}", "")
    return "\n".join(lines)


def render_case(case_id: str, calls: Sequence[Call]) -> str:
    """A directed case's calls of our session (every tester's, in time order), in the
    walk's counterexample style; the case's own steps are its code, not a list."""
    if not calls:
        return ""
    lines = ["Every call of our session, in time order:", *LEGEND[1:],
             "", f"  0  case {case_id}: every call of our session(s), in time order"]
    for call in calls:
        lines += _call_lines(call, " " * 7)
    return "\n".join(lines)


def write_replay(path: Path, target: str, rule: str, steps: Sequence[dict[str, Any]],
                 **extra: object) -> None:
    """The case as JSON: ``{"target", "rule", "steps": [...], ...}``."""
    head = json.dumps({"target": target, "rule": rule, **extra})
    body = ",\n".join(f"  {json.dumps(s)}" for s in steps)
    path.write_text(f'{head[:-1]}, "steps": [\n{body}\n]}}\n')


def read_replay(path: Path) -> list[dict[str, Any]]:
    """The steps of a replay file (the object :func:`write_replay` writes, or a bare list).

    Raises:
        ConfigError: the file is missing or not a list of steps.
    """
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--replay: cannot read {path}: {exc}") from None
    steps = doc.get("steps") if isinstance(doc, dict) else doc
    if not isinstance(steps, list) or not all(
            isinstance(s, dict) and isinstance(s.get("do"), str) for s in steps):
        raise ConfigError(f"--replay: {path} is not a list of steps ({{\"do\": ...}})")
    return steps
