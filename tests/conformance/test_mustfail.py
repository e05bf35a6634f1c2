"""The gate config passes, and every must-fail config (a known vLLM bug switched back on)
gives a counterexample that violates the property its comment names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from p2pfsm.tools.verify import configs, tlc

_MUST_VIOLATE = re.compile(r"Must violate (\w+)")


def _expected(spec_dir: Path, name: str) -> str:
    comment = configs.config(spec_dir, name).comment
    m = _MUST_VIOLATE.search(comment)
    assert m is not None, f"{name}: its opening comment must say 'Must violate <Property>'"
    return m[1]


def test_there_are_must_fail_configs(spec_dir: Path) -> None:
    found = {c.name for c in configs.must_fail_configs(spec_dir)}
    for bug in ("p1_", "p3_", "p4_", "p5_"):
        assert any(n.startswith(f"mustfail/{bug}") for n in found), f"no must-fail for {bug}"


def test_gate_passes(gate_run: tlc.TlcResult) -> None:
    assert gate_run.ok, (gate_run.violated, gate_run.errors)


@pytest.mark.parametrize(
    "name", [c.name for c in configs.must_fail_configs(configs.spec_dir())])
def test_must_fail_config_gives_a_counterexample(
    name: str, spec_dir: Path, must_fail_runs: dict[str, tlc.TlcResult],
) -> None:
    result = must_fail_runs[name]
    assert result.errors == (), result.errors
    assert result.violated is not None, f"{name} passed: the bug it re-introduces went unseen"
    assert result.trace, "no counterexample trace"
    expected = _expected(spec_dir, name)
    cfg = configs.config(spec_dir, name)
    if cfg.temporal:
        assert result.outcome == "liveness" and expected.endswith("Prop")
    else:
        assert result.outcome == "safety"
        assert result.violated == expected
    assert result.trace[0].action == "Initial predicate"
    assert all(step.action for step in result.trace)
