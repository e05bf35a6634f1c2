"""``p2pfsm conform --role consumer --random``: a walk of how we serve passes against
``p2pfsm fetch``; a consumer that reports a declined load as loaded (correct frames, a
lying report) fails with a shrunk case that replays."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from p2pfsm.cli import main

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = (" --connect tcp://{addr} --keys {keys} --mode {mode} --load-timeout "
           "{load_timeout} --abort-ack-timeout {abort_ack_timeout} --repeat {repeat}")
FETCH = shlex.join([sys.executable, "-c", "from p2pfsm.cli import main; "
                    "raise SystemExit(main())", "fetch"]) + OPTIONS
LIAR = shlex.join([sys.executable, str(ROOT / "tests" / "helpers" / "lying_consumer.py")]) \
    + OPTIONS


@pytest.fixture(autouse=True)
def _import_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The consumer subprocesses import p2pfsm from this checkout."""
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + (os.pathsep + path if path else ""))


def _conform(cmd: str, *extra: str) -> int:
    return main(["conform", "--role", "consumer", "--consumer-cmd", cmd, "--window", "0.5",
                 "--deadline", "5", *extra])


def test_a_consumer_walk_passes_against_p2pfsm_fetch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "walk.json"
    rc = _conform(FETCH, "--random", "8", "--seed", "1", "--json", str(report))
    err = capsys.readouterr().err
    (case,) = json.loads(report.read_text())["cases"]
    assert (case["case"], case["role"], case["verdict"]) == (
        "random.seed-1", "consumer", "pass"), err
    assert rc == 0
    assert "8 steps (0 skipped)" in case["note"]
    assert any("<- fetch(" in line for line in case["trace"])
    assert not list(tmp_path.glob("*.replay.json"))


def test_a_lying_consumer_fails_with_a_shrunk_case_that_replays(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 6 draws: launch (pd), supply, decline; the liar reports both loaded."""
    report = tmp_path / "walk.json"
    rc = _conform(LIAR, "--random", "3", "--seed", "6", "--shrink-runs", "1",
                  "--json", str(report))
    err = capsys.readouterr().err
    assert rc == 1, err
    (case,) = json.loads(report.read_text())["cases"]
    assert case["verdict"] == "fail", case
    assert "reports each load as we served it" in case["expected"]
    assert "rule results" in err
    assert "tester server_round" in err  # the counterexample's machine steps
    replay = tmp_path / "conform-random-seed-6.replay.json"
    doc = json.loads(replay.read_text())
    assert doc["rule"] == "results" and doc["confirmed"] is True
    assert doc["steps"] == [{"do": "serve", "how": "decline"}], doc
    assert f"--replay {replay}" in err

    again = tmp_path / "again.json"
    rc = _conform(LIAR, "--replay", str(replay), "--json", str(again))
    err = capsys.readouterr().err
    assert rc == 1, err
    (case,) = json.loads(again.read_text())["cases"]
    assert case["verdict"] == "fail" and "[failed]" in case["expected"], case
    assert "rule results" in err
