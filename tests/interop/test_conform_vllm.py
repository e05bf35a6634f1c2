"""``p2pfsm conform`` against a vLLM 0.33.0 node (``python -m p2pfsm.vllm.peer server``,
vLLM's own sessions): the suite runs, gives a verdict for every producer-role case,
and the cases vLLM fails are exactly those docs/conformance.md lists as its known
failures (a failure of vLLM is a finding, not a failure of this test; a change in
which cases fail is). The vLLM node must survive the suite and exit cleanly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_vllm_interop import (  # type: ignore[import-not-found]
    FP,
    ROOT,
    PeerProcess,
    _opt_in,  # noqa: F401  (the suite's opt-in, autouse here too)
    procs,  # noqa: F401  (fixture)
    start_vllm_server,
    stop_vllm_server,
)
from test_vllm_interop import pytestmark as _marks  # type: ignore[import-not-found]

from p2pfsm.cli import main
from p2pfsm.conform.registry import CASES

pytestmark = _marks

DOC = ROOT / "docs" / "conformance.md"
SECTION = "## Report: vLLM 0.33.0"


def documented_failures() -> tuple[set[str], set[str]]:
    """The case ids docs/conformance.md's vLLM report marks ``fail`` (always) and
    ``fail (race)`` (fails or passes, depending on timing inside vLLM)."""
    text = DOC.read_text()
    section = text[text.index(SECTION):]
    end = section.find("\n## ", len(SECTION))
    section = section if end < 0 else section[:end]
    always = set(re.findall(r"^\| `([^`]+)` \| producer \| fail \|", section, re.M))
    racy = set(re.findall(r"^\| `([^`]+)` \| producer \| fail \(race\) \|", section, re.M))
    return always, racy


def test_conform_against_vllm(procs: list[PeerProcess], tmp_path: Path,  # noqa: F811
                              capsys: pytest.CaptureFixture[str]) -> None:
    server, peer = start_vllm_server(procs, "--max-seconds", "400")
    report = tmp_path / "vllm.json"
    table = tmp_path / "vllm.md"
    rc = main(["conform", "--target", f"tcp://{peer}", "--fingerprint", FP,
               "--json", str(report), "--markdown", str(table)])
    out = capsys.readouterr()
    with capsys.disabled():
        print("\n" + table.read_text())  # the verdicts, recorded in the test log
    doc = json.loads(report.read_text())
    verdicts = {c["case"]: c["verdict"] for c in doc["cases"]}
    assert set(verdicts) == {c.id for c in CASES.values() if c.role == "producer"}
    assert set(verdicts.values()) <= {"pass", "fail"}, verdicts  # vLLM has a fingerprint
    failed = {case for case, v in verdicts.items() if v == "fail"}
    assert rc == (1 if failed else 0), out.err
    always, racy = documented_failures()
    assert always, "docs/conformance.md lists no vLLM failure: the parse is broken"
    assert always <= failed <= always | racy, (
        f"vLLM's failures changed: now {sorted(failed)}, documented {sorted(always)} "
        f"(and maybe {sorted(racy)})\n{out.err}")
    summary = stop_vllm_server(server)
    assert summary, server.tail()
