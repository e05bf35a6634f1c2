"""No import circles in p2pfsm: module A importing B (at the top or inside a function)
while B imports A, over every module of the package. Relative imports are resolved and
``importlib.import_module`` of a constant name counts too; imports under
``if TYPE_CHECKING:`` are for the type checker only and do not count."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import p2pfsm

ROOT = Path(p2pfsm.__file__).parent


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _typing_only(tree: ast.Module) -> set[int]:
    """The nodes under ``if TYPE_CHECKING:``."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(sub) for stmt in node.body for sub in ast.walk(stmt))
    return hidden


def run_time_imports(tree: ast.Module, module: str, package: bool = False,
                     typing: bool = False) -> list[str]:
    """The names ``module``'s run-time imports reach, each absolute (``from .x import y``
    resolved against ``module``, which is a package's ``__init__`` when ``package``):
    ``import a.b``, ``from a import b`` (as ``a.b``) and ``importlib.import_module("a.b")``;
    ``typing``: those under ``if TYPE_CHECKING:`` as well."""
    hidden = set() if typing else _typing_only(tree)
    base = module if package else module.rpartition(".")[0]
    found: list[str] = []
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                parts = base.split(".")
                anchor = ".".join(parts[: len(parts) - (node.level - 1)])
                source = f"{anchor}.{source}" if source else anchor
            found += [f"{source}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif (isinstance(node, ast.Call)
              and ast.unparse(node.func) in ("importlib.import_module", "import_module")
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            found.append(node.args[0].value)
    return found


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    """Module -> the p2pfsm modules it imports at run time (``typing``: or for the type
    checker only)."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for target in run_time_imports(tree, name, path.name == "__init__.py", typing):
            if target.split(".")[0] == "p2pfsm":
                found = owner(target)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_p2pfsm_has_no_import_circle() -> None:
    graph = import_graph()
    assert "p2pfsm.executor.node.peers" in graph["p2pfsm.executor.node.node"]  # it reads imports
    assert cycles(graph) == []


def test_the_engine_core_has_no_circle_even_for_the_type_checker() -> None:
    """protocol, fsm and session: each module's imports, typing-only ones included, form
    no circle (the session's parts and tools see it through protocols, not its class)."""
    core = ("p2pfsm.protocol", "p2pfsm.fsm", "p2pfsm.session")
    graph = {m: {t for t in ts if t.startswith(core)}
             for m, ts in import_graph(typing=True).items() if m.startswith(core)}
    assert "p2pfsm.session.dispatch" in graph["p2pfsm.session.core"]
    assert cycles(graph) == []


def test_relative_and_dynamic_imports_count() -> None:
    source = """
import importlib
from typing import TYPE_CHECKING
from . import sibling
from .. import uncle
from ..aunt import thing
if TYPE_CHECKING:
    from . import typing_only

def later() -> None:
    importlib.import_module("p2pfsm.far.away")
"""
    found = run_time_imports(ast.parse(source), "p2pfsm.pkg.mod")
    assert "p2pfsm.pkg.sibling" in found and "p2pfsm.uncle" in found
    assert "p2pfsm.aunt.thing" in found and "p2pfsm.far.away" in found
    assert not any("typing_only" in name for name in found)
    in_init = run_time_imports(ast.parse("from . import child"), "p2pfsm.pkg", package=True)
    assert in_init == ["p2pfsm.pkg.child"]


def test_every_module_of_the_package_is_in_the_graph() -> None:
    graph = import_graph()
    assert len(graph) == len(list(ROOT.rglob("*.py")))
    assert "p2pfsm.executor.zmq.dealers" in graph["p2pfsm.executor.zmq.plane"]
