"""Architecture rules checked on the source: sans-IO purity, state writes only in fsm/,
and no state name spelled in the code that asks about states (models/ [sets] instead)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import p2pfsm
from p2pfsm.fsm import machines

PACKAGE = Path(p2pfsm.__file__).parent
PURE = ("fsm", "session", "protocol")
FORBIDDEN = {"zmq", "nixl", "nixl_cu12", "torch", "asyncio", "threading", "socket", "time",
             "random", "subprocess", "multiprocessing"}


def _modules(*subpackages: str) -> list[Path]:
    return [p for sub in subpackages for p in sorted((PACKAGE / sub).rglob("*.py"))]


def test_sans_io_packages_import_no_io() -> None:
    offenders = []
    for path in _modules(*PURE):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_machine_state_is_written_only_by_the_dispatcher() -> None:
    """``fsm_state`` is assigned in fsm/compiled.py, or set to a machine's initial state."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "fsm" / "compiled.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "fsm_state":
                    value = getattr(node, "value", None)
                    initial = (isinstance(value, ast.Attribute) and value.attr == "initial")
                    if not initial:
                        offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


STATE_NAMES = frozenset(s for spec in machines().values() for s in spec.states)
STATE_HOLDERS = frozenset({"fsm_state", "state", "dest", "source"})
"""What a state is read from: ``x.fsm_state``, ``x.state``, or a name of these."""
STATE_LITERAL_SCOPE = ("session", "executor", "vllm/session.py", "sim", "spec_calls.py",
                       "tools/verify/replay.py", "tools/verify/traces.py")
"""Code that asks about machine states: it names a model's [sets], never a state."""
STATE_LITERAL_PENDING: frozenset[str] = frozenset()
"""Files still spelling state names (none left)."""


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _holds_state(node: ast.expr) -> bool:
    return ((isinstance(node, ast.Attribute) and node.attr in STATE_HOLDERS)
            or (isinstance(node, ast.Name) and node.id in STATE_HOLDERS))


def state_literals(source: str, where: str) -> list[str]:
    """``where:line`` of each comparison of a machine state with a spelled state name,
    and of each hand-written tuple, list or set holding a state name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if not any(_holds_state(o) for o in operands):
                continue
            names = sorted({s for o in operands for s in _strings(o)} & STATE_NAMES)
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            names = sorted(set(_strings(node)) & STATE_NAMES)
        else:
            continue
        if names:
            found.append(f"{where}:{node.lineno} {names}")
    return sorted(set(found))


def test_session_code_names_state_sets_not_states() -> None:
    """A comparison of a state with a state name, or a hand-written group of state
    names, is a protocol decision outside ``models/``: declare a set in the model's
    ``[sets]`` and ask ``state_set(name)`` (or the model: ``declares``, ``terminal``)."""
    offenders = []
    for scope in STATE_LITERAL_SCOPE:
        root = PACKAGE / scope
        for path in ([root] if root.is_file() else sorted(root.rglob("*.py"))):
            rel = str(path.relative_to(PACKAGE))
            if rel not in STATE_LITERAL_PENDING:
                offenders += state_literals(path.read_text(), rel)
    assert offenders == []


@pytest.mark.parametrize("line", [
    'if s.fsm_state == "ready": pass',
    'x = rnd.state in ("supplied", "supply_closed")',
    'ok = "dead" != session.state',
    'if dest not in ["answered"]: pass',
    'LIVE = frozenset({"connecting", "ready"})',
])
def test_a_spelled_state_fails_the_lint(line: str) -> None:
    assert state_literals(line, "m.py") != []


def test_other_strings_pass_the_lint() -> None:
    assert state_literals('if ev.reason == "closed" or trigger != "settle": pass', "m.py") == []
