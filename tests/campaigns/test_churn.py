"""Churn campaign: one ``p2pfsm serve`` process, many fetches and many clients.

* back-to-back: one client Node, one session, N fetches in a row (4 blocks each, every
  byte verified);
* clients: N short-lived client Nodes one after the other, each connecting, fetching one
  verified block and closing.

The producer's open fds (``/proc/PID/fd``) and ``VmRSS`` are sampled after a warm-up
(two clients and 20 fetches: NIXL/UCX open some descriptors with the first remote agent
and keep them) and at the end. At the end the fd count must come back to the baseline
exactly within ``SETTLE_S`` (polled), and RSS stay within ``RSS_TOLERANCE``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.polling import poll_until
from helpers.requires import needs_nixl_and_torch
from helpers.serve_process import ServeProcess, fd_count, rss

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.executor.node import Node, NodeConfig

from .conftest import churn

needs_nixl_and_torch()

BLOCK = 4096
SERVED = 64
SETTLE_S = 15.0
RSS_TOLERANCE = 16 << 20
"""Bytes of VmRSS growth still counted as flat. The server keeps the last ``history``
(1000) ended sessions and per-request tombstones for ``Timeouts.tombstone``; glibc keeps
freed heap. Measured growth is printed in the summary (docs/explanation/reliability.md)."""


class Serve(ServeProcess):
    """``p2pfsm serve`` holding the demo blocks this campaign fetches."""

    def __init__(self, log: Path) -> None:
        super().__init__(log, SERVED, BLOCK)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    server = Serve(tmp_path / "serve.log")
    try:
        yield server
    finally:
        server.stop()


def client(num_blocks: int = 8) -> Node:
    return Node(NodeConfig("tcp://127.0.0.1:0", num_blocks, BLOCK, connect_timeout_ms=5000))


def connect(node: Node, peer: str) -> None:
    session = node.connect(peer)
    node.run_until(lambda: session.ready or not session.alive, 20.0)
    assert session.ready, node.deaths.get(peer)


def fetch_verified(node: Node, peer: str, rid: str, blocks: list[int]) -> None:
    fut = node.fetch(peer, rid, [demo_key(b) for b in blocks], range(len(blocks)))
    assert node.run_until(fut.done, 20.0), f"{rid}: no result"
    result = fut.result()
    assert result.success and result.released, f"{rid}: {result}"
    for d, b in enumerate(blocks):
        assert bytes(node.region[d].numpy()) == demo_block(b, BLOCK), f"{rid}: block {b}"


def one_client(peer: str, i: int) -> None:
    node = client()
    try:
        connect(node, peer)
        fetch_verified(node, peer, f"client-{i}", [i % SERVED])
    finally:
        node.close(timeout=2.0)


def warm_up(serve: Serve) -> tuple[int, int]:
    one_client(serve.addr, 0)
    one_client(serve.addr, 1)
    node = client()
    try:
        connect(node, serve.addr)
        for i in range(20):
            fetch_verified(node, serve.addr, f"warm-{i}", [i % SERVED])
    finally:
        node.close(timeout=2.0)
    return serve.steady_fds(), rss(serve.pid)


def flat(serve: Serve, base: tuple[int, int], what: str,
         report: Callable[[str], None], n: int, seconds: float) -> None:
    last = poll_until(lambda: (fd_count(serve.pid), rss(serve.pid)),
                      lambda r: r[0] == base[0] and r[1] <= base[1] + RSS_TOLERANCE,
                      SETTLE_S, "the producer's fds and RSS back", interval=0.1,
                      at_deadline="last")
    report(f"{n} {what} in {seconds:.1f} s, all verified; producer fds {base[0]} -> "
           f"{last[0]}, RSS {base[1] / 2**20:.1f} -> {last[1] / 2**20:.1f} MiB "
           f"(+{(last[1] - base[1]) / 2**20:.1f}, tolerance {RSS_TOLERANCE >> 20} MiB)")
    assert serve.proc.poll() is None, "the producer died"
    assert last[0] == base[0], f"producer fds {base[0]} -> {last[0]}"
    assert last[1] <= base[1] + RSS_TOLERANCE, f"producer RSS {base[1]} -> {last[1]}"


def back_to_back(serve: Serve, n: int, report: Callable[[str], None]) -> None:
    base = warm_up(serve)
    node = client()
    start = time.monotonic()
    try:
        connect(node, serve.addr)
        for i in range(n):
            fetch_verified(node, serve.addr, f"b2b-{i}", [(4 * i + k) % SERVED for k in range(4)])
        assert node.session(serve.addr).ready
        assert node.metrics.snapshot()["counters"]["fetches_succeeded"] == n
    finally:
        node.close(timeout=2.0)
    flat(serve, base, "back-to-back fetches on one session", report, n,
         time.monotonic() - start)


def clients(serve: Serve, n: int, report: Callable[[str], None]) -> None:
    base = warm_up(serve)
    start = time.monotonic()
    for i in range(n):
        one_client(serve.addr, i)
    flat(serve, base, "clients connecting, fetching and leaving", report, n,
         time.monotonic() - start)


def test_back_to_back_fetches(serve: Serve, campaign_report: Callable[[str], None]) -> None:
    back_to_back(serve, churn(slow=False), campaign_report)


def test_clients_come_and_go(serve: Serve, campaign_report: Callable[[str], None]) -> None:
    clients(serve, churn(slow=False), campaign_report)


@pytest.mark.slow
def test_back_to_back_fetches_long(serve: Serve,
                                   campaign_report: Callable[[str], None]) -> None:
    back_to_back(serve, churn(slow=True), campaign_report)


@pytest.mark.slow
def test_clients_come_and_go_long(serve: Serve, campaign_report: Callable[[str], None]) -> None:
    clients(serve, churn(slow=True), campaign_report)
