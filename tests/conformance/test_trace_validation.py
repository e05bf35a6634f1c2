"""Trace validation: runs of the real sessions are behaviours of the spec.

Each ``Session.handle`` call is logged as (spec action, peer, machine steps taken), from
three sources: seeded SimWorld runs, hypothesis-driven SimWorld runs, and real runs (a
``p2pfsm serve`` and ``p2pfsm fetch`` processes over ZeroMQ and NIXL on 127.0.0.1, each
writing a ``--trace`` log, merged by time). One TLC run of ``tla/TraceP2P.tla`` must
explain every trace, with frame contents, keys and the hosts' answers hidden, and must
reject traces whose steps were tampered with.
"""

from __future__ import annotations

import importlib.util
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from p2pfsm.fsm import machines
from p2pfsm.tools.verify.traces import (
    TraceEvent,
    TraceValidation,
    hypothesis_traces,
    load_log,
    merge_logs,
    random_trace,
    validate,
)

SEEDS = range(10)
HYPOTHESIS_EXAMPLES = 20
CLI = [sys.executable, "-m", "p2pfsm.tools.cli"]
# One request, one key each (the spec's trace bounds); the server holds block 0 only.
REAL_RUNS: dict[str, tuple[list[str], int]] = {
    "pd": (["--keys", "0"], 0),
    "sym": (["--keys", "0", "--mode", "sym"], 0),
    # The server does not hold block 1: its host finishes the request, which fails the
    # round at once (transfer_done(false)) rather than at the consumer's load deadline.
    "miss": (["--keys", "1", "--load-timeout", "5"], 1),
}
RUN_TIMEOUT = 90.0  # process start-up loads torch and NIXL; two busy cores


@dataclass(frozen=True)
class Recorded:
    """Every trace validated, by source, and the corrupted copies (must be rejected)."""

    sim: list[list[TraceEvent]]
    hypothesis: list[list[TraceEvent]]
    real: dict[str, list[TraceEvent]]
    corrupted: list[list[TraceEvent]]
    incomplete: list[tuple[list[TraceEvent], int]]
    """Traces with a garbled or a missing line, and the lines before it."""

    @property
    def traces(self) -> list[list[TraceEvent]]:
        return [*self.sim, *self.hypothesis, *self.real.values()]


def _settles(event: TraceEvent) -> bool:
    return any(step[1] == "settle" and step[2] != step[3] for step in event.steps)


def _corrupt(trace: list[TraceEvent]) -> list[TraceEvent]:
    """The first call that settled a round, claimed to have left the round as it was."""
    bad = list(trace)
    i = next(i for i, e in enumerate(bad) if _settles(e))
    event = bad[i]
    bad[i] = TraceEvent(event.action, event.peer,
                        frozenset(s for s in event.steps if s[1] != "settle"))
    return bad


def _garbled(trace: list[TraceEvent]) -> tuple[list[TraceEvent], int]:
    """The middle line claims another action (a garbled log line)."""
    i = len(trace) // 2
    other = "SessionHostStart" if trace[i].action != "SessionHostStart" else "SessionHostClose"
    return [*trace[:i], TraceEvent(other, trace[i].peer, trace[i].steps), *trace[i + 1:]], i


def _gap(trace: list[TraceEvent]) -> tuple[list[TraceEvent], int]:
    """The line where peer b starts its session is missing (a log that lost a line; a
    lost receive line would not do: the spec may explain it as a frame lost)."""
    i = next(i for i, e in enumerate(trace) if e.action == "SessionHostStart" and e.peer == "b")
    return [*trace[:i], *trace[i + 1:]], i


def _real_runs(tmp: Path) -> dict[str, list[TraceEvent]]:
    """Run one ``p2pfsm serve --trace`` and every REAL_RUNS fetch against it; merge logs.

    The server is stopped as an operator would (SIGTERM: it closes every session and
    exits), so each merged trace is the whole of both runs, shutdown included.
    """
    server_log = tmp / "server.jsonl"
    server = subprocess.Popen(
        [*CLI, "serve", "--bind", "tcp://127.0.0.1:0", "--blocks", "1",
         "--block-len", "4096", "--trace", str(server_log)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients: dict[str, subprocess.Popen[str]] = {}
    try:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], RUN_TIMEOUT)
        line = server.stdout.readline() if ready else ""
        assert line.startswith("serving"), f"serve did not start: {line!r} ({server.poll()})"
        address = "tcp://" + line.rsplit("tcp://", 1)[1].strip()
        for name, (args, _code) in REAL_RUNS.items():
            clients[name] = subprocess.Popen(
                [*CLI, "fetch", "--connect", address, "--trace", str(tmp / f"{name}.jsonl"),
                 *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + RUN_TIMEOUT
        for name, proc in clients.items():
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            expected = REAL_RUNS[name][1]
            assert proc.returncode == expected, f"fetch {name}: {proc.returncode}\n{out}\n{err}"
            assert "Traceback" not in err, err
        server.send_signal(signal.SIGTERM)
        _out, err = server.communicate(timeout=RUN_TIMEOUT)
        assert server.returncode == 0, f"serve exited {server.returncode}\n{err}"
    finally:
        for proc in [*clients.values(), server]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=10)
    return {name: merge_logs(tmp / f"{name}.jsonl", server_log) for name in REAL_RUNS}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    sim = [random_trace(seed) for seed in SEEDS]
    hyp = hypothesis_traces(HYPOTHESIS_EXAMPLES)
    real: dict[str, list[TraceEvent]] = {}
    if (importlib.util.find_spec("torch") is not None
            and (importlib.util.find_spec("nixl") is not None
                 or importlib.util.find_spec("nixl_cu12") is not None)):
        real = _real_runs(tmp_path_factory.mktemp("real-traces"))
    sources = [sim, hyp, list(real.values())]
    corrupted = [_corrupt(next(t for t in source if any(_settles(e) for e in t)))
                 for source in sources if source]
    return Recorded(sim, hyp, real, corrupted, [_garbled(sim[0]), _gap(sim[1])])


@pytest.fixture(scope="module")
def validation(require_tlc: None, recorded: Recorded,
               conformance_report: list[str]) -> Iterator[TraceValidation]:
    """Every trace, and the corrupted copies after them, in one TLC run."""
    traces = recorded.traces
    result = validate([*traces, *recorded.corrupted, *(t for t, _ in recorded.incomplete)])
    ok = sum(1 for i in range(1, len(traces) + 1) if i in result.accepted)
    bad = len(recorded.corrupted)
    caught = sum(1 for i in range(len(traces) + 1, len(traces) + bad + 1)
                 if i in result.rejected)
    conformance_report.append(
        f"trace validation: {len(traces)} traces ({len(recorded.sim)} sim, "
        f"{len(recorded.hypothesis)} hypothesis, {len(recorded.real)} real, "
        f"{sum(map(len, traces))} calls) checked by one TLC run "
        f"({result.result.distinct_states} states, {result.result.seconds:.1f} s): "
        f"{ok} accepted; {caught} of {bad} corrupted traces rejected; trace completeness: "
        f"{'every line of every accepted trace consumed' if ok == len(traces) else 'NO'}, "
        f"{len(recorded.incomplete)} traces with a garbled or missing line not consumed "
        f"past it")
    yield result


def _unexplained(validation: TraceValidation, numbers: range,
                 traces: list[list[TraceEvent]]) -> list[str]:
    out = []
    for i, trace in zip(numbers, traces, strict=True):
        if i not in validation.accepted:
            k = validation.explained[i]
            out.append(f"trace {i}: explained {k}/{len(trace)} calls, stuck at "
                       f"{trace[k] if k < len(trace) else '?'}")
    return out


def test_traces_are_not_trivial(recorded: Recorded) -> None:
    assert all(len(t) >= 10 for t in recorded.sim + recorded.hypothesis)
    assert len(recorded.hypothesis) >= HYPOTHESIS_EXAMPLES // 2  # distinct ones
    actions = {e.action for t in recorded.sim + recorded.hypothesis for e in t}
    assert {"ClientRoundHostFetch", "ServerRoundRecvFetch", "ClientRoundRecvTransferDone",
            "ServerRoundWriteDone"} <= actions


def test_real_traces_are_not_trivial(recorded: Recorded) -> None:
    if not recorded.real:
        pytest.skip("real runs need torch and NIXL (.ci/install.sh installs them)")
    done = {"ClientRoundHostFetch", "ServerRoundRecvFetch", "ServerRoundWriteDone",
            "ClientRoundRecvTransferDone"}
    wanted = {
        "pd": done | {"ServerRoundHostSupply", "SessionHostClose"},
        "sym": done | {"ClientLookupHostLookup", "ServerLookupRecvLookup",
                       "ServerLookupHostAnswer", "ClientLookupRecvLookupResp",
                       "ClientRoundHostFinish"},
        "miss": {"ClientRoundHostFetch", "ServerRoundRecvFetch", "ClientRoundHostFinish",
                 "ClientRoundRecvTransferDone"},
    }
    for name, trace in recorded.real.items():
        actions = {e.action for e in trace}
        assert wanted[name] <= actions, f"{name}: missing {wanted[name] - actions}"
        assert {e.peer for e in trace} == {"a", "b"}
        assert [e.action for e in trace[:1]] == ["SessionHostStart"]


def test_every_recorded_trace_is_explained(
    validation: TraceValidation, recorded: Recorded,
) -> None:
    traces = recorded.traces
    missing = _unexplained(validation, range(1, len(traces) + 1), traces)
    assert not missing, "no behaviour of the spec explains:\n" + "\n".join(missing)


def test_real_traces_are_explained(validation: TraceValidation, recorded: Recorded) -> None:
    if not recorded.real:
        pytest.skip("real runs need torch and NIXL (.ci/install.sh installs them)")
    first = len(recorded.sim) + len(recorded.hypothesis) + 1
    real = list(recorded.real.values())
    missing = _unexplained(validation, range(first, first + len(real)), real)
    assert not missing, "no behaviour of the spec explains:\n" + "\n".join(missing)


def test_corrupted_traces_are_rejected(
    validation: TraceValidation, recorded: Recorded,
) -> None:
    n = len(recorded.traces)
    assert len(recorded.corrupted) >= 1
    for k, trace in enumerate(recorded.corrupted, start=n + 1):
        assert k in validation.rejected, f"corrupted trace {k} was explained"
        assert validation.explained[k] < len(trace)


def test_every_line_is_consumed_or_the_trace_is_rejected(
    validation: TraceValidation, recorded: Recorded,
) -> None:
    """Trace completeness (TraceComplete): a trace is accepted only when its last line is
    consumed; one garbled or missing line stops it there."""
    first = len(recorded.traces) + len(recorded.corrupted) + 1
    assert len(recorded.incomplete) == 2
    for k, (trace, good) in enumerate(recorded.incomplete, start=first):
        assert k in validation.rejected, f"trace {k} (bad line {good + 1}) was accepted"
        assert good <= validation.explained[k] < len(trace)
    garbled, good = recorded.incomplete[0]
    assert validation.explained[first] == good  # nothing takes the garbled line
    assert not validation.complete
    every = [*recorded.traces, *recorded.corrupted, *(t for t, _ in recorded.incomplete)]
    report = validation.incomplete(every)
    assert f"trace {first}: {good}/{len(garbled)} lines consumed" in "\n".join(report)
    for i in range(1, len(recorded.traces) + 1):
        assert validation.explained[i] == len(recorded.traces[i - 1])


def test_a_truncated_or_garbled_log_is_a_clear_error(tmp_path: Path) -> None:
    good = ('{"t": 1.0, "node": "x", "peer": "y", "action": "SessionHostStart", '
            '"steps": []}\n')
    cut = tmp_path / "cut.jsonl"
    cut.write_text(good + good[:30])
    with pytest.raises(ValueError, match=r"cut.jsonl:2: not a JSON line .*truncated"):
        load_log(cut)
    odd = tmp_path / "odd.jsonl"
    odd.write_text(good + '{"t": 2.0, "node": "x"}\n')
    with pytest.raises(ValueError, match=r"odd.jsonl:2: a trace line needs the fields"):
        load_log(odd)
    whole = tmp_path / "whole.jsonl"
    whole.write_text(good + good)
    assert [line["action"] for line in load_log(whole)] == ["SessionHostStart"] * 2


def test_traces_exercise_most_transitions(recorded: Recorded) -> None:
    """The recorded traces, with the vllm-0.34 profile's sim traces for the transitions
    only a profile other than native takes, take at least half of those declared."""
    profile = [random_trace(seed, profile="vllm-0.34") for seed in PROFILE_SEEDS]
    seen = {(m, (s, t, d)) for tr in (*recorded.traces, *profile) for e in tr
            for m, t, s, d in e.steps}
    declared = {(name, edge) for name, spec in machines().items() for edge in spec.edges()}
    assert seen <= declared
    assert len(seen) >= len(declared) // 2, f"{len(seen)}/{len(declared)} transitions"


PROFILE_SEEDS = range(12)


def test_sim_traces_of_the_vllm_034_profile_are_behaviours_of_its_spec(
    require_tlc: None, conformance_report: list[str],
) -> None:
    """Sessions of the vllm-0.34 profile, checked against the spec with that Profile:
    each trace is explained, and the profile's own steps (a load reported at its abort,
    its destination released later) are among them."""
    traces = [random_trace(seed, profile="vllm-0.34") for seed in PROFILE_SEEDS]
    result = validate(traces, profile="vllm-0.34")
    missing = _unexplained(result, range(1, len(traces) + 1), traces)
    assert not missing, "no behaviour of the spec explains:\n" + "\n".join(missing)
    steps = {s for t in traces for e in t for s in e.steps}
    assert ("client_round", "timer_load", "loading", "reported") in steps
    conformance_report.append(
        f"trace validation, profile vllm-0.34: {len(traces)} sim traces "
        f"({sum(map(len, traces))} calls), {result.result.distinct_states} states, "
        f"{result.result.seconds:.1f} s: all explained")
    # The same traces against the native spec: a load reported at its abort is no
    # behaviour of it.
    wrong = validate(traces, profile="native")
    assert wrong.rejected
