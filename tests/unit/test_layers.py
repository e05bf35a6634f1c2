"""The runtime apart from the tools (:mod:`p2pfsm.layers`): every module is on one side,
no runtime module imports a tool at run time, and the host API loads no tool."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from test_import_graph import import_graph, run_time_imports

from p2pfsm.layers import RUNTIME, TOOLS, side_of


def tool_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(runtime module, tool module) for each run-time import across the line."""
    return sorted((module, target) for module, targets in graph.items()
                  if side_of(module) == "runtime"
                  for target in targets if side_of(target) == "tool")


def test_every_module_is_on_exactly_one_side() -> None:
    graph = import_graph()
    assert [module for module in graph if side_of(module) is None] == []
    entries = RUNTIME + TOOLS
    nested = [(a, b) for a in entries for b in entries if b.startswith(a + ".")]
    assert len(set(entries)) == len(entries) and nested == []
    unused = [e for e in entries if not any(m == e or m.startswith(e + ".") for m in graph)]
    assert unused == []  # an entry for a module that is gone


def test_the_tools_are_one_package() -> None:
    graph = import_graph()
    assert "p2pfsm.tools.cli" in graph
    assert {m for m in graph if side_of(m) == "tool"} == {
        m for m in graph if m == "p2pfsm.tools" or m.startswith("p2pfsm.tools.")}


def test_each_module_has_its_side() -> None:
    assert side_of("p2pfsm") == "runtime"
    assert side_of("p2pfsm.vllm") == side_of("p2pfsm.vllm.session") == "runtime"
    assert side_of("p2pfsm.tools.vllm_peer") == side_of("p2pfsm.tools.vllm_peer.server") == "tool"
    assert side_of("p2pfsm.demo_blocks") == "runtime"
    assert side_of("p2pfsm.tools") == side_of("p2pfsm.tools.demo.host") == "tool"
    assert side_of("p2pfsm.unknown") is None
    assert side_of("p2pfsm.simulator") is None  # not under p2pfsm.sim
    assert side_of("p2pfsm.toolset") is None  # not under p2pfsm.tools


def test_a_planted_tool_import_is_found() -> None:
    source = "def later() -> None:\n    from p2pfsm.tools.demo.host import DemoServer\n"
    planted = run_time_imports(ast.parse(source), "p2pfsm.executor.node")
    graph = {"p2pfsm.executor.node": {target.rpartition(".")[0] for target in planted},
             "p2pfsm.tools.verify.check": {"p2pfsm.session"}}
    assert tool_imports(graph) == [("p2pfsm.executor.node", "p2pfsm.tools.demo.host")]


def test_no_runtime_module_imports_a_tool() -> None:
    graph = import_graph()
    assert "p2pfsm.demo_blocks" in graph["p2pfsm.sim.world"]  # it reads imports
    assert tool_imports(graph) == []


HOST_API = """
import json, sys
import p2pfsm, p2pfsm.aio, p2pfsm.executor.node, p2pfsm.vllm
for name in p2pfsm.__all__:
    if name not in ("MetricsCollector", "serve_metrics"):
        getattr(p2pfsm, name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("p2pfsm"))))
"""
"""Imports the host API and loads every name of ``p2pfsm.__all__`` (the two that need
``prometheus_client`` aside); prints the p2pfsm modules loaded."""


def test_the_host_api_loads_no_tool() -> None:
    done = subprocess.run([sys.executable, "-c", HOST_API], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert "p2pfsm.executor.zmq.plane" in loaded  # it saw the node load
    assert [m for m in loaded if side_of(m) != "runtime"] == []
