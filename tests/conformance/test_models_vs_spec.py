"""models/ <-> tla/P2P.tla: the reachable graph of the gate config, projected onto each
machine, takes exactly the transitions the model files declare.

TLC dumps the gate config's reachable graph (``-dump dot,actionlabels``); every state
records in ``fired`` the (machine, trigger, source, dest) steps of the action that made
it, so internal transitions and the several steps of one composite action are all
seen. Adding or removing one transition in models/ without changing the spec makes
``test_projection_equals_model`` fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pfsm.fsm import machines, profiles
from p2pfsm.tools.verify import configs, names, tables, tlc
from p2pfsm.tools.verify.graph import StateGraph
from p2pfsm.tools.verify.unreachable import BEYOND_GATE, KNOWN_UNREACHABLE, excluded

from .conftest import PROFILE_GATES
from .verdicts import assert_passed

Edge = tuple[str, str, str]

TRIGGERS_WITHOUT_ACTION: frozenset[tuple[str, str]] = frozenset({
    ("session", "recv_request"),        # the gate every request frame fires first
    ("session", "recv_response"),       # the gate every response frame fires first
    ("client_round", "session_lost"),   # every session death or close
    ("client_round", "session_lost_unsent"),
    ("client_lookup", "session_lost"),
    ("client_lookup", "session_lost_unsent"),
    ("server_round", "session_lost"),
    ("server_lookup", "request_closed"),
    ("client_lookup", "host_finish"),   # ClientRoundHostFinish: the host's finish call
    ("server_round", "host_finish"),
    ("server_round", "lookup_pin"),     # ServerLookupHostAnswer pins the hits
    ("server_round", "settle"),         # after every event touching a round
    ("server_lookup", "settle"),        # after every event touching a lookup
    ("session", "recv_unknown_abort"),  # ServerRoundRecvAbortFetch: no round to abort
    ("session", "recv_expired_fetch"),  # ServerRoundRecvFetch: the lookup pins expired
    ("session", "finish_lookup_round"), # ClientRoundHostFinish: a lookup round unfetched
    ("session", "host_fetch_over"),     # ClientRoundHostFetch on a session that is over
    ("session", "host_lookup_over"),    # ClientLookupHostLookup on a session that is over
    ("session", "host_supply_over"),    # ServerRoundHostSupply on a session that is over
    ("session", "abort_ack_expired"),   # ClientRoundTimerAbortAck under a profile that ends
                                        # the session on a missing abort_ack
    ("session", "lookup_expired"),      # ClientLookupTimerLookup under a profile that ends
                                        # the session on an overdue lookup answer
    ("client_lookup", "request_fetched"),  # ClientRoundHostFetch under such a profile
    ("client_round", "handed_off"),     # the flush (SessionRecvConnectAck, ...) under a
                                        # profile that retires unsent fetches
})
"""Triggers fired only as part of another action (one Session.handle call)."""


@pytest.fixture(scope="module")
def projection(profile_graphs: dict[str, StateGraph]) -> dict[str, set[Edge]]:
    """The union over the profiles' gates: each profile takes its own transitions."""
    out: dict[str, set[Edge]] = {}
    for graph in profile_graphs.values():
        for name, edges in graph.projection().items():
            out.setdefault(name, set()).update(edges)
    return out


@pytest.mark.parametrize("profile", sorted(PROFILE_GATES))
def test_gate_config_passes(profile: str, profile_gate_runs: dict[str, tlc.TlcResult],
                            conformance_report: list[str]) -> None:
    run = profile_gate_runs[profile]
    assert run.errors == ()
    assert run.violated is None, f"{run.violated}: {run.counterexample}"
    assert run.ok
    assert run.distinct_states and run.distinct_states > 1000
    assert run.left_on_queue == 0
    conformance_report.append(f"gate of profile {profile}: {run.distinct_states:,} states, "
                              f"{run.seconds:.1f} s")


def test_profiles_the_spec_reads() -> None:
    """MachineTables' ProfileBehaviour (what P2P.tla reads of Profile) is generated from
    models/profiles/; every profile has a gate, and vllm-0.33's reads as native's but for
    lookupEnds (whose steps vllm-0.34's gate reaches too: its own gate is three scenarios)."""
    behaviour = {name: tables.behaviour_of(prof) for name, prof in profiles().items()}
    assert set(PROFILE_GATES) == set(behaviour)
    assert behaviour["vllm-0.33"][:3] == behaviour["native"][:3]
    assert (behaviour["vllm-0.33"][3], behaviour["native"][3]) == (True, False)
    assert len(set(behaviour.values())) == len(behaviour)  # no two gates check one thing


@pytest.mark.parametrize("name", sorted(machines()))
def test_projection_equals_model(name: str, projection: dict[str, set[Edge]]) -> None:
    declared = machines()[name].edges()
    known = set(excluded(name))
    reached = projection.get(name, set())
    missing = sorted(declared - known - reached)
    extra = sorted(reached - declared)
    assert not missing and not extra, (
        f"{name}: declared in models/ but never taken by the spec: {missing}; "
        f"taken by the spec but not declared in models/: {extra}"
    )


def test_known_unreachable_edges_are_declared_and_unreached(
    projection: dict[str, set[Edge]],
) -> None:
    for name in {*KNOWN_UNREACHABLE, *BEYOND_GATE}:
        edges = excluded(name)
        declared = machines()[name].edges()
        assert set(edges) <= declared, f"{name}: stale entries {sorted(set(edges) - declared)}"
        reached = set(edges) & projection.get(name, set())
        assert not reached, (
            f"{name}: now reachable, drop from p2pfsm/tools/verify/unreachable.py: {reached}")


def test_every_machine_state_is_reached(projection: dict[str, set[Edge]]) -> None:
    for name, spec in machines().items():
        seen = {s for s, _t, _d in projection.get(name, set())}
        seen |= {d for _s, _t, d in projection.get(name, set())}
        assert seen == set(spec.states), f"{name}: never in {sorted(set(spec.states) - seen)}"


def test_every_spec_action_maps_to_a_trigger(spec_dir: Path) -> None:
    actions = names.spec_actions(spec_dir / "P2P.tla")
    mapping = names.action_map()
    unknown = [a for a in actions if a not in mapping and a not in names.ENVIRONMENT_ACTIONS]
    assert actions and not unknown, f"actions named after no model trigger: {unknown}"
    assert set(actions) >= names.ENVIRONMENT_ACTIONS


def test_action_names_are_derived_and_unique() -> None:
    mapping = names.action_map()
    assert mapping["ClientRoundRecvTransferDone"] == ("client_round", "recv_transfer_done")
    for action, (machine, trigger) in mapping.items():
        assert action == names.pascal(machine) + names.pascal(trigger)
    assert len(set(mapping.values())) == len(mapping)


def test_every_trigger_has_an_action_or_fires_inside_one(spec_dir: Path) -> None:
    actions = set(names.spec_actions(spec_dir / "P2P.tla"))
    own = {names.trigger_of(a) for a in actions} - {None}
    every = {(m, t) for m, spec in machines().items() for t in spec.triggers}
    assert own <= every
    assert every - own == TRIGGERS_WITHOUT_ACTION


@pytest.mark.parametrize("profile", sorted(PROFILE_GATES))
def test_graph_actions_map_and_fire_their_trigger(
    profile: str, profile_graphs: dict[str, StateGraph],
) -> None:
    mapping = names.action_map()
    fired_by: dict[str, set[tuple[str, str]]] = {}
    for _src, _dst, action, steps in profile_graphs[profile].steps():
        assert action in names.ENVIRONMENT_ACTIONS or action in mapping, action
        fired_by.setdefault(action, set()).update((m, t) for m, t, _s, _d in steps)
    for action, triggers in fired_by.items():
        own = names.trigger_of(action)
        if own is not None:
            assert own in triggers, f"{action} never fires {own}"
        else:
            assert not triggers, f"environment action {action} fired {triggers}"


@pytest.mark.tlc
def test_large_config_passes(spec_dir: Path, require_tlc: None) -> None:
    """The larger workloads of ``tla/large.cfg`` hold every invariant (minutes; .ci/run:
    ``pytest -m tlc tests/conformance``, or ``p2pfsm check --config large``)."""
    cfg = configs.config(spec_dir, "large")
    result = tlc.run(spec_dir, configs.SPEC_MODULE, cfg.path, timeout=3600.0,
                     extra=cfg.tlc_args)
    assert_passed(result)
    assert result.distinct_states and result.distinct_states > 500_000
