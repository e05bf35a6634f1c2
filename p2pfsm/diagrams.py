"""State diagrams drawn from ``models/``: mermaid ``stateDiagram-v2`` (always) and SVG
(when graphviz's ``dot`` is installed). Output is deterministic so CI can diff it.

Without ``--out``, ``p2pfsm diagrams`` writes (or checks) ``docs/diagrams`` of the
source checkout, and only when run inside it (:func:`default_out`); anywhere else,
an installed wheel included, ``--out DIR`` is required."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

from p2pfsm.errors import ConfigError
from p2pfsm.fsm.registry import models_directory
from p2pfsm.fsm.spec import MachineSpec

log = logging.getLogger(__name__)


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


def checkout_root() -> Path | None:
    """The source checkout this package runs from (``pyproject.toml`` naming p2pfsm and
    ``models/`` beside the package), or None for an installed wheel."""
    root = Path(__file__).resolve().parent.parent
    project = root / "pyproject.toml"
    try:
        named = 'name = "p2pfsm"' in project.read_text()
    except OSError:
        return None
    return root if named and (root / "models").is_dir() else None


def default_out(cwd: Path | None = None) -> Path:
    """Where ``p2pfsm diagrams`` writes without ``--out``: ``docs/diagrams`` of the
    checkout the package runs from, when ``cwd`` lies inside that checkout.

    Raises:
        ConfigError: not run inside the checkout (an installed wheel has none).
    """
    root = checkout_root()
    here = (cwd or Path.cwd()).resolve()
    if root is not None and here.is_relative_to(root):
        return root / "docs" / "diagrams"
    where = "this installation has no source checkout" if root is None else (
        f"{here} is outside the checkout {root}")
    raise ConfigError(f"--out DIR is required: {where}")


def stale(specs: dict[str, MachineSpec], out: Path) -> list[str]:
    """The diagram files of ``out`` that differ from ``specs``: missing, changed or extra."""
    wanted = render(specs, out)
    log.debug("machines read from %s; checking %s", models_directory(), out)
    changed = [str(p) for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
    extra = sorted(str(p) for p in out.glob("*.mmd") if p not in wanted)
    return changed + extra


def write(specs: dict[str, MachineSpec], out: Path) -> tuple[int, list[Path]]:
    """Write the mermaid files (and SVGs when ``dot`` exists); (mermaid count, SVGs)."""
    wanted = render(specs, out)
    log.debug("machines read from %s", models_directory())
    try:
        out.mkdir(parents=True, exist_ok=True)
        for path, text in wanted.items():
            path.write_text(text)
            log.info("wrote %s", path)
    except OSError as exc:
        raise ConfigError(f"cannot write diagrams to {out}: {exc}") from exc
    return len(wanted), write_svgs(specs, out)
