"""``p2pfsm demo``: a server process and a client, real ZeroMQ and NIXL on loopback.

Starts ``p2pfsm serve`` as a child process on a free port, then (in this process)
fetches blocks PD-style, looks blocks up and fetches the hits, fetches a block the
server does not hold (load timeout -> abort -> abort_ack), verifies every byte,
stops the server and reports.
"""

from __future__ import annotations

import subprocess
import sys
import time

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.session import Timeouts
from p2pfsm.tools.demo.host import check_region, require_data_plane, run_fetch


def start_server(
    blocks: int, block_len: int, timeout: float = 60.0
) -> tuple[subprocess.Popen[str], str]:
    """Start ``p2pfsm serve`` on a free loopback port; return it and its "host:port"."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "p2pfsm.tools.cli", "serve", "--bind", "tcp://127.0.0.1:0",
         "--blocks", str(blocks), "--block-len", str(block_len)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line or line.startswith("serving"):
            break
    if not line.startswith("serving"):
        stop_server(proc)
        raise TransportError(f"the server did not start (exit {proc.poll()})")
    return proc, line.rsplit("tcp://", 1)[1].strip()


def stop_server(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


def run_demo(blocks: int = 16, block_len: int = 65536) -> dict[str, object]:
    if not 1 <= blocks <= 64:
        raise ConfigError(f"--blocks: expected 1..64, got {blocks}")
    # Two regions of blocks + 8 (the server's and ours) on this machine.
    check_region(2 * (blocks + 8), block_len, what="--block-len")
    require_data_plane()
    from p2pfsm.executor.node import Node, NodeConfig

    proc, peer = start_server(blocks + 8, block_len)
    lines = [f"server process {proc.pid} serving on tcp://{peer}"]
    try:
        cfg = NodeConfig("tcp://127.0.0.1:0", num_blocks=blocks + 8, block_len=block_len,
                         timeouts=Timeouts(load=2.0, abort_ack=2.0))
        with Node(cfg) as node:
            pd = run_fetch(node, peer, list(range(blocks)), "pd", 30.0, "demo-pd")
            sym = run_fetch(node, peer, [blocks, blocks + 1, 10_000], "sym", 30.0, "demo-sym")
            miss = run_fetch(node, peer, [10_001], "pd", 30.0, "demo-abort")
    finally:
        code = stop_server(proc)
    lines += [
        f"pd fetch: {pd.keys} blocks x {block_len} B in {pd.seconds * 1000:.2f} ms, "
        f"verified={pd.verified}",
        f"lookup {sym.keys} keys -> {sym.hits} hits -> fetch: verified={sym.verified}",
        f"fetch of a block the server lacks: success={miss.success} ({miss.error})",
        f"server stopped (exit {code})",
    ]
    ok = pd.verified and sym.verified and sym.hits == 2 and not miss.success
    lines.append("result: " + ("OK" if ok else "FAILED"))
    return {"ok": ok, "pd": pd.__dict__, "sym": sym.__dict__, "abort": miss.__dict__,
            "lines": lines}
