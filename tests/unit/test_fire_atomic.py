"""A step is all-or-nothing: an action that raises leaves state, data and outputs as before."""

from __future__ import annotations

import pytest

from p2pfsm.errors import InvalidTransition
from p2pfsm.fsm import CompiledMachine, Tracer, check_writes
from p2pfsm.fsm.spec import parse_spec
from p2pfsm.protocol import Fetch
from p2pfsm.session import HostStart, Session, SessionConfig
from p2pfsm.session.child import ChildEnv
from p2pfsm.session.server import SERVER_ROUND, ServerRound

SPEC = parse_spec({
    "name": "m", "initial": "a", "terminal": ["b"],
    "states": {"a": "start", "b": "end"},
    "transitions": [{"trigger": "go", "source": "a", "dest": "b",
                     "actions": ["write_data", "emit", "explode"]}],
}, "inline")


class Impl:
    fsm_label = "x"
    fsm_data = ("items", "count")

    def __init__(self, *, explode: bool) -> None:
        self.fsm_state = "a"
        self.fsm_tracer = Tracer()
        self.fsm_outputs: list[str] = ["before"]
        self.items: dict[str, int] = {"k": 1}
        self.count = 0
        self.boom = explode

    def write_data(self, _ev: object) -> None:
        self.items["new"] = 2
        del self.items["k"]
        self.count += 1

    def emit(self, _ev: object) -> None:
        self.fsm_outputs.append("frame")

    def explode(self, _ev: object) -> None:
        if self.boom:
            raise RuntimeError("injected")


def test_a_raising_action_changes_nothing() -> None:
    machine = CompiledMachine(SPEC, Impl)
    obj = Impl(explode=True)
    items = obj.items
    with pytest.raises(RuntimeError, match="injected"):
        machine.fire(obj, "go")
    assert obj.fsm_state == "a"
    assert obj.items == {"k": 1} and obj.items is items and obj.count == 0
    assert obj.fsm_outputs == ["before"]
    assert obj.fsm_tracer.records == []


def test_the_same_step_commits_when_no_action_raises() -> None:
    machine = CompiledMachine(SPEC, Impl)
    obj = Impl(explode=False)
    assert machine.fire(obj, "go") == "b"
    assert obj.items == {"new": 2} and obj.count == 1
    assert obj.fsm_outputs == ["before", "frame"]
    assert [(r.source, r.dest) for r in obj.fsm_tracer.records] == [("a", "b")]
    with pytest.raises(InvalidTransition):
        machine.fire(obj, "go")
    assert obj.fsm_outputs == ["before", "frame"]


@pytest.mark.parametrize("checking", [True, False])
def test_a_raising_action_of_a_real_round_leaves_it_unchanged(checking: bool) -> None:
    """A serve round whose last action of recv_fetch fails midway: its demand, supply,
    state, the session's outputs of the step and its timers (the demand timer)
    are as before the fetch was fired (the generated code, verifying writes or not)."""
    s = Session(SessionConfig("b", b"meta-b", 0x1000, 8, 64))
    s.handle(HostStart(), 0.0)
    env = ChildEnv(s.config.timeouts, None)  # the round's outbox, as the session gives one
    rnd = ServerRound(env, 1, "r1", 0)
    rnd.fsm_state = "supplied"  # as host_supply leaves it
    rnd.supply = {b"k1": 3}
    before = list(s.outputs)
    timers = dict(s.view.timers)
    last = next(t for t in SERVER_ROUND.spec.transitions
                if t.trigger == "recv_fetch" and "supplied" in t.sources).actions[-1]

    def failing_write(self: ServerRound, _ev: object) -> None:
        self.supply.pop(b"k1")
        raise RuntimeError("injected")

    failing = CompiledMachine(SERVER_ROUND.spec, type("Failing", (ServerRound,),
                                                      {last: failing_write}),
                              SERVER_ROUND.then)
    old = check_writes(checking)
    try:
        with pytest.raises(RuntimeError, match="injected"):
            failing.fire(rnd, "recv_fetch", Fetch("r1", (b"k1",), (5,), 0))
    finally:
        check_writes(old)
    assert rnd.fsm_state == "supplied"
    assert rnd.supply == {b"k1": 3} and rnd.demand == {} and rnd.total == 0
    assert s.outputs == before and env.outbox == [] and dict(s.view.timers) == timers
