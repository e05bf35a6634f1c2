"""Fan-out: ``consumers`` consumer processes fetch 256 x 64 KiB from one producer at once.

Each consumer is its own process with its own node (forked from one forkserver that has
imported torch and NIXL already, so that starting 16 costs one import). All connect and
warm up first; then, released together, each runs ``fetches`` fetches back to back,
zeroing its destination before and verifying every byte after each. The producer is
the transfer bench's peer process (one :class:`~p2pfsm.tools.demo.host.DemoServer`).
Aggregate GB/s = all bytes / (last fetch done - first fetch sent); latencies are over
every fetch of every consumer (p99 included).
"""

from __future__ import annotations

import contextlib
import time
from multiprocessing.connection import Connection
from typing import Any

from p2pfsm.errors import TransportError
from p2pfsm.tools.bench import nodes
from p2pfsm.tools.bench.nodes import Fetcher
from p2pfsm.tools.bench.peer import Peer
from p2pfsm.tools.bench.procs import Child
from p2pfsm.tools.bench.report import Progress, quantiles

__all__ = ["format_fanout", "run"]

_SHAPE = (256, 64 * 1024)
_MIB_PER_CONSUMER = 400  # resident memory of one consumer process (torch, NIXL, region)
_TIMEOUT = 300.0


def _wait(conn: Connection, node: Any, tag: str) -> None:
    """Step ``node`` until the parent sends ``tag``."""
    deadline = time.monotonic() + _TIMEOUT
    while time.monotonic() < deadline:
        node.step(0.01)
        if conn.poll(0):
            got = conn.recv()
            if got == tag:
                return
            raise TransportError(f"fan-out consumer: expected {tag!r}, got {got!r}")
    raise TransportError(f"fan-out consumer: no {tag!r} within {_TIMEOUT:.0f} s")


def _consumer_main(conn: Connection, peer_id: str, fetches: int) -> None:
    """One consumer: connect, warm up, say ready; on ``go`` fetch; report; on ``stop`` end."""
    from p2pfsm.executor.node import Node

    try:
        node = Node(nodes.config(*_SHAPE))
    except BaseException as exc:
        conn.send(("error", repr(exc)))
        return
    try:
        nodes.connect(node, peer_id, 60.0)
        fetcher = Fetcher(node, peer_id, _SHAPE[0], f"fan-{node.local_id}")
        for _ in range(2):
            fetcher.once()
        fetcher.verify()
        conn.send(("ready",))
        _wait(conn, node, "go")
        spans = []
        for _ in range(fetches):
            fetcher.clear()
            t0 = time.perf_counter()
            fut = fetcher.start()
            node.run_until(fut.done, 60.0)
            t1 = time.perf_counter()
            fetcher.check(fut)
            fetcher.verify()
            spans.append((t0, t1))
        conn.send(("done", spans))
        _wait(conn, node, "stop")
    except Exception as exc:  # reported to the parent, which fails the workload
        conn.send(("error", repr(exc)))
    finally:
        node.close()


def run(peer: Peer, consumers: int, fetches: int, say: Progress,
        memory_check: bool = True) -> dict[str, Any]:
    """The fan-out against ``peer`` (which then serves 256 x 64 KiB demo blocks); skipped
    when the memory available now would not hold the consumers, unless not
    ``memory_check``."""
    from p2pfsm.tools.demo.host import available_memory

    have = available_memory()
    if memory_check and have is not None and have < consumers * _MIB_PER_CONSUMER * 2**20 * 2:
        return {"consumers": consumers, "skipped": f"{have / 2**30:.1f} GiB available, "
                f"{consumers} consumers need about {consumers * _MIB_PER_CONSUMER * 2 / 1024:.1f}"}
    (_, peer_id) = peer.ask("node", *_SHAPE)
    t_start = time.monotonic()
    with contextlib.ExitStack() as stack:
        children = [stack.enter_context(
            Child(_consumer_main, f"p2pfsm-bench-consumer-{i}", (peer_id, fetches),
                  method="forkserver",
                  preload=("p2pfsm.executor.node", "torch", "p2pfsm.tools.bench.fanout")))
            for i in range(consumers)]
        deadline = time.monotonic() + _TIMEOUT
        for n, child in enumerate(children):
            child.expect("ready", deadline - time.monotonic())
            if n % 4 == 3:
                say(f"  fanout: {n + 1}/{consumers} consumers ready")
        setup_s = time.monotonic() - t_start
        for child in children:
            child.conn.send("go")
        spans = [span for child in children
                 for span in child.expect("done", deadline - time.monotonic())[1]]
        for child in children:
            child.conn.send("stop")  # each then ends, or is killed on the way out
    first = min(t0 for t0, _ in spans)
    last = max(t1 for _, t1 in spans)
    nbytes = len(spans) * _SHAPE[0] * _SHAPE[1]
    latencies = [t1 - t0 for t0, t1 in spans]
    return {"consumers": consumers, "fetches_each": fetches, "blocks": _SHAPE[0],
            "block_len": _SHAPE[1], "setup_s": setup_s, "span_s": last - first,
            "aggregate_gbps": nbytes / (last - first) / 1e9, "latency_ms": quantiles(latencies),
            "times_ms": sorted(t * 1e3 for t in latencies)}


def format_fanout(w: dict[str, Any]) -> str:
    if "skipped" in w:
        return f"fan-out of {w['consumers']} consumers: skipped: {w['skipped']}"
    q = w["latency_ms"]
    return "\n".join([
        f"{w['consumers']} consumers x {w['fetches_each']} fetches of 256 x 64 KiB from one "
        f"producer at once [load {w['load']:.1f}]:",
        f"  aggregate {w['aggregate_gbps']:.2f} GB/s over {w['span_s']:.2f} s; per fetch "
        f"{q['median']:.2f} ms (p10 {q['p10']:.2f}, p90 {q['p90']:.2f}, p99 {q['p99']:.2f}); "
        f"{w['consumers']} processes started and connected in {w['setup_s']:.1f} s"])
