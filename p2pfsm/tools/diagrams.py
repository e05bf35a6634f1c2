"""Diagrams drawn from ``models/``: per machine a mermaid ``stateDiagram-v2`` (always)
and SVG (when graphviz's ``dot`` is installed), an overview of which inputs drive which
machine, and ``docs/machines.md``, which embeds them with one sequence diagram per flow
recorded from the simulated world (:mod:`p2pfsm.tools.diagram_flows`); in a checkout also
``tla/MachineTables.tla`` and the fact lists of ``docs/explanation/architecture.md``
(:mod:`p2pfsm.tools.doc_facts`). Output is deterministic so CI can diff it.

Without ``--out``, ``p2pfsm diagrams`` writes (or checks) ``docs/diagrams`` of the
source checkout, and only when run inside it (:func:`default_out`); anywhere else,
an installed wheel included, ``--out DIR`` is required."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

from p2pfsm.errors import ConfigError
from p2pfsm.fsm.inputs import InputTable
from p2pfsm.fsm.registry import input_table, models_directory
from p2pfsm.fsm.spec import MachineSpec, TransitionSpec

log = logging.getLogger(__name__)


def _label(trigger: str, guards: tuple[str, ...], unless: tuple[str, ...]) -> str:
    conds = [*guards, *(f"not {u}" for u in unless)]
    return f"{trigger} [{', '.join(conds)}]" if conds else trigger


_SHOWN_ACTIONS = ("send_", "report_", "write_", "start_")
"""Actions drawn on an edge: those that send a frame, report a result to the host or
start work on the data plane (the rest arm timers and keep books)."""


def _text(doc: str) -> str:
    """A description mermaid reads as plain text (no ``:`` or ``;``)."""
    return doc.replace(":", " -").replace(";", ",")


def _edge_label(t: TransitionSpec) -> str:
    shown = [a for a in t.actions if a.startswith(_SHOWN_ACTIONS)]
    label = _label(t.trigger, t.guards, t.unless)
    return f"{label} / {', '.join(shown)}" if shown else label


def to_mermaid(spec: MachineSpec) -> str:
    """The machine as a mermaid state diagram without label piles: one arrow per
    (source, dest) carrying every transition between them, one line each with the
    actions that send a frame or report a result; transitions that stay in their state
    are grouped in a note on that state."""
    lines = [f"%% {spec.name}: {spec.doc} (generated from models/{spec.name}.toml)",
             "stateDiagram-v2"]
    for state, doc in spec.states.items():
        lines.append(f"    {state} : {state}: {_text(doc)}")
    lines.append(f"    [*] --> {spec.initial}")
    arrows: dict[tuple[str, str], list[str]] = {}
    stays: dict[str, list[str]] = {}
    for t in spec.transitions:
        for source in t.sources:
            dest = t.dest_from(source)
            if dest == source:
                stays.setdefault(source, []).append(_edge_label(t))
            else:
                arrows.setdefault((source, dest), []).append(_edge_label(t))
    for (source, dest), labels in arrows.items():
        lines.append(f"    {source} --> {dest} : {'<br/>'.join(dict.fromkeys(labels))}")
    lines.extend(f"    {s} --> [*]" for s in sorted(spec.terminal))
    for state, labels in stays.items():
        lines.append(f"    note right of {state}")
        lines.append("        stays on: " + "<br/>".join(dict.fromkeys(labels)))
        lines.append("    end note")
    return "\n".join(lines) + "\n"


FOLD_AT_LEAST = 3
"""A transition shared by this many states or more is drawn once, from their group."""


def _moves(spec: MachineSpec) -> dict[tuple[str, str], list[str]]:
    """(dest, edge label) -> the states that move there by that transition, in order."""
    moves: dict[tuple[str, str], list[str]] = {}
    for t in spec.transitions:
        for source in t.sources:
            dest = t.dest_from(source)
            if dest != source:
                moves.setdefault((dest, _edge_label(t)), []).append(source)
    return moves


def fold_group(spec: MachineSpec) -> tuple[str, frozenset[str]] | None:
    """The states whose shared transitions the folded diagram draws once, and its name.

    Candidates are the model's declared sets and every set of states that take one
    transition together; the one chosen saves the most arrows (each transition that
    :data:`FOLD_AT_LEAST` or more of its states share, to a state outside it, becomes
    one arrow per destination). It is named after the declared set when it is one.
    None when nothing is saved.
    """
    moves = _moves(spec)
    candidates = [*spec.sets.values(), *(frozenset(s) for s in moves.values())]
    best: tuple[int, frozenset[str]] | None = None
    for group in dict.fromkeys(c for c in candidates if len(c) >= FOLD_AT_LEAST):
        removed, dests = 0, set()
        for (dest, _), sources in moves.items():
            shared = [x for x in sources if x in group]
            if dest not in group and len(shared) >= FOLD_AT_LEAST:
                removed += len(shared)
                dests.add(dest)
        saved = removed - len(dests)
        if saved > 0 and (best is None or saved > best[0]):
            best = (saved, group)
    if best is None:
        return None
    group = best[1]
    name = next((n for n, members in spec.sets.items() if members == group), "shared")
    return name, group


def _which(group_order: list[str], sources: list[str]) -> str:
    """``sources`` of the group, said the short way: all, all but some, or only some."""
    rest = [s for s in group_order if s not in sources]
    if not rest:
        return ""
    if len(rest) < len(sources):
        return f" (not from {', '.join(rest)})"
    return f" (from {', '.join(sources)})"


def to_mermaid_folded(spec: MachineSpec) -> str | None:
    """The machine with the transitions several states share drawn once: the states of
    :func:`fold_group` inside one composite state, and one arrow from it per destination
    carrying each shared transition (with the states it leaves out, if any). States are
    shown by name only and transitions that stay in their state are left out; the full
    diagram (:func:`to_mermaid`) has every edge and every state's description. None
    when the machine has nothing to fold."""
    found = fold_group(spec)
    if found is None:
        return None
    name, group = found
    order = [s for s in spec.states if s in group]
    folded: dict[str, list[str]] = {}
    inner: dict[tuple[str, str], list[str]] = {}
    outer: dict[tuple[str, str], list[str]] = {}
    for (dest, label), sources in _moves(spec).items():
        shared = [s for s in sources if s in group]
        if dest not in group and len(shared) >= FOLD_AT_LEAST:
            folded.setdefault(dest, []).append(label + _which(order, shared))
            sources = [s for s in sources if s not in group]
        for source in sources:
            into = inner if source in group and dest in group else outer
            into.setdefault((source, dest), []).append(label)
    box = f"fold_{name}"
    lines = [f"%% {spec.name}, folded: the transitions {FOLD_AT_LEAST} or more states share "
             f"drawn once (generated from models/{spec.name}.toml; every transition: "
             f"{spec.name}.mmd)", "stateDiagram-v2",
             f'    state "{name if name in spec.sets else "any of these"}" as {box} {{']
    lines.extend(f"        {s}" for s in order)
    for (source, dest), labels in inner.items():
        lines.append(f"        {source} --> {dest} : {'<br/>'.join(dict.fromkeys(labels))}")
    lines.append("    }")
    lines.append(f"    [*] --> {spec.initial}")
    for dest, labels in folded.items():
        lines.append(f"    {box} --> {dest} : {'<br/>'.join(dict.fromkeys(labels))}")
    for (source, dest), labels in outer.items():
        lines.append(f"    {source} --> {dest} : {'<br/>'.join(dict.fromkeys(labels))}")
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


def render(specs: dict[str, MachineSpec], out: Path, page: Path | None = None) -> dict[Path, str]:
    """The generated files, by path: one ``.mmd`` per machine (and ``NAME.folded.mmd``
    where :func:`to_mermaid_folded` folds shared transitions) and ``overview.mmd`` under
    ``out``, the page of :func:`machines_page` (``page``, default ``out/machines.md``)
    and, when that page is the checkout's ``docs/machines.md``, the checkout's
    ``tla/MachineTables.tla`` (:mod:`p2pfsm.tools.verify.tables`) and its architecture page
    with the fact lists filled in (:mod:`p2pfsm.tools.doc_facts`)."""
    files = {out / f"{name}.mmd": to_mermaid(spec) for name, spec in specs.items()}
    for name, spec in specs.items():
        folded = to_mermaid_folded(spec)
        if folded is not None:
            files[out / f"{name}.folded.mmd"] = folded
    files[out / "overview.mmd"] = to_overview(specs)
    files[page or out / "machines.md"] = machines_page(specs)
    root = checkout_root()
    if root is not None and page == root / "docs" / "machines.md":
        from p2pfsm.tools.verify import tables  # the checkout's tla/ gets its generated module

        files[tables.path(root / "tla")] = tables.to_tla(specs)
        files.update(_architecture(specs, root))
    return files


def _architecture(specs: dict[str, MachineSpec], root: Path) -> dict[Path, str]:
    """The checkout's architecture page with its fact lists generated
    (:mod:`p2pfsm.tools.doc_facts`)."""
    from p2pfsm.tools import doc_facts

    path = doc_facts.page_path(root)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    return {path: doc_facts.fill(text, specs, str(path))}


def page_path(out: Path) -> Path:
    """``docs/machines.md`` beside ``docs/diagrams``; ``DIR/machines.md`` elsewhere."""
    root = checkout_root()
    if root is not None and out.resolve() == (root / "docs" / "diagrams").resolve():
        return root / "docs" / "machines.md"
    return out / "machines.md"


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
    root = Path(__file__).resolve().parents[2]
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
    wanted = render(specs, out, page_path(out))
    log.debug("machines read from %s; checking %s", models_directory(), out)
    changed = [str(p) for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
    extra = sorted(str(p) for p in out.glob("*.mmd") if p not in wanted)
    return changed + extra


def write(specs: dict[str, MachineSpec], out: Path) -> tuple[int, list[Path]]:
    """Write the mermaid files (and SVGs when ``dot`` exists); (mermaid count, SVGs)."""
    wanted = render(specs, out, page_path(out))
    log.debug("machines read from %s", models_directory())
    try:
        out.mkdir(parents=True, exist_ok=True)
        for path, text in wanted.items():
            path.write_text(text)
            log.info("wrote %s", path)
    except OSError as exc:
        raise ConfigError(f"cannot write diagrams to {out}: {exc}") from exc
    return len(wanted), write_svgs(specs, out)


_ROLES = (("client_", "consumer role"), ("server_", "producer role"))


def to_overview(specs: dict[str, MachineSpec], table: InputTable | None = None) -> str:
    """How the machines compose, drawn from ``models/``: the session machine gates every
    frame; the consumer's and producer's machines (named ``client_*`` and ``server_*``)
    live inside it. The arrows into a machine are the rows of the input table
    (``models/inputs.toml``, default :func:`~p2pfsm.fsm.input_table`): from the peer the
    frames it receives, from the host its calls (a call reaching several machines is on
    each arrow), from the data plane and transport their results, dotted from the timers
    the timers it owns; an arrow to the peer names the actions that send frames
    (``send_*``)."""
    table = input_table() if table is None else table
    lines = ["%% overview: which inputs drive which machine "
             "(generated from models/inputs.toml and models/*.toml)",
             "flowchart LR",
             "    host([host])", "    plane([data plane and transport])",
             "    peer([peer session])", "    timers([timers])"]
    inside = {name for name in specs if not name.startswith(tuple(p for p, _ in _ROLES))}
    lines.append("    subgraph sess [one session per peer]")
    lines.extend(f"        {name}[{name}]" for name in sorted(inside))
    for prefix, role in _ROLES:
        members = sorted(n for n in specs if n.startswith(prefix))
        if members:
            lines.append(f"        subgraph {prefix.rstrip('_')} [{role}: one per request, "
                         "round or lookup]")
            lines.extend(f"            {name}[{name}]" for name in members)
            lines.append("        end")
    lines.append("    end")
    arrows = {"frame": "peer --", "host": "host --", "result": "plane --",
              "transport": "plane --", "timer": "timers -."}
    for name, spec in specs.items():
        into: dict[str, list[str]] = {}
        for row in table.inputs:
            if row.machine == name or name in dict(row.fanout):
                into.setdefault(arrows[row.kind], []).append(row.name)
        for source, names in sorted(into.items()):
            tip = ".->" if source.endswith(".") else "-->"
            lines.append(f"    {source} \"{', '.join(sorted(set(names)))}\" {tip} {name}")
        sent = sorted({a for t in spec.transitions for a in t.actions
                       if a.startswith("send_")})
        if sent:
            lines.append(f"    {name} -- \"{', '.join(sent)}\" --> peer")
    return "\n".join(lines) + "\n"


def _fence(text: str) -> str:
    return "```mermaid\n" + text + "```\n"


def machines_page(specs: dict[str, MachineSpec]) -> str:
    """``docs/machines.md``: the overview, one sequence diagram per flow (recorded from
    the simulated world) and every machine, in mermaid fences a forge renders."""
    from p2pfsm.tools import diagram_flows

    parts = ["# Machines and flows\n",
             "Generated by `p2pfsm diagrams` from `models/*.toml` and from runs of the "
             "simulated world (`p2pfsm/tools/diagram_flows.py`); `p2pfsm diagrams --check` (CI) "
             "fails when this page is stale. Do not edit by hand.\n",
             "## Overview\n",
             "Which frames, host calls, results and timers drive which machine (the rows "
             "of `models/inputs.toml`, from which the session's dispatch is built), and "
             "which frames each sends. The session machine gates every frame "
             "(`recv_request`, `recv_response`) before the machine of its request, round "
             "or lookup takes it.\n", _fence(to_overview(specs)),
             "## Flows\n",
             "Each flow is a script of host calls on `p2pfsm.sim.SimWorld`, frames "
             "delivered in order; notes are the machine steps each `Session.handle` call "
             "took, dashed arrows what the session reported to its host and executor.\n"]
    for name, (what, _script) in diagram_flows.FLOWS.items():
        events = diagram_flows.record(name)
        parts += [f"### {name}\n", f"{what}\n", _fence(diagram_flows.to_sequence(name, events))]
    parts += ["## Machines\n",
              "One arrow per pair of states, one line per transition on it: "
              "`trigger [guards] / actions that send a frame or report a result`; "
              "transitions that stay in their state are listed in a note. Where "
              f"{FOLD_AT_LEAST} or more states share a transition (the session's "
              "`host_close`, `transport_lost`, `recv_disconnect`, ...), the machine is "
              "drawn twice: first folded, those states in one box and each shared "
              "transition one arrow from it, then in full, every edge drawn.\n"]
    for name, spec in specs.items():
        parts += [f"### {name}\n", f"{spec.doc} (`models/{name}.toml`)\n"]
        folded = to_mermaid_folded(spec)
        if folded is not None:
            parts += [f"Folded (`{name}.folded.mmd`):\n", _fence(folded),
                      f"Every transition (`{name}.mmd`):\n"]
        parts.append(_fence(to_mermaid(spec)))
    return "\n".join(parts)
