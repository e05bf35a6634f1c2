"""Actions declare which of ``fsm_data`` they write (``p2pfsm.fsm.writes``): a step saves
only those for its undo, and ``check_writes`` catches a declaration that is short."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from p2pfsm.errors import ModelError
from p2pfsm.fsm import CompiledMachine, Tracer, check_writes, writes
from p2pfsm.fsm.spec import MachineSpec, parse_spec
from p2pfsm.session.client import CLIENT_LOOKUP, CLIENT_ROUND
from p2pfsm.session.server import SERVER_LOOKUP, SERVER_ROUND


def _spec(actions: list[str]) -> MachineSpec:
    return parse_spec({
        "name": "m", "initial": "a", "terminal": ["b"],
        "states": {"a": "start", "b": "end"},
        "transitions": [{"trigger": "go", "source": "a", "dest": "b", "actions": actions}],
    }, "inline")


class Impl:
    fsm_label = "x"
    fsm_data = ("items", "count", "other")

    def __init__(self, *, explode: bool = False) -> None:
        self.fsm_state = "a"
        self.fsm_tracer = Tracer()
        self.fsm_outputs: list[str] = []
        self.items: dict[str, int] = {"k": 1}
        self.count = 0
        self.other: list[int] = [1]
        self.boom = explode

    @writes("items", "count")
    def write_items(self, _ev: object) -> None:
        self.items["new"] = 2
        self.count += 1

    @writes()
    def emit(self, _ev: object) -> None:
        self.fsm_outputs.append("frame")

    @writes()
    def sneak(self, _ev: object) -> None:
        """Declares nothing but writes ``other``."""
        self.other.append(2)

    def undeclared(self, _ev: object) -> None:
        self.other.append(3)

    @writes()
    def explode(self, _ev: object) -> None:
        if self.boom:
            raise RuntimeError("injected")

    @writes("nothing_of_ours")
    def stray(self, _ev: object) -> None:
        pass


@pytest.fixture
def checking() -> Iterator[None]:
    old = check_writes(True)
    yield
    check_writes(old)


@pytest.fixture
def trusting() -> Iterator[None]:
    old = check_writes(False)
    yield
    check_writes(old)


def _saves(machine: CompiledMachine) -> set[tuple[str, ...] | None]:
    return {c.saves for cands in machine._table.values() for c in cands if c.actions}


def test_a_step_saves_only_what_its_actions_declare() -> None:
    machine = CompiledMachine(_spec(["write_items", "emit"]), Impl)
    assert _saves(machine) == {("items", "count")}
    undeclared = CompiledMachine(_spec(["write_items", "undeclared"]), Impl)
    assert _saves(undeclared) == {None}  # one undeclared action: save all of fsm_data


@pytest.mark.parametrize("actions", [["write_items", "emit", "explode"],
                                     ["write_items", "undeclared", "explode"]])
def test_a_raising_step_is_undone_from_what_it_saved(trusting: None, actions: list[str]) -> None:
    machine = CompiledMachine(_spec(actions), Impl)
    obj = Impl(explode=True)
    with pytest.raises(RuntimeError, match="injected"):
        machine.fire(obj, "go")
    assert (obj.fsm_state, obj.items, obj.count, obj.fsm_outputs) == ("a", {"k": 1}, 0, [])
    assert obj.other == [1]  # saved and put back when an action declares nothing
    assert obj.fsm_tracer.records == []


def test_a_short_declaration_is_caught_and_the_step_undone(checking: None) -> None:
    machine = CompiledMachine(_spec(["write_items", "sneak", "emit"]), Impl)
    obj = Impl()
    with pytest.raises(ModelError, match=r"changed \.other, which none of them declares"):
        machine.fire(obj, "go")
    assert (obj.fsm_state, obj.items, obj.count, obj.other, obj.fsm_outputs) == \
        ("a", {"k": 1}, 0, [1], [])


def test_without_the_check_a_declaration_is_trusted(trusting: None) -> None:
    machine = CompiledMachine(_spec(["write_items", "sneak"]), Impl)
    obj = Impl()
    assert machine.fire(obj, "go") == "b"
    assert obj.other == [1, 2] and obj.items == {"k": 1, "new": 2}


def test_a_declared_name_outside_fsm_data_is_refused_when_the_machine_is_built() -> None:
    with pytest.raises(ModelError, match=r"Impl.stray of m declares it writes \['nothing_of"):
        CompiledMachine(_spec(["stray"]), Impl)


@pytest.mark.parametrize("machine", [SERVER_ROUND, SERVER_LOOKUP, CLIENT_ROUND, CLIENT_LOOKUP],
                         ids=lambda m: m.name)
def test_every_action_of_the_children_declares_its_writes(machine: CompiledMachine) -> None:
    """The per-fetch steps never copy a whole round: each saves what it changes."""
    assert None not in _saves(machine)
