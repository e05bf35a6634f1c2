"""``p2pfsm conform --role consumer --random``: a walk of how we serve passes against
``p2pfsm fetch``; a consumer that reports a declined load as loaded (correct frames, a
lying report) fails with a shrunk case that replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.conform_consumer import (
    FETCH,
    OPTIONS,
    conform_consumer,
    helper_cmd,
    import_this_checkout,
)

LIAR = helper_cmd("lying_consumer.py") + OPTIONS


@pytest.fixture(autouse=True)
def _import_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    import_this_checkout(monkeypatch)


def test_a_consumer_walk_passes_against_p2pfsm_fetch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "walk.json"
    rc = conform_consumer(FETCH, "--random", "8", "--seed", "1", "--json", str(report))
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
    rc = conform_consumer(LIAR, "--random", "3", "--seed", "6", "--shrink-runs", "1",
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
    rc = conform_consumer(LIAR, "--replay", str(replay), "--json", str(again))
    err = capsys.readouterr().err
    assert rc == 1, err
    (case,) = json.loads(again.read_text())["cases"]
    assert case["verdict"] == "fail" and "[failed]" in case["expected"], case
    assert "rule results" in err
