"""docs/reference/conformance.md keeps up with the suite: its case lists (one per role) name every
case with its description, and the p2pfsm report lists every case as passing (the
integration tests measure that against ``p2pfsm serve`` and ``p2pfsm fetch``)."""

from __future__ import annotations

import re
from pathlib import Path

from p2pfsm.conform.registry import CASES
from p2pfsm.conform.runner import cases_for

DOC = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "conformance.md").read_text()


def _section(title: str) -> str:
    start = DOC.index(title)
    end = DOC.find("\n## ", start + len(title))
    return DOC[start:] if end < 0 else DOC[start:end]


def test_the_case_list_is_the_registry() -> None:
    listed = [row for role in ("producer", "consumer")
              for row in re.findall(r"^\| `([^`]+)` \| (.+?) \| .+ \|$",
                                    _section(f"## Cases ({role} role)"), re.M)]
    assert [case for case, _ in listed] == list(CASES)
    for case, description in listed:
        assert description == CASES[case].description, case


def test_the_p2pfsm_report_passes_every_case() -> None:
    for role in ("producer", "consumer"):
        rows = re.findall(rf"^\| `([^`]+)` \| {role} \| (\S+) \|",
                          _section("## Report: p2pfsm"), re.M)
        assert dict(rows) == {c.id: "pass" for c in cases_for(role)}, role


def test_every_case_has_a_role_description_and_rule() -> None:
    for c in CASES.values():
        assert c.role in ("producer", "consumer") and c.description and c.rule, c.id
