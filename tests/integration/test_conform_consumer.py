"""``p2pfsm conform --role consumer`` against ``p2pfsm fetch`` (a subprocess per case):
every consumer-role case passes; a consumer that never connects fails the cases it
touches, naming the rule and a command that re-runs each alone; a scripted consumer that
breaks an abort rule fails the case that looks at it."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from p2pfsm.tools.conform.registry import CASES
from tests.helpers.conform_consumer import (
    FETCH,
    conform_consumer,
    helper_cmd,
    import_this_checkout,
)


@pytest.fixture(autouse=True)
def _import_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    import_this_checkout(monkeypatch)


def test_every_consumer_case_passes_against_p2pfsm_fetch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "report.json"
    rc = conform_consumer(FETCH, "--json", str(report))
    out = capsys.readouterr()
    verdicts = {c["case"]: c["verdict"] for c in json.loads(report.read_text())["cases"]}
    assert set(verdicts) == {c.id for c in CASES.values() if c.role == "consumer"}
    assert verdicts == dict.fromkeys(verdicts, "pass"), out.err
    assert rc == 0


def test_a_consumer_that_never_connects_fails(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The suite can fail: a "consumer" that exits 0 at once never fetches."""
    report = tmp_path / "report.json"
    idle = shlex.join([sys.executable, "-c", "raise SystemExit(0)"]) + " {addr}"
    rc = conform_consumer(idle, "--cases", "consumer.handshake,consumer.transfer-failed",
                          "--json", str(report))
    err = capsys.readouterr().err
    assert rc == 1
    verdicts = {c["case"]: c["verdict"] for c in json.loads(report.read_text())["cases"]}
    assert verdicts == {"consumer.handshake": "fail", "consumer.transfer-failed": "fail"}
    assert "no frame at all" in err
    assert "re-run: p2pfsm conform --role consumer --consumer-cmd" in err
    assert "--cases consumer.handshake" in err


def test_a_handshake_the_tester_cannot_pass_is_said_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A consumer whose fingerprint is not the one the tester was told: one line naming
    it and the option that fixes it, exit 2, the cases after the first not run."""
    report = tmp_path / "report.json"
    rc = conform_consumer(FETCH, "--fingerprint", "0000000000000000", "--cases",
                          "consumer.handshake,consumer.pd-round", "--json", str(report))
    out = capsys.readouterr().out
    assert rc == 2
    line = ("cannot test: the target's fingerprint is '' (the tester's is "
            "'0000000000000000'): pass --fingerprint ''")
    assert out.count("cannot test:") == 1 and line in out, out
    cases = json.loads(report.read_text())["cases"]
    assert [(c["case"], c["verdict"], c["cannot_test"]) for c in cases] == [
        ("consumer.handshake", "fail", line)]


@pytest.mark.parametrize("mode, case, got", [
    ("frees", "consumer.abort-quiescence", "fetch(round_seq=1) into the same blocks before "
     "our abort_ack"),
    ("reuse", "consumer.round-isolation", "fetch round_seq 0 again after round 0"),
    ("claims", "consumer.producer-restart", "exit 0, and the new incarnation served nothing"),
])
def test_a_consumer_that_breaks_a_rule_fails(
        mode: str, case: str, got: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The suite can fail the abort cases: a scripted consumer fetches again into the
    blocks of an unacked abort (``frees``), or reuses the aborted round (``reuse``); and
    the restart case: one reports success for a load whose producer died (``claims``)."""
    report = tmp_path / "report.json"
    fake = helper_cmd("fake_consumer.py")
    rc = conform_consumer(fake + " {addr} " + mode + " {repeat}", "--cases", case,
                          "--json", str(report))
    err = capsys.readouterr().err
    assert rc == 1
    (result,) = json.loads(report.read_text())["cases"]
    assert (result["case"], result["verdict"]) == (case, "fail"), err
    assert got in result["got"], result["got"]
    # Our session's calls in the models' terms (the walk's counterexample style).
    assert "tester server_round" in result["counterexample"]
    assert "tester server_round" in err and f"--cases {case}" in err
