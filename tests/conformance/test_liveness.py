"""Liveness: live.cfg and live_ci.cfg check every eventual property of tla/P2P.tla, and
live_ci.cfg (what .ci/run checks) passes with each property exercised.

"Exercised": a ``P ~> Q`` property holds vacuously in a scenario that never reaches
``P``. The live_ci run dumps its reachable graph and each scenario must reach the
antecedent of every property :data:`EXERCISES` names for it (docs/explanation/verification.md,
"Liveness in CI"). The must-fail configs with a temporal property (P10, lost ack,
one-sided loss) show that the properties can fail at all (tests/conformance/test_mustfail.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from p2pfsm.tools.verify import configs, tlc
from p2pfsm.tools.verify.graph import load_dot

from .verdicts import assert_passed

_PROP_DEF = re.compile(r"^(\w+Prop) ==", re.MULTILINE)
_PROPERTIES = re.compile(r"^PROPERTIES[ \t]*\n((?:[ \t]+\w+[ \t]*(?:\n|$))+)", re.MULTILINE)
_INT = re.compile(r"\|->\s*(\d+)")

EXERCISES: dict[int, frozenset[str]] = {
    1: frozenset({"LoadsEndProp", "PinsReleasedProp", "AbortsEndProp", "RoundsEndProp"}),
    2: frozenset({"LoadsEndProp", "PinsReleasedProp", "LookupsEndProp", "AbortsEndProp",
                  "RoundsEndProp"}),
    3: frozenset({"LoadsEndProp", "PinsReleasedProp", "LookupsEndProp", "AbortsEndProp",
                  "RoundsEndProp"}),
    4: frozenset({"PinsReleasedProp", "LookupsEndProp", "RoundsEndProp"}),
    5: frozenset({"LoadsEndProp", "PinsReleasedProp", "AbortsEndProp", "RoundsEndProp"}),
    6: frozenset({"LoadsEndProp", "PinsReleasedProp", "AbortsEndProp", "RoundsEndProp"}),
    7: frozenset({"LoadsEndProp", "PinsReleasedProp", "AbortsEndProp", "RoundsEndProp"}),
}
"""live_ci scenario (MCP2P.LiveCIScenarios, from 1) -> the properties whose antecedent it
reaches."""


def _spec_props(spec_dir: Path) -> set[str]:
    return set(_PROP_DEF.findall((spec_dir / "P2P.tla").read_text()))


def _cfg_props(spec_dir: Path, name: str) -> set[str]:
    m = _PROPERTIES.search((spec_dir / configs.config(spec_dir, name).path).read_text())
    return set(m.group(1).split()) if m else set()


@pytest.mark.parametrize("name", ["live", "live_ci"])
def test_live_config_checks_every_prop(spec_dir: Path, name: str) -> None:
    props = _spec_props(spec_dir)
    assert len(props) >= 5, props
    assert _cfg_props(spec_dir, name) == props


def test_every_prop_is_exercised_by_some_live_ci_scenario(spec_dir: Path) -> None:
    assert set().union(*EXERCISES.values()) == _spec_props(spec_dir)


def _reached(state: dict[str, str]) -> set[str]:
    """The properties whose antecedent holds in a state (as TLA+ text)."""
    out = set()
    if '"pending"' in state["lres"]:
        out.add("LoadsEndProp")
    if '"pinned"' in state["sres"]:
        out.add("PinsReleasedProp")
    if any(int(k) > int(r) for k, r in zip(_INT.findall(state["nlk"]),
                                            _INT.findall(state["nlr"]), strict=True)):
        out.add("LookupsEndProp")
    if '"aborting"' in state["cr"]:
        out.add("AbortsEndProp")
    if re.sub(r"\s", "", state["sr"]) != "[a|-><<>>,b|-><<>>]":
        out.add("RoundsEndProp")
    return out


@pytest.mark.tlc
def test_live_ci_config_passes_and_exercises_every_prop(
    spec_dir: Path, require_tlc: None, tmp_path: Path, conformance_report: list[str],
) -> None:
    """live_ci.cfg: every *Prop holds under fairness (minutes; .ci/run, ``pytest -m tlc``)."""
    cfg = configs.config(spec_dir, "live_ci")
    result = tlc.run(spec_dir, configs.SPEC_MODULE, cfg.path, timeout=3600.0,
                     dump_dot=tmp_path / "live_ci.dot", extra=cfg.tlc_args)
    assert_passed(result)
    assert result.distinct_states and result.distinct_states > 30_000
    assert result.dump is not None
    graph = load_dot(result.dump)
    reached: dict[int, set[str]] = {}
    for node in graph.labels:
        state = graph.state(node)
        reached.setdefault(int(state["scn"]), set()).update(_reached(state))
    assert set(reached) == set(EXERCISES)
    for scn, props in EXERCISES.items():
        assert props <= reached[scn], f"scenario {scn} never reaches {props - reached[scn]}"
    conformance_report.append(
        f"live_ci: {len(_spec_props(spec_dir))} liveness properties hold, "
        f"{result.distinct_states:,} states, {result.seconds:.0f} s")


@pytest.mark.slow
def test_live_config_passes(spec_dir: Path, require_tlc: None) -> None:
    """live.cfg, the full liveness check (about 13 minutes; ``pytest -m slow``)."""
    cfg = configs.config(spec_dir, "live")
    result = tlc.run(spec_dir, configs.SPEC_MODULE, cfg.path, timeout=7200.0,
                     extra=cfg.tlc_args)
    assert_passed(result)
