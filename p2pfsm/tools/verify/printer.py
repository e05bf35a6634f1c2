"""Printing explained counterexample steps: text blocks for a reader, plain data for JSON."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from p2pfsm.tools.verify.names import ENVIRONMENT_ACTIONS
from p2pfsm.tools.verify.steps import Step

__all__ = ["LEGEND", "as_json", "render"]


LEGEND = (
    "Each step: the TLA+ action = the (machine, trigger) of models/ it starts, then",
    "  PEER MACHINE INSTANCE: SOURCE -> DEST (TRIGGERS)  a machine instance at a peer that",
    "      changed state (instances: request/round, lookups by their keys; the triggers",
    "      are read off the model)",
    "  sent | delivered | lost | queued FRAME  a frame on the channel SENDER -> RECEIVER",
    "      (job=N: the load job a fetch or abort was sent for, echoed by the reply)",
    "  VAR[PART]: BEFORE -> AFTER  every other change; variables not listed kept their value",
)


def _wrap(text: str, indent: str, width: int) -> list[str]:
    return textwrap.wrap(text, width=max(width, len(indent) + 20), initial_indent=indent,
                         subsequent_indent=indent + "    ", break_long_words=False,
                         break_on_hyphens=False) or [indent]


def _pack(items: Sequence[str], indent: str, width: int) -> list[str]:
    """Items joined by "; " into lines of at most ``width`` (the ";" that ends a line
    included); a long item wraps alone."""
    lines: list[str] = []
    line = ""
    for item in items:
        if line and len(indent) + len(line) + 2 + len(item) + 1 <= width:
            line += "; " + item
            continue
        if line:
            lines.append(indent + line + ";")
        if len(indent) + len(item) + 1 > width:
            lines.extend(_wrap(item, indent, width))
            line = ""
        else:
            line = item
    if line:
        lines.append(indent + line)
    elif lines and lines[-1].endswith(";"):
        lines[-1] = lines[-1][:-1]
    return lines


def _head(step: Step) -> str:
    if step.kind == "initial":
        return "Initial predicate"
    if step.kind == "stutter":
        return "Stuttering: nothing happens any more (the property needs a step that never comes)"
    if step.kind == "back":
        return f"{step.action}: the behaviour repeats from there for ever"
    if step.machine is not None:
        return f"{step.action} = {step.machine} {step.trigger}"
    if step.action in ENVIRONMENT_ACTIONS:
        return f"{step.action} (the environment: no machine starts it)"
    return step.action


def render(steps: Sequence[Step], *, width: int = 100, full: bool = False,
           legend: bool = True) -> str:
    """The explained steps as blocks of lines: nothing is cut, long lines wrap.

    Args:
        full: also list the changes the machine steps and frames already tell
            (``sess``, ``.st``, ``chan``, ``queue``).
    """
    lines: list[str] = [*LEGEND, ""] if legend else []
    for step in steps:
        lines.append(f"{step.index:>3}  {_head(step)}")
        pad = " " * 7
        if step.kind == "initial":
            for ms in step.machine_steps:
                lines.append(f"{pad}{ms.peer} {ms.machine}"
                             + (f" {ms.instance}" if ms.machine != "session" else "")
                             + f": {ms.source}")
            for f in step.frames_sent:
                lines.append(f"{pad}on the wire {f.text()}")
            for f in step.frames_queued:
                lines.append(f"{pad}queued {f.text()}")
            lines.extend(_pack([f"{c.var} = {c.after}" for c in step.parts], pad, width))
            continue
        for ms in step.machine_steps:
            lines.extend(_wrap(ms.text(), pad, width))
        for label, frames in (("delivered", step.frames_delivered), ("lost", step.frames_lost),
                              ("sent", step.frames_sent), ("queued", step.frames_queued)):
            for f in frames:
                lines.extend(_wrap(f"{label} {f.text()}", pad, width))
        for c in (step.parts if full else step.shown):
            lines.extend(_wrap(f"{c.path}: {c.before} -> {c.after}", pad, width))
        if step.kind == "step" and not step.machine_steps:
            lines.append(f"{pad}(no machine changed state)")
        if step.kind == "step" and not step.parts:
            lines.append(f"{pad}(no variable changed)")
    return "\n".join(lines)


def as_json(steps: Sequence[Step]) -> list[dict[str, object]]:
    """The explained steps as plain data (``p2pfsm check --json``)."""
    return [{
        "step": s.index,
        "action": s.action,
        "kind": s.kind,
        "machine": s.machine,
        "trigger": s.trigger,
        "machine_steps": [m.as_json() for m in s.machine_steps],
        "frames_sent": [f.as_json() for f in s.frames_sent],
        "frames_delivered": [f.as_json() for f in s.frames_delivered],
        "frames_lost": [f.as_json() for f in s.frames_lost],
        "frames_queued": [f.as_json() for f in s.frames_queued],
        "changed": {k: [b, a] for k, (b, a) in s.changed.items()},
    } for s in steps]
