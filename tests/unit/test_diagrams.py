"""``p2pfsm diagrams``: machine diagrams without label piles, the overview, the flows
recorded from the simulated world, and the freshness check of all of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from p2pfsm.fsm import input_table, machines
from p2pfsm.tools import diagram_flows, diagrams

WIRE = {"handshake": {"connect", "connect_ack"}, "pd": {"fetch", "transfer_done"},
        "demand": {"fetch", "transfer_done"}, "lookup_fetch": {"lookup", "lookup_resp",
                                                               "fetch", "transfer_done"},
        "abort": {"fetch", "abort_fetch", "abort_ack"},
        "finish": {"fetch", "abort_fetch", "abort_ack", "disconnect"}}


@pytest.mark.parametrize("name", sorted(machines()))
def test_one_arrow_per_state_pair_and_every_transition_drawn(name: str) -> None:
    spec = machines()[name]
    text = diagrams.to_mermaid(spec)
    pairs = re.findall(r"^    (\w+) --> (\w+) : (.*)$", text, re.MULTILINE)
    assert len(pairs) == len({(s, d) for s, d, _ in pairs}), "two arrows between one pair"
    assert all(s != d for s, d, _ in pairs), "a self-loop arrow (they belong in notes)"
    for t in spec.transitions:
        for source in t.sources:
            dest = t.dest_from(source)
            where = (next(lbl for s, d, lbl in pairs if (s, d) == (source, dest))
                     if dest != source else
                     text.split(f"note right of {source}\n", 1)[1].split("end note")[0])
            assert t.trigger in where, (source, t.trigger, dest)
            for action in t.actions:
                if action.startswith(("send_", "report_")):
                    assert action in where, (source, t.trigger, action)


def test_the_session_folds_its_live_states_shared_endings() -> None:
    spec = machines()["session"]
    assert diagrams.fold_group(spec) == ("live", spec.state_set("live"))
    text = diagrams.to_mermaid_folded(spec)
    assert text is not None and 'state "live" as fold_live {' in text
    folded = dict(re.findall(r"^    fold_live --> (\w+) : (.*)$", text, re.MULTILINE))
    assert set(folded) == {"dead", "ended", "closed"}
    assert "transport_lost" in folded["dead"] and "host_close" in folded["closed"]
    assert "recv_disconnect" in folded["ended"]
    assert not re.search(r"^ +(ready|awaiting_ack) --> closed", text, re.MULTILINE)


@pytest.mark.parametrize("name", sorted(machines()))
def test_the_folded_diagram_draws_every_transition_that_moves(name: str) -> None:
    spec = machines()[name]
    text = diagrams.to_mermaid_folded(spec)
    if text is None:
        assert diagrams.fold_group(spec) is None
        return
    group_name, group = diagrams.fold_group(spec) or ("", frozenset())
    arrows = re.findall(r"^ +(\w+) --> (\w+) : (.*)$", text, re.MULTILINE)
    assert len(arrows) == len({(s, d) for s, d, _ in arrows}), "two arrows between one pair"
    for t in spec.transitions:
        for source in t.sources:
            dest = t.dest_from(source)
            if dest == source:
                continue
            labels = [lbl for s, d, lbl in arrows
                      if d == dest and s in (source, f"fold_{group_name}")]
            assert any(t.trigger in lbl for lbl in labels), (source, t.trigger, dest)
            if source in group and dest not in group:
                assert source in text.split(" {\n", 1)[1].split("\n    }", 1)[0]


@pytest.mark.parametrize("flow", sorted(diagram_flows.FLOWS))
def test_each_flow_is_recorded_from_the_sessions(flow: str) -> None:
    events = diagram_flows.record(flow)
    frames = {e.text.split()[0] for e in events if e.kind == "frame"}
    assert WIRE[flow] <= frames, f"{flow}: frames {frames}"
    assert any(e.kind == "step" for e in events)
    text = diagram_flows.to_sequence(flow, events)
    assert text.startswith(f"%% flow {flow}:") and "\nsequenceDiagram\n" in text
    assert diagram_flows.to_sequence(flow, diagram_flows.record(flow)) == text  # stable


def test_the_overview_draws_each_row_of_the_input_table() -> None:
    text = diagrams.to_overview(machines())
    for name in machines():
        assert f"[{name}]" in text
    source = {"frame": "peer", "host": "host", "timer": "timers", "result": "plane",
              "transport": "plane"}
    for row in input_table().inputs:
        for machine in (row.machine, *dict(row.fanout)):
            line = next(x for x in text.splitlines() if x.endswith(f" {machine}")
                        and x.lstrip().startswith(source[row.kind] + " "))
            assert row.name in line.split('"')[1].split(", "), (row.kind, row.name, machine)


def test_the_page_embeds_every_diagram_in_mermaid_fences(tmp_path: Path) -> None:
    files = diagrams.render(machines(), tmp_path)
    page = files[tmp_path / "machines.md"]
    blocks = re.findall(r"```mermaid\n(.*?)```", page, re.DOTALL)
    folded = [n for n, spec in machines().items() if diagrams.to_mermaid_folded(spec)]
    assert folded and "session" in folded
    assert len(blocks) == 1 + len(diagram_flows.FLOWS) + len(machines()) + len(folded)
    assert sum(b.startswith("%% flow ") for b in blocks) == len(diagram_flows.FLOWS)
    assert sum(", folded:" in b.split("\n", 1)[0] for b in blocks) == len(folded)
    for name in folded:
        assert tmp_path / f"{name}.folded.mmd" in files


def test_check_finds_a_stale_page_and_a_stale_machine(tmp_path: Path) -> None:
    specs = machines()
    diagrams.write(specs, tmp_path)
    assert diagrams.stale(specs, tmp_path) == []
    page = tmp_path / "machines.md"
    page.write_text(page.read_text().replace("sequenceDiagram", "sequenceDiagram\n", 1))
    (tmp_path / "session.mmd").write_text("stale\n")
    assert sorted(diagrams.stale(specs, tmp_path)) == sorted([str(page),
                                                              str(tmp_path / "session.mmd")])
