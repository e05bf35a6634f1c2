"""``p2pfsm conform --random`` with faults: walks pass against ``p2pfsm serve``; a broken
scripted producer fails, the failure is shrunk to a shorter case whose replay fails the
same rule; bad arguments exit 2 with one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.protocol import (
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Fetch,
    Lookup,
    LookupResp,
    Message,
    TransferDone,
)
from p2pfsm.tools.cli import main
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.walk_run import run_walk
from p2pfsm.tools.verify.traces import merge_logs, validate
from tests.helpers.cli_errors import assert_bad_arguments
from tests.helpers.fake_producer import BLOCK_LEN, connect_of, fake_producer
from tests.helpers.serve_process import ServeProcess
from tests.helpers.tlc_needed import require_tlc

HELD = 16
LIFETIME_S = 120.0  # the fake serves at most this long
LIE_AT = 4  # the fake claims the LIE_AT-th fetch of each session without writing it


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """``p2pfsm serve``, writing its trace log to ``serve.trace`` (for --validate-spec)."""
    folder = tmp_path_factory.mktemp("walk")
    proc = ServeProcess(folder / "serve.log", HELD, BLOCK_LEN,
                        extra=["--trace", str(folder / "serve-trace.jsonl")])
    proc.trace = folder / "serve-trace.jsonl"  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.stop()


def _conform(addr: str, *extra: str) -> int:
    return main(["conform", "--target", f"tcp://{addr}", "--block-len", str(BLOCK_LEN),
                 "--target-blocks", str(HELD), "--window", "0.3", "--deadline", "3", *extra])


@pytest.mark.parametrize("seed", [11, pytest.param(12, marks=pytest.mark.slow)])
def test_a_walk_with_every_fault_passes_against_serve(
        serve: ServeProcess, seed: int, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "walk.json"
    rc = _conform(serve.addr, "--random", "40", "--seed", str(seed), "--faults", "all",
                  "--json", str(report))
    err = capsys.readouterr().err
    (case,) = json.loads(report.read_text())["cases"]
    assert (case["case"], case["verdict"]) == (f"random.seed-{seed}", "pass"), err
    assert rc == 0
    assert "40 steps" in case["note"]
    assert not list(tmp_path.glob("*.replay.json"))
    assert serve.alive()


class _Liar:
    """A producer that is correct by declining (transfer_done(false) for every fetch,
    every lookup key a miss, every abort acked) except that it claims the
    :data:`LIE_AT`-th fetch of each session with transfer_done(true) and writes nothing."""

    def __init__(self) -> None:
        self.fetches = 0

    def answer(self, msg: Message | None, me: str, data: DataPlane) -> list[Message]:
        if isinstance(msg, Connect):
            self.fetches = 0
            return [connect_of(me, data), ConnectAck(me)]
        if isinstance(msg, Fetch) and msg.keys:
            self.fetches += 1
            return [TransferDone(msg.kv_request_id, self.fetches == LIE_AT, msg.round_seq)]
        if isinstance(msg, Lookup):
            return [LookupResp(msg.kv_request_id, msg.keys, (False,) * len(msg.keys))]
        if isinstance(msg, AbortFetch):
            return [AbortAck(msg.kv_request_id, msg.round_seq)]
        return []


@pytest.fixture
def liar() -> Iterator[str]:
    """The broken producer in a thread; its address. Stopped at teardown."""
    with fake_producer(_Liar().answer, "conform-liar", LIFETIME_S) as addr:
        yield addr


def test_a_broken_target_fails_and_its_shrunk_case_replays(
        liar: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "walk.json"
    rc = _conform(liar, "--random", "30", "--seed", "5", "--faults", "delay,reorder",
                  "--json", str(report))
    err = capsys.readouterr().err
    assert rc == 1, err
    (case,) = json.loads(report.read_text())["cases"]
    assert case["verdict"] == "fail", case
    assert "byte-exact" in case["expected"]
    assert "rule bytes" in err
    assert "tester client_round" in err  # the counterexample's machine steps
    replay = tmp_path / "conform-random-seed-5.replay.json"
    doc = json.loads(replay.read_text())
    assert doc["rule"] == "bytes" and doc["confirmed"] is True
    assert len(doc["steps"]) < doc["original_steps"], doc
    assert sum(s["do"] == "fetch" for s in doc["steps"]) == LIE_AT, doc["steps"]
    assert f"--replay {replay}" in err
    with capsys.disabled():  # the shrink, recorded in the test log (docs/howto/conform.md)
        print(f"\nbroken target: {case['note']}; {case['seconds']:.1f} s")

    again = tmp_path / "again.json"
    rc = _conform(liar, "--replay", str(replay), "--json", str(again))
    err = capsys.readouterr().err
    assert rc == 1, err
    (case,) = json.loads(again.read_text())["cases"]
    assert case["verdict"] == "fail" and "byte-exact" in case["expected"], case
    assert "rule bytes" in err


def test_a_walk_in_the_spec_bounds_is_explained_by_tlc(
        serve: ServeProcess, capsys: pytest.CaptureFixture[str]) -> None:
    require_tlc()
    proc, log = serve, serve.trace  # type: ignore[attr-defined]
    rc = _conform(proc.addr, "--random", "10", "--seed", "1", "--deadline", "2",
                  "--validate-spec", str(log))
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "TLC explains all" in out.out and "(both sides)" in out.out, out.out


@pytest.mark.slow  # a TLC run; the rejection itself is held in tests/conformance too
def test_a_walk_whose_target_log_lost_a_line_is_not_explained(
        serve: ServeProcess, tmp_path: Path) -> None:
    """The check can fail: a walk's own trace is explained, and not once one line of the
    target's side is dropped."""
    require_tlc()
    proc, log = serve, serve.trace  # type: ignore[attr-defined]
    target = Target(proc.addr, BLOCK_LEN, blocks=HELD, deadline=3.0, window=0.3)
    o = run_walk(target, count=8, seed=2, spec=True)
    assert o.failure is None, o.failure
    (me,) = o.identities
    lines = [line for line in log.read_text().splitlines() if json.loads(line)["peer"] == me]
    assert len(lines) > 3, lines
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:2] + lines[3:]) + "\n")
    ours = tmp_path / "ours.jsonl"
    ours.write_text("".join(json.dumps({"t": int(c.at * 1e9), "node": me, "peer": proc.addr,
                                        "action": c.action, "steps": sorted(c.steps)}) + "\n"
                            for c in o.calls if c.action is not None))
    result = validate([merge_logs(ours, log), merge_logs(ours, cut)])  # one TLC run
    assert result.accepted == {1} and result.rejected == {2}, result.explained


def test_a_replay_of_a_passing_case_passes(serve: ServeProcess, tmp_path: Path) -> None:
    replay = tmp_path / "case.json"
    replay.write_text(json.dumps([
        {"do": "fetch", "rid": "w1", "blocks": [0, 1, 2], "slots": [5, 6, 7]},
        {"do": "pause", "ms": 200}, {"do": "finish", "rid": "w1"},
        {"do": "finish", "rid": "nope"}, {"do": "restart"},
        {"do": "fetch", "rid": "w2", "blocks": [3], "slots": [5]}]))
    assert _conform(serve.addr, "--replay", str(replay)) == 0


@pytest.mark.parametrize("args, message", [
    (["--random", "5", "--faults", "bogus"], "expected all, none or some of"),
    (["--random", "5", "--replay", "x.json"], "--random and --replay exclude each other"),
    (["--replay", "/nonexistent/case.json"], "--replay: cannot read"),
    (["--random", "0"], "--random"),
    (["--validate-spec", "log.jsonl"], "--validate-spec needs --random STEPS"),
    (["--random", "5", "--validate-spec", "/nonexistent/log.jsonl"],
     "--validate-spec: no trace log at"),
])
def test_bad_walk_arguments_exit_2_with_one_line(args: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert_bad_arguments(["conform", "--target", "tcp://127.0.0.1:1", *args], message, capsys)


def test_validate_spec_for_the_consumer_role_is_a_bad_argument(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["conform", "--role", "consumer", "--consumer-cmd", "true", "--random", "5",
                 "--validate-spec", "log.jsonl"])
    assert code == 2
    assert "only the producer role's walk is checked by TLC" in capsys.readouterr().err
