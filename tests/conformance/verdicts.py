"""What a TLC run that must pass is checked for, in one place."""

from __future__ import annotations

from p2pfsm.tools.verify import tlc


def assert_passed(result: tlc.TlcResult) -> None:
    """No TLC error, no property violated, the search finished with nothing queued."""
    assert result.errors == ()
    assert result.violated is None, f"{result.violated}: {result.counterexample}"
    assert result.ok and result.left_on_queue == 0
