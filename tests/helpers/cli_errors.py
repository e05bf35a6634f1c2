"""Check the CLI's answer to bad arguments: exit status 2 and one line on stderr."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from p2pfsm.tools.cli import main


def assert_bad_arguments(argv: Sequence[str], message: str,
                         capsys: pytest.CaptureFixture[str]) -> None:
    """``p2pfsm ARGV`` exits 2 (argparse's own errors included) with ``message`` in its
    one line of stderr."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
