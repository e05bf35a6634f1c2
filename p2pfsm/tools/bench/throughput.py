"""``p2pfsm bench --suite throughput``: fetches per second per core at saturation.

``peers`` consumer nodes in this process, each keeping ``in_flight`` one-block fetches
of 4 KiB in flight on its session to the spawned peer process (one producer
DemoServer), refilled as they complete, until ``fetches`` have completed. CPU seconds
(user + system, all threads, ``/proc``) of each process over the window give the CPU
per fetch on each side; fetches per second per core = fetches / (both sides' CPU
seconds). Every result is checked; a failed fetch fails the suite.

How the consumer drives its nodes (``drive``): ``wait`` (the default) steps every node
until it has no news, then waits on the nodes' descriptors until one is readable or the
earliest node deadline, as a host's event loop does and as vLLM's client in the vLLM
row waits on its sockets between polls; ``spin`` calls ``step(0)`` on every node in a
tight loop, so the consumer's CPU is a whole core whatever the rate.
"""

from __future__ import annotations

import math
import os
import select
import time
from typing import Any

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.tools.bench import nodes as bench_nodes
from p2pfsm.tools.bench.nodes import Fetcher
from p2pfsm.tools.bench.peer import Peer
from p2pfsm.tools.bench.procstat import cpu_s
from p2pfsm.tools.bench.report import Progress

__all__ = ["format_throughput", "run"]

_SHAPE = (16, 4 * 1024)
_TIMEOUT = 300.0


DRIVES = ("wait", "spin")
_NEWS_TURNS = 64  # most step(0) calls per node before the loop looks at results again


def _step_all(nodes: list[Any], drive: str) -> None:
    """One pass over the nodes: ``spin`` steps each once; ``wait`` waits until a node's
    descriptor is readable or the earliest node deadline, then steps the nodes that are
    readable or due, each until it takes in nothing more (the descriptors are edge
    triggered)."""
    if drive == "spin":
        for node in nodes:
            node.step(0)
        return
    deadlines = [node.next_deadline() for node in nodes]
    fds = [node.fileno() for node in nodes]
    wait_s = max(0.0, min(deadlines) - time.monotonic())
    readable, _, _ = select.select(fds, [], [], math.ceil(wait_s * 1000) / 1000)
    now = time.monotonic()
    for node, due, fd in zip(nodes, deadlines, fds, strict=True):
        if due <= now or fd in readable:
            for _ in range(_NEWS_TURNS):
                if not node.step(0):
                    break


def _window(nodes: list[Any], fetchers: list[list[Fetcher]], fetches: int,
            drive: str = "wait") -> float:
    """Keep every fetcher busy until ``fetches`` complete; the wall seconds it took."""
    finished: list[tuple[int, int]] = []
    live: dict[tuple[int, int], Any] = {}

    def start(key: tuple[int, int]) -> None:
        fut = live[key] = fetchers[key[0]][key[1]].start()
        fut.add_done_callback(lambda _f: finished.append(key))

    for n, row in enumerate(fetchers):
        for j in range(len(row)):
            start((n, j))
    started = len(live)
    t0 = time.perf_counter()
    deadline = time.monotonic() + _TIMEOUT
    while live and time.monotonic() < deadline:
        if not finished:
            _step_all(nodes, drive)
        while finished:
            key = finished.pop()
            fetchers[key[0]][key[1]].check(live.pop(key))
            if started < fetches:
                start(key)
                started += 1
    if live:
        raise TransportError(f"throughput: {len(live)} fetches not done in {_TIMEOUT:.0f} s")
    return time.perf_counter() - t0


def run(peers: int = 4, in_flight: int = 16, fetches: int = 4000,
        progress: Progress | None = None, peer: Peer | None = None,
        drive: str = "wait") -> dict[str, Any]:
    """The saturation window of the module docstring, after a warm-up of one tenth."""
    from p2pfsm.executor.node import Node
    from p2pfsm.tools.bench.workloads import load_average

    if peers < 1 or not 1 <= in_flight <= _SHAPE[0] or fetches < peers * in_flight:
        raise ConfigError(f"throughput: need peers >= 1, 1 <= in flight <= {_SHAPE[0]}, "
                          f"fetches >= peers x in flight; got {peers}, {in_flight}, {fetches}")
    if drive not in DRIVES:
        raise ConfigError(f"throughput: drive is one of {DRIVES}, got {drive!r}")
    say = progress or (lambda _line: None)
    own = peer is None
    peer = peer or Peer()
    nodes: list[Any] = []
    try:
        (_, peer_id) = peer.ask("node", *_SHAPE)
        for _ in range(peers):
            nodes.append(Node(bench_nodes.config(*_SHAPE)))
            bench_nodes.connect(nodes[-1], peer_id)
        fetchers = [[Fetcher(node, peer_id, 1, f"t{n}-{j}", first=j) for j in range(in_flight)]
                    for n, node in enumerate(nodes)]
        say(f"  throughput: {peers} peers x {in_flight} in flight ({drive}), warm-up")
        _window(nodes, fetchers, max(peers * in_flight, fetches // 10), drive)
        say(f"  throughput: {fetches} fetches")
        load0 = load_average()
        mine0, theirs0 = cpu_s(os.getpid()), cpu_s(peer.pid)
        wall = _window(nodes, fetchers, fetches, drive)
        mine, theirs = cpu_s(os.getpid()) - mine0, cpu_s(peer.pid) - theirs0
        load = (load0 + load_average()) / 2
    finally:
        for node in nodes:
            node.close()
        if own:
            peer.stop()
    return {"impl": "p2pfsm" if drive == "wait" else f"p2pfsm/{drive}", "drive": drive,
            "peers": peers, "in_flight": in_flight, "fetches": fetches,
            "block_len": _SHAPE[1], "wall_s": wall, "fetches_per_s": fetches / wall,
            "consumer_cpu_us": mine / fetches * 1e6, "producer_cpu_us": theirs / fetches * 1e6,
            "per_core": fetches / (mine + theirs) if mine + theirs > 0 else float("nan"),
            "load": load}


def format_throughput(rows: list[dict[str, Any]]) -> str:
    """Rows of :func:`run` (one per implementation) as a text table."""
    lines = ["fetches of 1 x 4 KiB at saturation (many in flight, several peers; CPU from "
             "/proc over the window):",
             f"  {'impl':<11} {'peers':>5} {'in flight':>9} {'fetches':>7} {'fetch/s':>8} "
             f"{'us CPU consumer':>15} {'us CPU producer':>15} {'fetch/s/core':>12} "
             f"{'load':>5}"]
    for r in rows:
        lines.append(f"  {r['impl']:<11} {r['peers']:>5} {r['in_flight']:>9} {r['fetches']:>7} "
                     f"{r['fetches_per_s']:>8.0f} {r['consumer_cpu_us']:>15.1f} "
                     f"{r['producer_cpu_us']:>15.1f} {r['per_core']:>12.0f} {r['load']:>5.1f}")
    return "\n".join(lines)
