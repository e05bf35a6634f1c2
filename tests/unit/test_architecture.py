"""Architecture rules checked on the source: sans-IO purity and state writes only in fsm/."""

from __future__ import annotations

import ast
from pathlib import Path

import p2pfsm

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
