"""The conformance docs keep up with the suite: the generated case lists (one per role,
docs/reference/cases.md) name every case with its description and rule, and the p2pfsm
report (docs/reference/conformance.md) lists every case as passing (the integration tests
measure that against ``p2pfsm serve`` and ``p2pfsm fetch``)."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

from p2pfsm.tools.conform.registry import CASES
from p2pfsm.tools.conform.runner import cases_for

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "reference" / "conformance.md").read_text()
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
CASES_PAGE = importlib.import_module("p2pfsm_docs").cases_page()


def _section(title: str, doc: str = DOC) -> str:
    start = doc.index(title)
    end = doc.find("\n## ", start + len(title))
    return doc[start:] if end < 0 else doc[start:end]


def test_the_case_list_is_the_registry() -> None:
    listed = [row for role in ("producer", "consumer")
              for row in re.findall(r"^\| `([^`]+)` \| (.+?) \| (.+) \|$",
                                    _section(f"## Cases ({role} role)", CASES_PAGE), re.M)]
    assert [case for case, _, _ in listed] == list(CASES)
    for case, description, rule in listed:
        assert description == CASES[case].description.replace("|", "\\|"), case
        assert rule == CASES[case].rule.replace("|", "\\|"), case


def test_the_p2pfsm_report_passes_every_case() -> None:
    for role in ("producer", "consumer"):
        rows = re.findall(rf"^\| `([^`]+)` \| {role} \| (\S+) \|",
                          _section("## Report: p2pfsm"), re.M)
        assert dict(rows) == {c.id: "pass" for c in cases_for(role)}, role


def test_every_case_has_a_role_description_and_rule() -> None:
    for c in CASES.values():
        assert c.role in ("producer", "consumer") and c.description and c.rule, c.id
