"""``p2pfsm bench --connect`` against a real ``p2pfsm serve`` (structure only, no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.serve_process import ServeProcess


def test_bench_connect_times_verified_fetches_and_reports_a_shape_not_served(
        tmp_path: Path) -> None:
    server = ServeProcess(tmp_path / "serve.log", blocks=4, block_len=4096)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "p2pfsm.tools.cli", "bench", "--connect", f"tcp://{server.addr}",
             "--shapes", "4x4KiB", "2x8KiB", "--repeat", "3", "--json", "-q"],
            capture_output=True, text=True, timeout=120, check=False)
        assert server.alive()
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    served = result["connect 4x4KiB"]
    assert len(served["times"]) == 3 and all(t > 0 for t in served["times"])
    assert served["failures"] == 0 and served["verify_failures"] == 0
    assert "block_len" in result["connect 2x8KiB"]["error"]  # the server holds 4 KiB blocks
