"""Counterexamples in the models' terms (``p2pfsm/tools/verify/explain.py``, ``p2pfsm check``).

The TLC runs come from ``must_fail_runs`` (conftest: each must-fail config checked once
per session); ``p2pfsm check`` is run in-process on those results, its ``tlc.run``
replaced by the stored result, so the CLI's text and JSON are what a user sees without
running TLC again. The synthetic traces below need no TLC.
"""

from __future__ import annotations

import io
import json
import re

import pytest

from p2pfsm.tools.verify import check, explain, names, printer, tla_values, tlc

P4 = "mustfail/p4_round_restart"


def _cli(monkeypatch: pytest.MonkeyPatch, result: tlc.TlcResult, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(tlc, "run", lambda *a, **k: result)
    out = io.StringIO()
    code = check.check_main(["--config", "p4_round_restart", "-q", *args], out=out)
    return code, out.getvalue()


@pytest.fixture()
def p4(must_fail_runs: dict[str, tlc.TlcResult]) -> tlc.TlcResult:
    result = must_fail_runs[P4]
    assert result.violated == "TerminalFrameInv" and result.trace, result.errors
    return result


def test_p4_text_names_machine_steps_and_frames(
    p4: tlc.TlcResult, monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out = _cli(monkeypatch, p4)
    assert code == 1
    assert "VIOLATED (as this must-fail config requires)" in out
    assert "Each step: the TLA+ action" in out  # the legend
    assert "ClientRoundHostFetch = client_round host_fetch" in out
    assert re.search(r"^\s+a client_round r1/0: \w+ -> \w+", out, re.MULTILINE), out
    assert re.search(r"^\s+a client_round r1/0: loading -> aborting \((host_finish|timer_load)\)",
                     out, re.MULTILINE), out
    assert re.search(r"^\s+sent fetch r1/0 keys=\[k1\] job=1 a -> b$", out, re.MULTILINE), out
    assert re.search(r"^\s+delivered abort_ack r1/0 job=1 b -> a$", out, re.MULTILINE), out
    assert "…" not in out
    # The stale ack of job 1 completes job 2's round: the last step says so.
    last = out.split(f"\n  {len(p4.trace):>3}  ")[-1]
    assert "a client_round r1/0: aborting -> aborted (recv_abort_ack)" in last, last
    assert "delivered abort_ack r1/0 job=1 b -> a" in last and "lres[a][2].by: 0 -> 1" in last


def test_p4_json_has_the_structured_steps(
    p4: tlc.TlcResult, monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out = _cli(monkeypatch, p4, "--json")
    assert code == 1
    (report,) = json.loads(out)
    steps = report["counterexample"]
    assert len(steps) == len(p4.trace)
    for step in steps:
        assert {"step", "action", "machine_steps", "frames_sent", "frames_delivered",
                "changed"} <= step.keys()
    moves = [(m["machine"], m["instance"], m["source"], m["dest"])
             for s in steps for m in s["machine_steps"]]
    assert ("client_round", "r1/0", "loading", "aborting") in moves
    assert ("server_round", "r1/0", "new", "serving") in moves
    sent = [f for s in steps for f in s["frames_sent"]]
    assert {"type": "abort_fetch", "req": "r1", "seq": 0, "from": "a", "to": "b"}.items() \
        <= sent[1].items(), sent
    delivered = [f["text"] for s in steps for f in s["frames_delivered"]]
    assert "abort_ack r1/0 job=1 b -> a" in delivered
    fetch = next(s for s in steps if s["action"] == "ClientRoundHostFetch")
    assert (fetch["machine"], fetch["trigger"]) == ("client_round", "host_fetch")


def test_p4_json_lists_only_changed_variables(
    p4: tlc.TlcResult, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _code, out = _cli(monkeypatch, p4, "--json")
    steps = json.loads(out)[0]["counterexample"]
    assert steps[0]["kind"] == "initial" and "sess" in steps[0]["changed"]
    for step in steps[1:]:
        for var, (before, after) in step["changed"].items():
            assert before != after, (step["step"], var)
        # Nothing of these ever changes in P4 (no fault, no handshake, one scenario).
        assert not {"scn", "compat", "cut", "sess", "faults"} & step["changed"].keys(), step
    finish = next(s for s in steps if s["action"] == "ClientRoundHostFinish")
    assert set(finish["changed"]) == {"cr", "chan", "nfin", "fin"}, finish["changed"]
    by_step = {s.index: s for s in p4.trace}
    for step in steps[1:]:
        before, after = by_step[step["step"] - 1].state, by_step[step["step"]].state
        unchanged = {v for v in after if v not in explain.HIDDEN
                     and tla_values.parse_value(before[v]) == tla_values.parse_value(after[v])}
        assert not unchanged & step["changed"].keys()


def test_every_must_fail_counterexample_is_explained_whole(
    must_fail_runs: dict[str, tlc.TlcResult],
) -> None:
    actions = set(names.action_map()) | names.ENVIRONMENT_ACTIONS
    for name, result in must_fail_runs.items():
        assert result.trace, name
        steps = explain.explain(result.trace)
        text = check.counterexample_table(result)
        flat = " ".join(text.split())
        for step in steps:
            if step.kind == "step":
                assert step.action in actions, (name, step.action)
                assert step.machine_steps or step.frames_sent or step.frames_delivered \
                    or step.parts, (name, step.index)
            for c in step.shown:  # every printed change is there in full, wrapped or not
                line = (f"{c.var} = {c.after}" if step.kind == "initial"
                        else f"{c.path}: {c.before} -> {c.after}")
                assert " ".join(line.split()) in flat, (name, c)
            for ms in step.machine_steps:
                assert " ".join(ms.text().split()) in flat or step.kind == "initial"
        assert all(len(line) <= 100 or " " not in line.strip() for line in text.splitlines())


# ---------------------------------------------------------------------------
# Without TLC

_INIT = {
    "sess": '[a |-> "ready", b |-> "awaiting_ack"]',
    "chan": "[a |-> <<>>, b |-> <<>>]",
    "queue": "[a |-> <<>>, b |-> <<>>]",
    "cr": "[a |-> <<>>, b |-> <<>>]",
    "nfin": "[a |-> 0, b |-> 0]",
    "scn": "1",
}
_FETCH = '<<"fetch", "r1", 0, {"k1"}, 1, FALSE, {}, TRUE>>'


def _trace(*states: tuple[str, dict[str, str]]) -> list[tlc.TraceStep]:
    out = []
    for i, (action, state) in enumerate(states, 1):
        out.append(tlc.TraceStep(i, action, state, {}))
    return out


def test_values_parse_as_tlc_prints_them() -> None:
    fn = tla_values.parse_value('(<<"r1", 0>> :> [st |-> "loading", job |-> 1] @@ '
                                   '<<"r1", -1>> :> [st |-> "supplied", job |-> 0])')
    assert isinstance(fn, tla_values.Fn) and fn[("r1", -1)] == {"st": "supplied", "job": 0}
    assert tla_values.parse_value("[a |-> <<>>, b |-> << >>]") == \
        tla_values.parse_value("[ a |-> <<>>,\n  b |-> <<>> ]")
    assert tla_values.parse_value('{"k2", "k1"}') == frozenset({"k1", "k2"})
    text = '<<"a\\"b", TRUE, -1>>'
    assert tla_values.show(tla_values.parse_value(text)) == text
    with pytest.raises(ValueError):
        tla_values.parse_value("[a |-> ")


def test_a_synthetic_trace_queues_flushes_and_lists_changes_only() -> None:
    queued = {**_INIT, "cr": '[a |-> <<>>, b |-> (<<"r1", 0>> :> [st |-> "loading", '
                              'job |-> 1])]',
              "queue": f"[a |-> <<>>, b |-> <<{_FETCH}>>]"}
    flushed = {**queued, "sess": '[a |-> "ready", b |-> "ready"]',
               "queue": "[a |-> <<>>, b |-> <<>>]", "chan": f"[a |-> <<>>, b |-> <<{_FETCH}>>]"}
    finished = {**flushed, "nfin": "[a |-> 0, b |-> 1]"}
    steps = explain.explain(_trace(("Initial predicate", _INIT), ("ClientRoundHostFetch", queued),
                                   ("SessionRecvConnectAck", flushed),
                                   ("ClientRoundHostFinish", finished)))
    init, fetch, ack, finish = steps
    assert [m.text() for m in init.machine_steps] == ["a session: ready -> ready",
                                                      "b session: awaiting_ack -> awaiting_ack"]
    assert [m.text() for m in fetch.machine_steps] == [
        "b client_round r1/0: new -> loading (host_fetch)"]
    assert [f.text() for f in fetch.frames_queued] == ["fetch r1/0 keys=[k1] job=1 b -> a"]
    assert not fetch.frames_sent
    assert set(fetch.changed) == {"cr", "queue"}
    assert [m.text() for m in ack.machine_steps] == [
        "b session: awaiting_ack -> ready (recv_connect_ack)"]
    assert [f.text() for f in ack.frames_sent] == ["fetch r1/0 keys=[k1] job=1 b -> a"]
    assert not ack.frames_lost and not ack.frames_delivered
    assert set(ack.changed) == {"sess", "queue", "chan"}
    # host_finish on a loading round must abort it: a finish that changes nothing else
    # is no step of models/ the diff can see, and only nfin is listed.
    assert set(finish.changed) == {"nfin"}
    assert [(c.path, c.before, c.after) for c in finish.shown] == [("nfin[b]", "0", "1")]
    assert [m.text() for m in finish.machine_steps] == []
    text = printer.render(steps)
    assert "queued fetch r1/0 keys=[k1] job=1 b -> a" in text
    assert "(no machine changed state)" in text
    as_json = printer.as_json(steps)
    assert as_json[3]["changed"] == {"nfin": ["[a |-> 0, b |-> 0]", "[a |-> 0, b |-> 1]"]}


def test_a_step_no_model_transition_explains_is_flagged() -> None:
    aborting = {**_INIT, "cr": '[a |-> (<<"r1", 0>> :> [st |-> "aborting", job |-> 1]), '
                               'b |-> <<>>]',
                "lres": '[a |-> <<[r |-> "pending", by |-> 0]>>, b |-> <<>>]'}
    given_up = {**aborting, "cr": "[a |-> <<>>, b |-> <<>>]",
                "lres": '[a |-> <<[r |-> "fail", by |-> 0]>>, b |-> <<>>]'}
    steps = explain.explain(_trace(("Initial predicate", aborting),
                                   ("ClientRoundTimerAbortAck", given_up)))
    (ms,) = steps[1].machine_steps
    assert (ms.source, ms.dest, ms.triggers) == ("aborting", "aborted", ())
    assert explain.NOT_IN_MODEL in ms.text()
