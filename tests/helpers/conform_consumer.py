"""What the consumer-role ``p2pfsm conform`` tests share: the consumer commands they
launch (``p2pfsm fetch`` and the scripted consumers of this folder), this checkout on
those subprocesses' ``PYTHONPATH``, and the conform call itself."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from p2pfsm.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = (" --connect tcp://{addr} --keys {keys} --mode {mode} --load-timeout "
           "{load_timeout} --abort-ack-timeout {abort_ack_timeout} --repeat {repeat}")
"""The ``--consumer-cmd`` placeholders ``p2pfsm fetch`` takes as options."""
FETCH = shlex.join([sys.executable, "-c", "from p2pfsm.tools.cli import main; "
                    "raise SystemExit(main())", "fetch"]) + OPTIONS


def helper_cmd(script: str) -> str:
    """The command that runs ``tests/helpers/<script>`` with this interpreter."""
    return shlex.join([sys.executable, str(ROOT / "tests" / "helpers" / script)])


def import_this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Have the consumer subprocesses import p2pfsm from this checkout."""
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + (os.pathsep + path if path else ""))


def conform_consumer(cmd: str, *extra: str) -> int:
    """``p2pfsm conform --role consumer`` of ``cmd`` (short window and deadline)."""
    return main(["conform", "--role", "consumer", "--consumer-cmd", cmd, "--window", "0.5",
                 "--deadline", "5", *extra])
