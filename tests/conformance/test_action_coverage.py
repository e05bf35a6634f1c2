"""Action coverage and the vacuity check: every disjunct of ``Next`` fires in the gate.

The gate's reachable graph (dumped once for the conformance tests) gives, per action
operator of ``Next``, the steps it took; the table goes to the end-of-run summary, so CI
logs show it. A config under which some actions can never fire makes ``p2pfsm check``
fail and name them, from the graph and from TLC's own ``-coverage`` statistics alike.
"""

from __future__ import annotations

import json
import shutil
from io import StringIO
from pathlib import Path

import pytest

from p2pfsm.tools.verify import coverage, names, tlc
from p2pfsm.tools.verify.check import check_main

# A small variant of the gate: one load and one finish, no faults, no timers, no
# frame duplicated, so the fault, timer, lookup and supply actions never fire.
NARROW_GATE = """\\* A gate that cannot reach most actions (test_action_coverage).
SPECIFICATION Spec
CONSTANTS
    Peers = {"a", "b"}
    Reqs = {"r1"}
    MaxRounds = 2
    MaxAborts = 2
    MaxFaults = 1
    LoadPeers = {"a"}
    SupplyPeers = {"b"}
    DupTypes = {}
    Scenarios <- MustFailP3
    BugP1 = FALSE
    BugP3 = FALSE
    BugP4 = FALSE
    BugP5 = FALSE
    BugSilentLoss = FALSE
    BugNoImplicitAck = FALSE
    BugReleaseEarly = FALSE
    Profile = "native"
    TrackFired = TRUE
    TrackAct = FALSE
INVARIANTS
    TypeInv
"""


def test_every_next_disjunct_fires_in_the_gate(
    gate_run: tlc.TlcResult, spec_dir: Path, conformance_report: list[str],
) -> None:
    assert gate_run.dump is not None, gate_run.errors
    actions = names.spec_actions(spec_dir / "P2P.tla")
    counts = coverage.from_dot(gate_run.dump)
    conformance_report.extend(coverage.table(counts, actions, source="gate, state graph"))
    assert len(actions) >= 30
    assert set(counts) <= set(actions), f"steps of no Next disjunct: {set(counts) - set(actions)}"
    assert coverage.never_fired(counts, names.enabled_actions(actions, "native")) == []


def test_each_profile_only_action_fires_in_a_gate_of_its_profile(
    profile_gate_runs: dict[str, tlc.TlcResult],
) -> None:
    """An action only some profiles enable (names.PROFILE_ACTIONS) fires in the gate of
    such a profile; the native gate never takes it."""
    fired = {p: coverage.from_dot(r.dump) for p, r in profile_gate_runs.items()
             if r.dump is not None}
    assert set(fired) == set(profile_gate_runs)
    for action in names.PROFILE_ACTIONS:
        assert action not in names.enabled_actions([action], "native")
        assert action not in fired["native"]
        assert any(c.total for p, r in fired.items() for a, c in r.items() if a == action)


@pytest.fixture(scope="module")
def narrow_spec(require_tlc: None, spec_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                ) -> Path:
    work = tmp_path_factory.mktemp("narrow")
    for tla in spec_dir.glob("*.tla"):
        shutil.copy(tla, work / tla.name)
    (work / "gate.cfg").write_text(NARROW_GATE)
    return work


def _check(spec: Path, *args: str) -> tuple[int, dict[str, object]]:
    out = StringIO()
    code = check_main(["--spec-dir", str(spec), "--json", *args], out=out)
    (report,) = json.loads(out.getvalue())
    return code, report


@pytest.fixture(scope="module")
def narrow_checks(narrow_spec: Path) -> dict[str, tuple[int, dict[str, object]]]:
    """``p2pfsm check --json --coverage MODE`` of the narrow gate, one TLC run per mode:
    ``auto`` (for the gate: its state graph) and ``tlc`` (TLC's own statistics), which
    the tests below read."""
    return {mode: _check(narrow_spec, "--coverage", mode) for mode in ("auto", "tlc")}


@pytest.mark.parametrize("mode", ["auto", "tlc"])
def test_an_action_that_never_fires_fails_the_check(
    narrow_checks: dict[str, tuple[int, dict[str, object]]], mode: str,
) -> None:
    code, report = narrow_checks[mode]
    cov = report["coverage"]
    assert isinstance(cov, dict)
    never = cov["never_fired"]
    assert code == 1, report
    assert str(report["verdict"]).startswith("VACUOUS"), report["verdict"]
    assert report["violated"] is None  # the invariants hold: only the coverage fails
    assert "NetworkDuplicate" in never and "ServerRoundTimerDemand" in never
    assert "ClientRoundHostFetch" not in never and "ClientRoundHostFinish" not in never
    for name in never:
        assert name in str(report["verdict"])
    steps = {row["action"]: row["steps"] for row in cov["actions"]}  # type: ignore[index]
    assert steps["ClientRoundHostFetch"] > 0


def test_both_sources_agree_on_what_never_fires(
    narrow_checks: dict[str, tuple[int, dict[str, object]]],
) -> None:
    (_, graph), (_, own) = narrow_checks["auto"], narrow_checks["tlc"]
    assert graph["coverage"]["source"] == "graph"  # type: ignore[index]  # auto, for a gate
    assert own["coverage"]["source"] == "tlc"  # type: ignore[index]
    assert graph["coverage"]["never_fired"] == own["coverage"]["never_fired"]  # type: ignore[index]


def test_the_table_marks_each_action_that_never_fires(narrow_spec: Path) -> None:
    out = StringIO()
    assert check_main(["--spec-dir", str(narrow_spec), "-q"], out=out) == 1
    text = out.getvalue()
    assert "gate: VACUOUS (a Next disjunct never fires: " in text
    assert any(line.split()[:1] == ["NetworkDuplicate"] and "NEVER FIRES" in line
               for line in text.splitlines())
    assert "action coverage: " in text and " Next disjuncts fire; never fires (vacuous): " in text


def test_tlc_coverage_messages_are_read() -> None:
    text = "\n".join([
        "@!@!@STARTMSG 2201:0 @!@!@", "The coverage statistics at 2026-01-01 00:00:00",
        "@!@!@ENDMSG 2201 @!@!@",
        "@!@!@STARTMSG 2772:0 @!@!@",
        "<A line 3, col 1 to line 3, col 1 of module M>: 1:1", "@!@!@ENDMSG 2772 @!@!@",
        "@!@!@STARTMSG 2201:0 @!@!@", "The coverage statistics at 2026-01-01 00:01:00",
        "@!@!@ENDMSG 2201 @!@!@",
        "@!@!@STARTMSG 2772:0 @!@!@",
        "<A line 3, col 1 to line 3, col 1 of module M (4 5 6 7)>: 5:9",
        "@!@!@ENDMSG 2772 @!@!@",
        "@!@!@STARTMSG 2772:0 @!@!@",
        "<B line 8, col 1 to line 8, col 1 of module M>: 0:0", "@!@!@ENDMSG 2772 @!@!@", ""])
    counts = coverage.from_tlc(tlc.parse_output(text, 0).messages)
    assert counts == {"A": coverage.ActionCount("A", 5, 9, "M:3"),
                      "B": coverage.ActionCount("B", 0, 0, "M:8")}
    assert coverage.never_fired(counts, ["A", "B", "C"]) == ["B", "C"]
