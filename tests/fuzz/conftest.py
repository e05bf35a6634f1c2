"""Fuzz suite setup: ``helpers`` importable, and the fuzz counts in the terminal summary."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from fuzz.stats import COUNTS  # noqa: E402


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    c = COUNTS
    if not (c.frames_decoded or c.session_inputs):
        return
    terminalreporter.section("p2pfsm fuzz")
    unchanged = ("all left the session unchanged" if not c.changed_by_rejection
                 else f"{c.changed_by_rejection} CHANGED THE SESSION")
    terminalreporter.write_line(
        f"fuzz: {c.frames_decoded} frames decoded, {c.session_inputs} session inputs, "
        f"{c.crashes} crashes, {c.rejected_frames} rejected frames {unchanged} "
        f"({c.answered_rejections} malformed fetches answered transfer_done(false))")
    terminalreporter.write_line(
        f"fuzz: decode rejected {c.decode_rejected}/{c.frames_decoded}; session inputs = "
        f"{c.session_frames} frames + {c.session_events} other events; "
        f"{c.rejected_host_calls} host calls raised LocalProtocolError and changed nothing; "
        f"slowest decode {c.max_decode_s * 1e3:.1f} ms; "
        f"largest traced decode peak {c.max_peak_bytes / 2**20:.1f} MiB")
