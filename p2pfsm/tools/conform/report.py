"""The suite's report: JSON for machines, a Markdown table for docs, lines for a terminal."""

from __future__ import annotations

import json
from collections.abc import Sequence

from p2pfsm.tools.conform.verdict import CaseResult, Verdict

__all__ = ["as_json", "as_markdown", "failure_text", "summary_line"]


def as_json(target: str, command: str, results: Sequence[CaseResult]) -> str:
    """The whole run as one JSON document."""
    return json.dumps({"target": target, "command": command,
                       "summary": _counts(results),
                       "cases": [r.as_dict() for r in results]}, indent=2) + "\n"


def _counts(results: Sequence[CaseResult]) -> dict[str, int]:
    return {str(v): sum(r.verdict is v for r in results) for v in Verdict}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def as_markdown(target: str, command: str, results: Sequence[CaseResult]) -> str:
    """A Markdown table: case, role, verdict, time, what came (failures) or the note."""
    lines = [f"Target `{target}`, produced by `{command}`.", "",
             "| case | role | verdict | time | detail |", "|---|---|---|---|---|"]
    for r in results:
        detail = f"expected: {r.expected}; got: {r.got}" if r.verdict is Verdict.FAIL \
            else r.note
        if r.profile_expects:
            detail = f"differs by release; this profile: {r.profile_expects}. {detail}"
        lines.append(f"| `{r.case}` | {r.role} | {r.verdict} | {r.seconds:.2f} s | "
                     f"{_cell(detail)} |")
    c = _counts(results)
    lines += ["", f"{c['pass']} pass, {c['fail']} fail, {c['n/a']} not applicable."]
    return "\n".join(lines) + "\n"


def summary_line(r: CaseResult) -> str:
    """One line per case for the terminal."""
    extra = f" ({r.note})" if r.note else ""
    if r.profile_expects:
        extra += f" [differs by release; this profile: {r.profile_expects}]"
    return f"{r.verdict.upper():5} {r.case:28} {r.seconds:6.2f} s{extra}"


def failure_text(r: CaseResult, rerun: str) -> str:
    """A failure spelled out: the case, the rule, what came, how to re-run it alone."""
    account = f"\n{r.counterexample}" if r.counterexample else ""
    return (f"FAIL {r.case}: {r.description}\n  expected: {r.expected}\n"
            f"  got: {r.got}{account}\n  re-run: {rerun}")
