"""State diagrams drawn from ``models/``: mermaid ``stateDiagram-v2`` (always) and SVG
(when graphviz's ``dot`` is installed). Output is deterministic so CI can diff it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from p2pfsm.fsm.spec import MachineSpec


def _label(trigger: str, guards: tuple[str, ...], unless: tuple[str, ...]) -> str:
    conds = [*guards, *(f"not {u}" for u in unless)]
    return f"{trigger} [{', '.join(conds)}]" if conds else trigger


def to_mermaid(spec: MachineSpec) -> str:
    """The machine as a mermaid state diagram (internal transitions drawn as self-loops)."""
    lines = [f"%% {spec.name}: {spec.doc} (generated from models/{spec.name}.toml)",
             "stateDiagram-v2"]
    for state, doc in spec.states.items():
        lines.append(f"    {state} : {state}: {doc.replace(':', ' -')}")
    lines.append(f"    [*] --> {spec.initial}")
    for t in spec.transitions:
        for source in t.sources:
            lines.append(f"    {source} --> {t.dest_from(source)} : "
                         f"{_label(t.trigger, t.guards, t.unless)}")
    lines.extend(f"    {s} --> [*]" for s in sorted(spec.terminal))
    return "\n".join(lines) + "\n"


def to_dot(spec: MachineSpec) -> str:
    """The machine as graphviz DOT text."""
    lines = [f'digraph "{spec.name}" {{', "  rankdir=LR;", '  node [shape=box, style=rounded];',
             '  "__start" [shape=point];', f'  "__start" -> "{spec.initial}";']
    for state in spec.states:
        shape = ", peripheries=2" if state in spec.terminal else ""
        lines.append(f'  "{state}" [label="{state}"{shape}];')
    for t in spec.transitions:
        for source in t.sources:
            lines.append(f'  "{source}" -> "{t.dest_from(source)}" '
                         f'[label="{_label(t.trigger, t.guards, t.unless)}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(specs: dict[str, MachineSpec], out: Path) -> dict[Path, str]:
    """The mermaid files to write under ``out``, by path."""
    return {out / f"{name}.mmd": to_mermaid(spec) for name, spec in specs.items()}


def write_svgs(specs: dict[str, MachineSpec], out: Path) -> list[Path]:
    """Render SVGs with ``dot`` when it is installed; returns the files written."""
    dot = shutil.which("dot")
    if dot is None:
        return []
    written = []
    for name, spec in specs.items():
        path = out / f"{name}.svg"
        svg = subprocess.run([dot, "-Tsvg"], input=to_dot(spec).encode(), check=True,
                             capture_output=True, timeout=60).stdout
        path.write_bytes(svg)
        written.append(path)
    return written
