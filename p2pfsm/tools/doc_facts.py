"""The fact lists of ``docs/explanation/architecture.md``, generated between marker comments.

The page is prose written by hand; where it lists facts (the runtime and the tools, the
machines and their states, the session's inputs and outputs) the list sits between
``<!-- facts:NAME ... -->`` and ``<!-- /facts:NAME -->`` and is rendered here from
``models/``, :mod:`p2pfsm.layers` and the session's ``Input`` and ``Output`` unions.
``p2pfsm diagrams`` rewrites the lists and ``p2pfsm diagrams --check`` fails when one
is stale (:func:`p2pfsm.tools.diagrams.render`); the prose around them is left as it is.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Mapping
from pathlib import Path

from p2pfsm.errors import ConfigError
from p2pfsm.fsm import InputTable, MachineSpec, input_table
from p2pfsm.layers import RUNTIME, TOOLS
from p2pfsm.session import inputs, outputs

__all__ = ["BLOCKS", "fill", "page_path"]

_KINDS = (("host", "from the host"), ("frame", "from the peer"), ("timer", "from the timers"),
          ("result", "from the data plane and executor"),
          ("transport", "from the connection"))
"""The input table's kinds, in the order the page lists them, with their headings."""


def page_path(root: Path) -> Path:
    """The architecture page of the checkout at ``root``."""
    return root / "docs" / "explanation" / "architecture.md"


def _names(entries: tuple[str, ...]) -> str:
    return ", ".join(f"`{e.removeprefix('p2pfsm.')}`" for e in entries)


def layers_block(specs: Mapping[str, MachineSpec]) -> str:
    """Which modules are the runtime and which the tools (:mod:`p2pfsm.layers`)."""
    return (f"- runtime: `p2pfsm` (the host API), {_names(RUNTIME)}\n"
            f"- tools: {_names(TOOLS)}\n")


def _in_a_role(machine: str) -> bool:
    """A machine of the consumer's or producer's role (``client_*``, ``server_*``)."""
    return machine.startswith(("client_", "server_"))


def machines_block(specs: Mapping[str, MachineSpec]) -> str:
    """One row per machine (the session first): its doc, its states (initial first),
    terminal states and named sets."""
    rows = ["| machine | what | states | terminal | named sets |", "|---|---|---|---|---|"]
    for name, spec in sorted(specs.items(), key=lambda item: (_in_a_role(item[0]), item[0])):
        states = [spec.initial] + [s for s in spec.states if s != spec.initial]
        sets = "; ".join(f"`{n}` ({', '.join(s for s in states if s in members)})"
                         for n, members in spec.sets.items())
        rows.append(f"| `{name}` | {spec.doc} | {', '.join(states)} | "
                    f"{', '.join(sorted(spec.terminal))} | {sets or '-'} |")
    return "\n".join(rows) + "\n"


def inputs_block(specs: Mapping[str, MachineSpec], table: InputTable | None = None) -> str:
    """The session's inputs (``p2pfsm.session.Input``) by the kind the input table gives
    each; an input no row names is listed under ``other``."""
    table = input_table() if table is None else table
    kind_of = {row.event: row.kind for row in table.inputs}
    by_kind: dict[str, list[str]] = {}
    for cls in typing.get_args(inputs.Input):
        by_kind.setdefault(kind_of.get(cls.__name__, "other"), []).append(cls.__name__)
    headings = dict(_KINDS)
    order = [*headings, "other"]
    parts = [f"{headings.get(kind, kind)}: " + ", ".join(f"`{n}`" for n in names)
             for kind, names in sorted(by_kind.items(), key=lambda item: order.index(item[0]))]
    return "Inputs " + "; ".join(parts) + ".\n"


def outputs_block(specs: Mapping[str, MachineSpec]) -> str:
    """The session's outputs (``p2pfsm.session.Output``), in the union's order."""
    names = [cls.__name__ for cls in typing.get_args(outputs.Output)]
    return "Outputs: " + ", ".join(f"`{n}`" for n in names) + ".\n"


BLOCKS: dict[str, tuple[str, Callable[[Mapping[str, MachineSpec]], str]]] = {
    "layers": ("p2pfsm/layers.py", layers_block),
    "machines": ("models/*.toml", machines_block),
    "inputs": ("p2pfsm/session/inputs.py and models/inputs.toml", inputs_block),
    "outputs": ("p2pfsm/session/outputs.py", outputs_block),
}
"""Each list: where it is generated from, and how."""


def fill(text: str, specs: Mapping[str, MachineSpec], where: str = "the page") -> str:
    """``text`` with every list of :data:`BLOCKS` rendered between its markers.

    Raises:
        ConfigError: a list's markers are missing, or there twice.
    """
    for name, (source, render) in BLOCKS.items():
        pattern = re.compile(rf"<!-- facts:{name}\b.*?-->\n.*?<!-- /facts:{name} -->", re.S)
        found = list(pattern.finditer(text))
        if len(found) != 1:
            raise ConfigError(f"{where}: expected one '<!-- facts:{name} ... -->' ... "
                              f"'<!-- /facts:{name} -->' pair, found {len(found)}")
        block = (f"<!-- facts:{name} (generated from {source} by `p2pfsm diagrams`; "
                 f"do not edit) -->\n{render(specs)}<!-- /facts:{name} -->")
        text = text[:found[0].start()] + block + text[found[0].end():]
    return text
