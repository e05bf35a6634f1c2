"""Skip a test that runs TLC where TLC cannot run."""

from __future__ import annotations

import shutil

import pytest

from p2pfsm.tools.verify import tlc


def require_tlc() -> None:
    """Skip unless java is on PATH and tla2tools.jar is found."""
    if shutil.which("java") is None:
        pytest.skip("TLC needs java on PATH")
    try:
        tlc.jar_path()
    except tlc.TlcNotFound as exc:
        pytest.skip(str(exc))
