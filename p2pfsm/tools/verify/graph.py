"""The reachable state graph TLC dumps (``-dump dot,actionlabels``), projected onto machines.

TLC 2.15 writes one ``id [label="/\\ var = value\\n..."]`` line per state and one
``src -> dst [label="Action",...]`` line per edge (stuttering self-loops included).
Each state of ``tla/P2P.tla`` carries ``fired``: the set of (machine, trigger,
source, dest) steps the action that produced it took. The projection of the graph
onto a machine is the union of those steps over every edge, so internal
transitions and the several steps of one composite action are all seen.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from p2pfsm.tools.verify.tlc import parse_state

Step = tuple[str, str, str, str]
"""(machine, trigger, source, dest)."""

_NODE = re.compile(r'^(-?\d+) \[label="(.*)"(?:,style = filled)?\];?$')
_EDGE = re.compile(r'^(-?\d+) -> (-?\d+) \[label="([^"]*)"')
_FIRED_VAR = re.compile(r'/\\\\ fired = (\{.*?\})(?:\\n/\\\\ |$)')
_FIRED_STEP = re.compile(
    r'<<\s*\\"(\w+)\\",\s*\\"(\w+)\\",\s*\\"(\w+)\\",\s*\\"(\w+)\\"\s*>>')
"""One step; TLC wraps a long tuple over several lines (``<< "server_round",\\n ...``)."""


def _unescape(label: str) -> str:
    return label.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


@dataclass(slots=True)
class StateGraph:
    """Nodes (id -> raw label), edges (src, dst, action) and each node's fired steps."""

    labels: dict[str, str] = field(default_factory=dict)
    edges: list[tuple[str, str, str]] = field(default_factory=list)
    fired: dict[str, frozenset[Step]] = field(default_factory=dict)
    initial: list[str] = field(default_factory=list)

    def state(self, node: str) -> dict[str, str]:
        """Every variable of a node, as TLA+ text."""
        return parse_state(_unescape(self.labels[node]))

    def actions(self) -> set[str]:
        """Every action label on an edge, stuttering steps excluded."""
        return {a for s, d, a in self.edges if s != d or self.fired.get(d)}

    def steps(self) -> Iterator[tuple[str, str, str, frozenset[Step]]]:
        """(src, dst, action, steps fired) for every edge that changes the state."""
        for src, dst, action in self.edges:
            if src == dst:
                continue  # TLC's dashed stuttering loop
            yield src, dst, action, self.fired.get(dst, frozenset())

    def projection(self) -> dict[str, set[tuple[str, str, str]]]:
        """machine -> {(source, trigger, dest)} taken anywhere in the graph."""
        out: dict[str, set[tuple[str, str, str]]] = {}
        for _src, _dst, _action, steps in self.steps():
            for machine, trigger, source, dest in steps:
                out.setdefault(machine, set()).add((source, trigger, dest))
        return out


def parse_fired(label: str) -> frozenset[Step]:
    """The ``fired`` steps in a raw (escaped) dot label."""
    m = _FIRED_VAR.search(label)
    if m is None:
        return frozenset()
    text = m.group(1).replace("\\n", " ")
    return frozenset((s[0], s[1], s[2], s[3]) for s in _FIRED_STEP.findall(text))


def load_dot(path: Path) -> StateGraph:
    """Parse a dot file written by TLC 2.15 with ``-dump dot,actionlabels``."""
    graph = StateGraph()
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if (m := _EDGE.match(line)) is not None:
                graph.edges.append((m[1], m[2], m[3]))
            elif (m := _NODE.match(line)) is not None:
                graph.labels[m[1]] = m[2]
                graph.fired[m[1]] = parse_fired(m[2])
                if "style = filled" in line:
                    graph.initial.append(m[1])
    return graph
