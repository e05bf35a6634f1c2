"""The models load, compile, and agree with the ``transitions`` library on every edge."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from transitions import MachineError

from p2pfsm.errors import InvalidTransition, ModelError
from p2pfsm.fsm import CompiledMachine, MachineSpec, Tracer, check_writes, load_spec, machines
from p2pfsm.fsm.build import build_transitions_machine
from p2pfsm.fsm.inputs import load_inputs
from p2pfsm.fsm.registry import input_table, models_directory
from p2pfsm.fsm.spec import parse_spec
from p2pfsm.session.client import CLIENT_LOOKUP, CLIENT_ROUND, ClientLookup, ClientRound
from p2pfsm.session.core import SESSION, Session
from p2pfsm.session.server import SERVER_LOOKUP, SERVER_ROUND, ServerLookup, ServerRound

BOUND = {m.name: m for m in (SESSION, CLIENT_ROUND, CLIENT_LOOKUP, SERVER_ROUND, SERVER_LOOKUP)}


def test_every_model_file_is_bound_to_an_implementation() -> None:
    assert set(machines()) == set(BOUND)


def test_reading_the_models_again_gives_what_the_import_compiled() -> None:
    """The machines, the input table and the compiled tables are built once, at import;
    built again now from the same files they are equal (a slip in the loader or the
    compiler, which the suites would only meet at import, shows here)."""
    directory = models_directory()
    specs = {name: load_spec(name, directory) for name in machines()}
    assert specs == machines()
    assert load_inputs(directory, specs) == input_table()
    impls = {"session": Session, "client_round": ClientRound,
             "client_lookup": ClientLookup, "server_round": ServerRound,
             "server_lookup": ServerLookup}
    for name, bound in BOUND.items():
        again = CompiledMachine(specs[name], impls[name], bound.then)
        assert (again.name, again.spec, again.then) == (bound.name, bound.spec, bound.then)
        assert again._table == bound._table, name
        assert again.code == bound.code, name  # the generated code too, text for text


class _Stub:
    """A model for both dispatchers whose guards return values set per test case."""

    fsm_label = "stub"
    fsm_tracer = None

    def __init__(self, state: str, guard_values: dict[str, bool]) -> None:
        self.fsm_state = state
        self.values = guard_values
        self.ran: list[str] = []


def _stub_class(spec: MachineSpec) -> type:
    """A class with every guard (reading ``values``) and every action of ``spec`` (each
    records its name in ``ran``)."""
    namespace: dict[str, object] = {}
    for g in spec.guard_names:
        namespace[g] = lambda self, _ev=None, g=g: self.values[g]
    for a in spec.action_names:
        namespace[a] = lambda self, _ev=None, a=a: self.ran.append(a)
    return type(f"Stub_{spec.name}", (_Stub,), namespace)


def _guard_cases(spec: MachineSpec, state: str, trigger: str) -> list[dict[str, bool]]:
    names = sorted({g for t in spec.transitions if trigger == t.trigger and state in t.sources
                    for g in (*t.guards, *t.unless)})
    return [dict(zip(names, values, strict=True))
            for values in itertools.product((False, True), repeat=len(names))]


@pytest.fixture(params=["generated", "generated, checking writes", "table"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Which dispatcher fires: the generated code (fast or verifying) or the table."""
    old = check_writes(request.param != "generated")
    yield request.param
    check_writes(old)


@pytest.mark.parametrize("name", sorted(BOUND))
def test_compiled_table_agrees_with_transitions(name: str, path: str) -> None:
    """For every state, trigger and guard valuation each dispatcher (the generated code,
    its verifying variant, and the table it is generated from) reaches the same state as
    ``transitions``, runs the same actions in the same order, and says beforehand
    whether a step is enabled."""
    spec = machines()[name]
    stub_cls = _stub_class(spec)
    compiled = CompiledMachine(spec, stub_cls)
    fire = compiled.fire_by_table if path == "table" else compiled.fire
    compared = 0
    for state in spec.states:
        for trigger in sorted(spec.triggers):
            for values in _guard_cases(spec, state, trigger):
                ours = stub_cls(state, values)
                enabled = compiled.can_fire(ours, trigger)
                try:
                    expected: str | None = fire(ours, trigger)
                except InvalidTransition:
                    expected = None
                theirs = stub_cls(state, values)
                build_transitions_machine(spec, theirs, actions=True)
                theirs.fsm_state = state
                try:
                    fired = theirs.trigger(trigger)
                except MachineError:
                    fired = False
                got = theirs.fsm_state if fired else None
                assert got == expected, (name, state, trigger, values)
                assert enabled == (got is not None), (name, state, trigger, values)
                assert theirs.ran == ours.ran, (name, state, trigger, values)
                compared += 1
    assert compared >= len(spec.states) * len(spec.triggers)


class _Raising(_Stub):
    """A stub whose actions raise after recording; an output list and a datum to undo."""

    fsm_data = ("datum",)
    fsm_tracer: Tracer  # type: ignore[assignment]  # an instance's, not the stub's None

    def __init__(self, state: str, guard_values: dict[str, bool]) -> None:
        super().__init__(state, guard_values)
        self.fsm_outputs: list[str] = ["before"]
        self.datum: dict[str, int] = {"k": 1}
        self.fsm_tracer = Tracer()
        self.last = ""  # the action that raises


@pytest.mark.parametrize("name", sorted(BOUND))
def test_every_generated_edge_is_undone_when_its_last_action_raises(name: str,
                                                                     path: str) -> None:
    """On every edge with actions, each dispatcher leaves state, data, outputs and trace
    as they were when the last action raises."""
    spec = machines()[name]
    namespace: dict[str, object] = {}
    for g in spec.guard_names:
        namespace[g] = lambda self, _ev=None, g=g: self.values[g]
    for a in spec.action_names:
        namespace[a] = lambda self, _ev=None, a=a: _act(self, a)
    cls = type(f"Raising_{spec.name}", (_Raising,), namespace)
    compiled = CompiledMachine(spec, cls)
    undone = 0
    for t in spec.transitions:
        if not t.actions:
            continue
        for state in t.sources:
            values = {g: g in t.guards for g in (*t.guards, *t.unless)}
            for other in spec.transitions:  # earlier candidates of this step: disabled
                for g in (*other.guards, *other.unless):
                    values.setdefault(g, False)
            obj = cls(state, values)
            obj.last = t.actions[-1]
            if not compiled.can_fire(obj, t.trigger):
                continue
            fire = compiled.fire_by_table if path == "table" else compiled.fire
            with pytest.raises(RuntimeError, match="last action"):
                fire(obj, t.trigger)
            assert (obj.fsm_state, obj.datum, obj.fsm_outputs) == (state, {"k": 1}, ["before"])
            assert obj.fsm_tracer.records == []
            undone += 1
    assert undone or not any(t.actions for t in spec.transitions)


def _act(obj: _Raising, action: str) -> None:
    obj.ran.append(action)
    obj.datum[action] = 1
    obj.fsm_outputs.append(action)
    if action == obj.last:
        raise RuntimeError("last action")


def test_guards_of_one_trigger_never_overlap() -> None:
    """Deterministic machines: at most one candidate is enabled for any guard valuation."""
    for name, spec in machines().items():
        for state in spec.states:
            for trigger in spec.triggers:
                cands = [t for t in spec.transitions if t.trigger == trigger and state in t.sources]
                for values in _guard_cases(spec, state, trigger):
                    enabled = [t for t in cands if all(values[g] for g in t.guards)
                               and not any(values[g] for g in t.unless)]
                    assert len(enabled) <= 1, (name, state, trigger, values)


def test_every_state_and_doc_is_declared() -> None:
    for spec in machines().values():
        assert spec.doc
        assert all(doc for doc in spec.states.values())
        assert all(t.doc for t in spec.transitions), spec.name


def _write(tmp: Path, text: str) -> Path:
    (tmp / "m.toml").write_text(text)
    return tmp


GOOD = """
name = "m"
initial = "a"
terminal = ["b"]
[states]
a = "start"
b = "end"
[[transitions]]
trigger = "go"
source = "a"
dest = "b"
actions = ["act"]
"""


def test_load_and_fire(tmp_path: Path) -> None:
    spec = load_spec("m", _write(tmp_path, GOOD))

    class Impl:
        fsm_label = "x"
        fsm_tracer: Tracer | None = Tracer()

        def __init__(self) -> None:
            self.fsm_state = "a"
            self.acted = 0

        def act(self, _ev: object) -> None:
            self.acted += 1

    machine = CompiledMachine(spec, Impl)
    obj = Impl()
    assert machine.fire(obj, "go") == "b"
    assert obj.acted == 1
    assert obj.fsm_tracer is not None
    assert [(r.trigger, r.source, r.dest) for r in obj.fsm_tracer.records] == [("go", "a", "b")]
    with pytest.raises(InvalidTransition) as err:
        machine.fire(obj, "go")
    assert "state=b trigger=go" in str(err.value)
    assert obj.fsm_state == "b" and obj.acted == 1


def test_unknown_action_is_a_load_error(tmp_path: Path) -> None:
    spec = load_spec("m", _write(tmp_path, GOOD))
    with pytest.raises(ModelError, match="act"):
        CompiledMachine(spec, object)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (('dest = "b"', 'dest = "zz"'), "dest"),
        (('initial = "a"', 'initial = "q"'), "initial"),
        (('source = "a"', 'source = "b"'), "terminal"),
        (('trigger = "go"', 'trigger = "go"\nbogus = 1'), "unknown keys"),
        (('b = "end"', 'b = "end"\nc = "island"'), "unreachable"),
        (('trigger = "go"', 'trigger = "go"\nunless = 3'),
         r"^m.toml: transitions\[0\]: unless: expected a name or a list of names, got 3$"),
    ],
)
def test_malformed_models_are_rejected(tmp_path: Path, patch: tuple[str, str],
                                       message: str) -> None:
    with pytest.raises(ModelError, match=message):
        load_spec("m", _write(tmp_path, GOOD.replace(*patch)))


def test_a_terminal_state_may_answer_a_call_but_is_never_left(tmp_path: Path) -> None:
    """An internal transition (no dest) from a terminal state is allowed; any other
    transition from one, a self-loop that names its dest included, is not."""
    internal = GOOD + '[[transitions]]\ntrigger = "late"\nsource = "b"\nactions = ["act"]\n'
    spec = load_spec("m", _write(tmp_path, internal))
    assert [t.dest for t in spec.transitions if t.trigger == "late"] == [None]
    with pytest.raises(ModelError, match="terminal"):
        load_spec("m", _write(tmp_path, internal.replace('source = "b"\n',
                                                         'source = "b"\ndest = "b"\n')))


def test_parse_requires_name() -> None:
    with pytest.raises(ModelError, match="name"):
        parse_spec({"states": {"a": "x"}, "initial": "a"}, "inline")


SETS = GOOD.replace("[[transitions]]", '[sets]\nstarted = ["b"]\n\n[[transitions]]', 1)


def test_named_state_sets_load_and_unknown_ones_are_errors(tmp_path: Path) -> None:
    spec = load_spec("m", _write(tmp_path, SETS))
    assert spec.state_set("started") == frozenset({"b"})
    with pytest.raises(ModelError, match="declares no state set 'begun'"):
        spec.state_set("begun")


@pytest.mark.parametrize(("patch", "message"), [
    (('started = ["b"]', 'started = ["b", "z"]'), "sets.started: unknown states ['z']"),
    (('started = ["b"]', 'started = []'), "sets.started: expected a non-empty list"),
    (('started = ["b"]', 'started = "b"'), "sets.started: expected a non-empty list"),
    (('started = ["b"]', 'a = ["b"]'), "sets.a: a set cannot share the name of a state"),
    (('[sets]\nstarted = ["b"]', '[sets.started]\nb = 1'), "expected a non-empty list"),
])
def test_malformed_state_sets_are_rejected(tmp_path: Path, patch: tuple[str, str],
                                           message: str) -> None:
    assert patch[0] in SETS
    with pytest.raises(ModelError, match=re.escape(message)):
        load_spec("m", _write(tmp_path, SETS.replace(*patch)))


def test_sets_must_be_a_table(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="'sets' must map set names"):
        load_spec("m", _write(tmp_path, GOOD.replace('name = "m"', 'sets = 1\nname = "m"')))


@pytest.mark.parametrize("name", sorted(BOUND))
def test_the_bound_machine_answers_its_models_sets(name: str) -> None:
    spec = machines()[name]
    assert spec.sets, f"{name} declares no [sets]"
    for set_name, states in spec.sets.items():
        assert BOUND[name].state_set(set_name) == states <= spec.states.keys()


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelError) as err:
        load_spec("nope", tmp_path)
    assert str(err.value) == f"no model file {tmp_path / 'nope.toml'}"
    with pytest.raises(ModelError) as err:
        load_inputs(tmp_path, machines())
    assert str(err.value) == f"no input table {tmp_path / 'inputs.toml'}"
