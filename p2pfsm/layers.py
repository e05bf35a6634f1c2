"""Which modules of p2pfsm are the runtime an engine imports and which are tools.

The runtime is what a host loads: the machines (:mod:`p2pfsm.fsm`), the wire
(:mod:`p2pfsm.protocol`), the sessions, the node and its planes, the simulated world,
the vLLM drop-in and their helpers. The tools are what people and CI run around it, all
in one package, :mod:`p2pfsm.tools`: the command line, benchmarks, the conformance
tester, trace validation, the demo, the diagrams and the vLLM peer harness. A runtime
module never imports a tool at run time (``tests/unit/test_layers.py`` holds every
module to this table).

Each entry names a module or a package (and everything under it); no entry lies under
another. The package itself (``p2pfsm/__init__.py``, the host API) is runtime.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["RUNTIME", "TOOLS", "side_of"]

RUNTIME: tuple[str, ...] = (
    "p2pfsm.aio",
    "p2pfsm.blocks",
    "p2pfsm.demo_blocks",
    "p2pfsm.errors",
    "p2pfsm.executor",
    "p2pfsm.fsm",
    "p2pfsm.layers",
    "p2pfsm.logwindow",
    "p2pfsm.metrics",
    "p2pfsm.native",
    "p2pfsm.prometheus",
    "p2pfsm.protocol",
    "p2pfsm.session",
    "p2pfsm.sim",
    "p2pfsm.spec_calls",
    "p2pfsm.spec_log",
    "p2pfsm.vllm",
)
"""What an engine imports, and what that imports."""

TOOLS: tuple[str, ...] = ("p2pfsm.tools",)
"""What people and CI run; free to import the runtime."""


def side_of(module: str) -> Literal["runtime", "tool"] | None:
    """``"runtime"`` or ``"tool"`` for a dotted p2pfsm module name, by the entry of
    :data:`RUNTIME` or :data:`TOOLS` naming it or a package above it; None when no entry
    does."""
    def under(entries: tuple[str, ...]) -> bool:
        return any(module == entry or module.startswith(entry + ".") for entry in entries)

    if module == "p2pfsm" or under(RUNTIME):
        return "runtime"
    return "tool" if under(TOOLS) else None
