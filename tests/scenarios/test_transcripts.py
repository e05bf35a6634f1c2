"""Replay every datadriven transcript (``testdata/*.txt``) over two real sessions.

How to read and write them: tests/helpers/transcript.py. ``pytest
tests/scenarios/test_transcripts.py --rewrite`` (or ``P2PFSM_REWRITE=1``) writes what
the code now renders into the files; commit only a diff you understand.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.transcript import TranscriptError, check, parse, replay, rewriting

TESTDATA = Path(__file__).resolve().parent / "testdata"
FILES = sorted(TESTDATA.glob("*.txt"))


def test_there_are_transcripts() -> None:
    assert len(FILES) >= 7


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_transcript(path: Path, request: pytest.FixtureRequest) -> None:
    check(path, rewrite=rewriting() or bool(request.config.getoption("--rewrite")))


def _corrupt(text: str) -> str:
    """``text`` with the first step line of an expected block changed."""
    lines = text.split("\n")
    i = next(i for i, line in enumerate(lines) if line.startswith("  step "))
    lines[i] = lines[i].replace("->", "-> nowhere", 1)
    return "\n".join(lines)


def test_a_corrupted_expected_block_fails_with_a_readable_diff(tmp_path: Path) -> None:
    good = (TESTDATA / "pd_round.txt").read_text()
    bad = tmp_path / "pd_round.txt"
    bad.write_text(_corrupt(good))
    with pytest.raises(AssertionError) as failed:
        check(bad)
    message = str(failed.value)
    assert "--- pd_round.txt (expected)" in message and "+++ pd_round.txt (actual)" in message
    removed = [x for x in message.splitlines() if x.startswith("-  step ")]
    added = [x for x in message.splitlines() if x.startswith("+  step ")]
    assert len(removed) == len(added) == 1 and "nowhere" in removed[0]
    assert bad.read_text() == _corrupt(good)  # a check never writes


def test_rewrite_restores_the_expected_blocks(tmp_path: Path) -> None:
    good = (TESTDATA / "pd_round.txt").read_text()
    bad = tmp_path / "pd_round.txt"
    bad.write_text(_corrupt(good))
    check(bad, rewrite=True)
    assert bad.read_text() == good


def test_comments_and_blank_lines_survive_a_replay() -> None:
    text = "# a story\n\nstart a\n----\nstale\n\n# the end\n"
    assert replay(text).startswith("# a story\n\nstart a\n----\na <- host start\n")
    assert replay(text).endswith("\n\n# the end\n")


@pytest.mark.parametrize(("text", "message"), [
    ("start a\nnot a separator\n", "expected '----'"),
    ("launch a\n----\n", "unknown directive 'launch'"),
    ("fetch c r1 8\n----\n", "unknown node 'c'"),
    ("start\n----\n\nworld\n----\n", "'world' must be the first directive"),
    ("deliver a\n----\n", "nothing queued from a"),
])
def test_a_bad_transcript_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(TranscriptError, match=message):
        replay(text)


def test_parse_keeps_each_expected_block() -> None:
    _lines, blocks = parse("start a\n----\nx\ny\n\nstate\n----\n")
    assert [(b.directive.name, b.expected) for b in blocks] == [("start", ["x", "y"]),
                                                                  ("state", [])]
