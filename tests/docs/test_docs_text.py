"""The pages say what is true now: no page under docs/ (nor README.md) names an issue
number, a work stop or a branch, and no hand-written page runs past ~400 lines.

How the project was made lives in git and CHANGELOG.md. The pages the docs build
generates from code and models (docs/reference/{api,cli,wire,models,cases}.md, git-ignored)
and the one ``p2pfsm diagrams`` writes (docs/machines.md) are exempt from the length
rule; they are checked for history all the same when present.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
GENERATED = {DOCS / "machines.md", *(DOCS / "reference" / f"{name}.md"
                                    for name in ("api", "cli", "wire", "models"))}
MAX_LINES = 400

HISTORY = re.compile(
    r"\bissues?\s*#?\d+"                              # issue 29, issues 10, issue #46
    r"|(?<![\w/&#])#\d{2,}\b"                          # #49820
    r"|\bPRs?\s*#?\d+"                                 # PR #52571
    r"|\bstops?\s+\d+"                                 # stop 38
    r"|\b(?:this|that|the last|the next|each|every) stop\b"
    r"|\bbranch(?:es)?\b",                             # branch `turnbatch`
    re.IGNORECASE)


def pages() -> list[Path]:
    found = [p for p in DOCS.rglob("*.md") if "_build" not in p.parts]
    return sorted([ROOT / "README.md", *found])


def history(text: str) -> list[str]:
    """Each line of ``text`` that names an issue, a stop or a branch, with its number."""
    return [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
            if HISTORY.search(line)]


@pytest.mark.parametrize("text", [
    "Issue 29 at its close", "see issue #46", "(stop 38, 2026-12-05)",
    "the targets at this stop", "Turn batching (branch `turnbatch`)", "vLLM #49820",
    "PR #52571 fixed it"])
def test_history_is_recognised(text: str) -> None:
    assert history(text), text


@pytest.mark.parametrize("text", [
    "A session stops at its deadline.", "the round's `abort_ack` (#abort)",
    "a fetch of 16 MiB", "[Limits](#limits)", "`p2pfsm serve --hold-back 12-15`",
    "the host stops serving after 10 s"])
def test_present_tense_text_passes(text: str) -> None:
    assert not history(text), text


def test_the_docs_exist() -> None:
    names = {p.relative_to(DOCS).as_posix() for p in pages() if p.is_relative_to(DOCS)}
    assert {"index.md", "tutorial.md", "machines.md"} <= names, sorted(names)
    assert any(n.startswith("howto/") for n in names)
    assert any(n.startswith("explanation/") for n in names)


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_names_an_issue_a_stop_or_a_branch(page: Path) -> None:
    found = history(page.read_text(encoding="utf-8"))
    assert not found, f"{page.relative_to(ROOT)} tells history (git and CHANGELOG.md keep it):\n" \
        + "\n".join(found)


@pytest.mark.parametrize("page", [p for p in pages() if p not in GENERATED],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_hand_written_page_is_over_400_lines(page: Path) -> None:
    lines = page.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{page.relative_to(ROOT)}: {lines} lines; split it"
