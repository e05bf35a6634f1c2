"""A machine object's attributes are written only by its own class (its actions, their
helpers, ``__init__``): never by the session that owns it or any other module.

The classes checked are every class bound to a model (``CompiledMachine(machine(...),
Cls)``); their attributes are their ``__slots__``; the files checked are those of
``p2pfsm/session/``, the only package that holds machine objects (the executor, the
simulator and the tools use the Session's API). Within a class, ``self.x`` is the
class's own attribute. For the session machine (its object is the Session of
session/core.py, which holds the consumer and producer parts and owns every other
instance), the attributes its actions write (``Session.fsm_data``) may be written only
by its actions and the helpers they call. A write is an assignment, an augmented assignment, a
subscript store or delete, or a call of a mutating method (``.pop()``, ``.clear()``...).

Children (every bound class but the session's) never reach their owner at all: no
``self.s`` (or any attribute holding the session), and their modules import nothing of
the session's assembly (machine, owner, parts, dispatch, steps, view, core), not even for
typing. What they produce goes to the step's outbox (session/child.py).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from p2pfsm.fsm import machine
from p2pfsm.session.core import Session

PACKAGE = Path(__file__).resolve().parents[2] / "p2pfsm"
MUTATORS = frozenset({"add", "append", "clear", "discard", "extend", "insert", "pop",
                      "popitem", "remove", "setdefault", "update"})
SESSION_CLASSES = frozenset(c.__name__ for c in Session.__mro__
                            if c.__module__.startswith("p2pfsm.session."))
"""The session's own classes (session/core.py's Session; the parts are objects it holds,
not classes it is made of): ``self`` in any of them is the session."""
SESSION_WRITERS = frozenset(machine("session").action_names
                            | {"__init__", "_die", "send", "withdraw_fetch"})
"""Session methods that may write the session machine's data: its actions, and the
helpers only they use; the output helpers ``send`` and ``withdraw_fetch`` (a retired
queued round's fetch, taken out by client_round's action through the outbox) write
``_queue``."""


@functools.cache
def _parsed(package: Path) -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text()) for p in sorted(package.rglob("*.py"))}


def _trees() -> dict[Path, ast.Module]:
    """The package's modules, parsed once for all the checks here."""
    return _parsed(PACKAGE)


def _machine_classes(trees: dict[Path, ast.Module]) -> dict[str, frozenset[str]]:
    """Class name -> its attribute names, for every class bound to a model."""
    bound = {
        node.args[1].id
        for tree in trees.values() for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "CompiledMachine" and len(node.args) == 2
        and isinstance(node.args[1], ast.Name)
    }
    attrs: dict[str, frozenset[str]] = {}
    for tree in trees.values():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name in bound):
            for stmt in cls.body:
                if (isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets)):
                    names = ast.literal_eval(stmt.value)
                    attrs[cls.name] = frozenset(names)
    return attrs


def _writes(tree: ast.AST) -> list[tuple[ast.expr, str, int]]:
    """(base expression, attribute, line) of every write to ``base.attribute``."""
    found: list[tuple[ast.expr, str, int]] = []

    def target(t: ast.expr, line: int) -> None:
        while isinstance(t, ast.Subscript):
            t = t.value
        if isinstance(t, ast.Attribute):
            found.append((t.value, t.attr, line))
        elif isinstance(t, ast.Tuple | ast.List):
            for e in t.elts:
                target(e, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                target(t, node.lineno)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            target(node.target, node.lineno)
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                if isinstance(t, ast.Subscript):
                    target(t, node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Attribute)):
            found.append((node.func.value.value, node.func.value.attr, node.lineno))
    return found


def _is_self(e: ast.expr) -> bool:
    return isinstance(e, ast.Name) and e.id == "self"


def offenders() -> list[str]:
    trees = _trees()
    classes = _machine_classes(trees)
    # fsm_state has its own test (test_architecture): only the dispatcher writes it.
    child_attrs = frozenset().union(*(v for k, v in classes.items()
                                      if k not in SESSION_CLASSES))
    child_attrs -= {"fsm_state"}
    session_data = frozenset(Session.fsm_data)
    found: list[str] = []
    for path, tree in trees.items():
        rel = str(path.relative_to(PACKAGE))
        if not rel.startswith("session/"):
            continue  # only the session package holds machine objects (others: its API)
        owners: dict[int, tuple[str, str]] = {}  # line -> (class, method)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                for sub in ast.walk(fn):
                    if hasattr(sub, "lineno"):
                        owners[sub.lineno] = (cls.name, fn.name)
        for base, attr, line in _writes(tree):
            cls, method = owners.get(line, ("", ""))
            if attr in child_attrs and not _is_self(base):
                found.append(f"{rel}:{line} writes .{attr} of a machine object")
            elif (attr in session_data and cls in SESSION_CLASSES and _is_self(base)
                  and method not in SESSION_WRITERS):
                found.append(f"{rel}:{line} Session.{method} writes session data .{attr}")
    return found


OWNER_MODULES = frozenset({"machine", "owner", "consumer", "producer", "dispatch", "steps",
                           "view", "core"})
"""Modules of ``p2pfsm.session`` that make up the session (the owner of every child)."""


def child_offenders() -> list[str]:
    """Where a child class reaches its owner (``self.s``, an import of the session)."""
    trees = _trees()
    children = set(_machine_classes(trees)) - SESSION_CLASSES
    found: list[str] = []
    for path, tree in trees.items():
        rel = str(path.relative_to(PACKAGE))
        if not rel.startswith("session/"):
            continue  # the only package that holds machine objects
        classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name in children]
        if not classes:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                parts = node.module.split(".")
                if parts[:2] == ["p2pfsm", "session"] and len(parts) > 2 \
                        and parts[2] in OWNER_MODULES:
                    found.append(f"{rel}:{node.lineno} imports {node.module}")
        for cls in classes:
            for node in ast.walk(cls):
                if isinstance(node, ast.Attribute) and _is_self(node.value) and node.attr == "s":
                    found.append(f"{rel}:{node.lineno} {cls.name} reaches the session (self.s)")
    return found


def test_children_never_reach_the_session() -> None:
    assert child_offenders() == []


def test_the_child_lint_sees_self_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "session").mkdir()
    (tmp_path / "session" / "kid.py").write_text(
        "from p2pfsm.session.core import Session\n"
        "class Kid:\n    __slots__ = ('s',)\n"
        "    def act(self, _ev):\n        self.s.send(1)\n"
        "K = CompiledMachine(machine('kid'), Kid)\n")
    monkeypatch.setitem(globals(), "PACKAGE", tmp_path)
    assert child_offenders() == ["session/kid.py:1 imports p2pfsm.session.core",
                                 "session/kid.py:5 Kid reaches the session (self.s)"]


def test_machine_objects_are_written_only_by_their_own_actions() -> None:
    assert offenders() == []


def test_the_lint_sees_a_write_from_outside() -> None:
    tree = ast.parse("def f(rnd):\n    rnd.supply.pop(b'k')\n    rnd.landed += 1\n")
    assert sorted((a, line) for _b, a, line in _writes(tree)) == [("landed", 3), ("supply", 2)]


def test_the_lint_sees_every_part_of_the_session() -> None:
    """The session is one class (no mixins); its parts are held objects, bound to no
    model, so their tables are theirs to write."""
    assert {"Session"} == SESSION_CLASSES
