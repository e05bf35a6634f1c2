"""Spec -> code: every transition the spec takes is replayed against the real sessions.

For each transition declared in models/, the shortest behaviour of the gate's reachable
graph that takes it is replayed step by step against two sans-IO sessions
(p2pfsm.tools.verify.replay): each step must be one Session.handle call of that action
taking exactly the spec's machine steps, leaving the sessions in the spec's state.
Edge coverage (transitions the replays took / transitions declared) is reported.
"""

from __future__ import annotations

import pytest

from p2pfsm.fsm import machines
from p2pfsm.session import Session, TimerId
from p2pfsm.tools.verify.graph import StateGraph, Step
from p2pfsm.tools.verify.replay import PathIndex, ReplayResult, describe, replay, replay_all
from p2pfsm.tools.verify.unreachable import excluded

DECLARED: list[Step] = sorted(
    (name, trigger, source, dest)
    for name, spec in machines().items()
    for source, trigger, dest in spec.edges()
)


def _reachable(step: Step) -> bool:
    return (step[2], step[1], step[3]) not in excluded(step[0])


@pytest.fixture(scope="module")
def paths(gate_graph: StateGraph) -> PathIndex:
    return PathIndex.build(gate_graph)


@pytest.fixture(scope="module")
def profile_replays(
    paths: PathIndex, profile_graphs: dict[str, StateGraph],
) -> dict[str, dict[Step, ReplayResult]]:
    """Per profile, a replay (sessions of that profile) of every step its gate takes;
    for native also of every declared reachable transition no other gate takes."""
    out: dict[str, dict[Step, ReplayResult]] = {}
    taken: set[Step] = set()
    for profile, graph in sorted(profile_graphs.items(), key=lambda kv: kv[0] != "native"):
        index = paths if profile == "native" else PathIndex.build(graph)
        out[profile] = replay_all(index, sorted(index.witness), profile=profile)
        taken |= set(index.witness)
    missing = {s for s in DECLARED if _reachable(s)} - taken
    out["native"].update(replay_all(paths, sorted(missing)))  # each fails: never taken
    return out


@pytest.fixture(scope="module")
def replays(profile_replays: dict[str, dict[Step, ReplayResult]]) -> dict[Step, ReplayResult]:
    """A replay per declared reachable transition and per step a gate takes (native's
    where it takes it, else the first profile's that does)."""
    merged: dict[Step, ReplayResult] = {}
    for profile in sorted(profile_replays, key=lambda p: p != "native"):
        for step, result in profile_replays[profile].items():
            merged.setdefault(step, result)
    return merged


@pytest.mark.parametrize("step", DECLARED, ids=lambda s: f"{s[0]}:{s[2]}-{s[1]}->{s[3]}")
def test_transition_replays_against_the_sessions(
    step: Step, replays: dict[Step, ReplayResult],
) -> None:
    if not _reachable(step):
        pytest.skip(excluded(step[0])[(step[2], step[1], step[3])])
    result = replays[step]
    assert result.ok, result.failure
    assert step in result.taken


def test_every_step_the_spec_takes_replays(
    profile_replays: dict[str, dict[Step, ReplayResult]],
) -> None:
    """Every profile's gate, with sessions of that profile; also the steps models/ does
    not declare (test_models_vs_spec names those)."""
    failed = {(profile, step): r.failure for profile, replays in profile_replays.items()
              for step, r in replays.items() if not r.ok}
    assert not failed, failed


def test_edge_coverage(
    replays: dict[Step, ReplayResult], conformance_report: list[str],
) -> None:
    taken = {s for r in replays.values() for s in r.taken} & set(DECLARED)
    reachable = [s for s in DECLARED if _reachable(s)]
    inputs = sum(len(r.inputs) for r in replays.values())
    conformance_report.append(
        f"edge coverage: {len(taken)}/{len(DECLARED)} declared transitions replayed "
        f"against the sessions ({100 * len(taken) // len(reachable)}% of the "
        f"{len(reachable)} reachable ones; {len(DECLARED) - len(reachable)} declared but "
        f"not reached by the gate, see p2pfsm/tools/verify/unreachable.py); "
        f"{len(replays)} generated paths, "
        f"{inputs} inputs")
    assert taken == set(reachable)


def test_a_step_the_code_does_not_take_is_reported(
    gate_graph: StateGraph, paths: PathIndex,
) -> None:
    path = paths.path_to(
        ("client_round", "recv_transfer_done", "loading", "done"))
    last_action, last_node = path.steps[-1]
    tampered = StateGraph(gate_graph.labels, gate_graph.edges, dict(gate_graph.fired),
                          gate_graph.initial)
    tampered.fired[last_node] = frozenset(
        s for s in gate_graph.fired[last_node] if s[0] != "client_round")
    result = replay(tampered, path)
    assert not result.ok
    assert f"step {len(path.steps)}/{len(path.steps)} {last_action}" in result.failure


def test_a_code_mutation_fails_the_replay(
    gate_graph: StateGraph, paths: PathIndex, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A producer that never arms its demand timer cannot follow the spec."""
    step = ("server_round", "timer_demand", "serving", "draining_failed")
    path = paths.path_to(step)
    assert replay(gate_graph, path).ok
    arm = Session.arm

    def arm_all_but_demand(self: Session, timer: TimerId, delay: float, *,
                           keep: bool = False) -> None:
        if timer[0] != "demand":
            arm(self, timer, delay, keep=keep)

    monkeypatch.setattr(Session, "arm", arm_all_but_demand)
    result = replay(gate_graph, path)
    assert not result.ok, describe(path)
    assert "ServerRoundTimerDemand" in result.failure
