"""``p2pfsm bench --suite peers``: what connected, idle peers cost one ``p2pfsm serve``.

This process opens ``count`` client nodes (one block of 4 KiB each), connects each to a
fresh ``p2pfsm serve`` process (handshake time each), then leaves them idle, stepping
them now and then, while it reads the server's CPU time, open descriptors and resident
memory from ``/proc``: before any peer, in the first ``window_s`` after the peers are
ready, in the ``window_s`` after that (steady state), and in the ``window_s`` after every
client has closed.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from typing import Any

from p2pfsm.errors import TransportError
from p2pfsm.tools.bench import nodes as bench_nodes
from p2pfsm.tools.bench.procs import Command
from p2pfsm.tools.bench.procstat import cpu_s as _cpu_s
from p2pfsm.tools.bench.procstat import fds as _fds
from p2pfsm.tools.bench.procstat import rss as _rss
from p2pfsm.tools.bench.procstat import thread_cpu_s as _thread_cpu_s
from p2pfsm.tools.bench.report import Progress

__all__ = ["format_peers", "run"]


_ZMQ_IO: str = "ZMQbg/IO"  # libzmq names its I/O threads so (ZMTP heartbeats run there)


def _window(pid: int, seconds: float, nodes: list[Any]) -> tuple[float, float]:
    """Server CPU in % of a core over ``seconds``, all threads and libzmq's I/O threads
    alone, stepping ``nodes`` twice a second."""
    c0, z0, t0 = _cpu_s(pid), _thread_cpu_s(pid, _ZMQ_IO), time.monotonic()
    while time.monotonic() - t0 < seconds:
        for node in nodes:
            node.step(0)
        time.sleep(0.5)  # the clients' own pace does not matter here: the server's does
    span = time.monotonic() - t0
    return ((_cpu_s(pid) - c0) / span * 100,
            (_thread_cpu_s(pid, _ZMQ_IO) - z0) / span * 100)


def run(count: int = 128, window_s: float = 10.0,
        progress: Progress | None = None) -> dict[str, Any]:
    from p2pfsm.executor.node import Node

    say = progress or (lambda _line: None)
    proc = Command([sys.executable, "-m", "p2pfsm.tools.cli", "serve", "--bind", "tcp://127.0.0.1:0",
                    "--blocks", "1", "--block-len", "4096"], "p2pfsm serve")
    nodes: list[Any] = []
    try:
        line = proc.readline(time.monotonic() + 300)
        addr = line.rsplit("tcp://", 1)[1].strip()
        pid = proc.pid
        say(f"  peers: server idle with no peers for {window_s:g} s")
        alone, _ = _window(pid, window_s, [])
        fds0, rss0 = _fds(pid), _rss(pid)
        handshakes = []
        for i in range(count):
            node = Node(bench_nodes.config(1, 4096))
            nodes.append(node)
            with contextlib.suppress(TransportError):  # counted: connected < count
                handshakes.append(bench_nodes.connect(node, addr))
            if i % 32 == 31:
                say(f"  peers: {i + 1}/{count} connected")
        say(f"  peers: {count} idle peers, two windows of {window_s:g} s")
        first, _ = _window(pid, window_s, nodes)
        steady, steady_io = _window(pid, window_s, nodes)
        fds1, rss1 = _fds(pid), _rss(pid)
        for node in nodes:
            node.close(timeout=0.5)
        nodes.clear()
        after, _ = _window(pid, window_s, [])
    finally:
        for node in nodes:
            node.close(timeout=0.5)
        proc.stop()
    return {"count": count, "connected": len(handshakes), "window_s": window_s,
            "handshake_median_ms": statistics.median(handshakes) * 1e3 if handshakes else None,
            "cpu_alone": alone, "cpu_first": first, "cpu_steady": steady, "cpu_after": after,
            "cpu_steady_zmq_io": steady_io,
            "fds_per_peer": (fds1 - fds0) / count, "rss_per_peer_kib": (rss1 - rss0) / count / 1024}


def format_peers(r: dict[str, Any]) -> str:
    hs = r["handshake_median_ms"]
    return "\n".join([
        f"{r['count']} idle peers on one p2pfsm serve ({r['connected']} handshakes, median "
        f"{hs:.1f} ms)" if hs is not None else f"{r['count']} peers: no handshake",
        f"  server CPU [% of a core]: no peers {r['cpu_alone']:.2f}; first {r['window_s']:g} s "
        f"{r['cpu_first']:.2f}; steady {r['cpu_steady']:.2f} (libzmq I/O thread "
        f"{r['cpu_steady_zmq_io']:.2f}, ZMTP heartbeats); after they left "
        f"{r['cpu_after']:.2f}   (targets: < 2 total with peers, < 1 idle)",
        f"  per peer: {r['fds_per_peer']:.1f} fds, {r['rss_per_peer_kib']:.0f} KiB"])
