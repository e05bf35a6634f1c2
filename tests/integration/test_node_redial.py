"""A producer killed and restarted on the same address, under a steady stream of
fetches: the consumer node opens its session again by itself (with backoff), fetches
issued meanwhile wait for it or fail with their reason, and every byte that arrives is
checked. A ``p2pfsm serve`` process (real ZeroMQ and NIXL on 127.0.0.1), stopped by its
PID; every wait bounded. And a restarted producer that connects to the consumer while
its redial waits: its session takes the redial's place, and a fetch that waited goes to
it at once (two nodes in this process).
"""

from __future__ import annotations

from pathlib import Path

from helpers.requires import needs_nixl_and_torch

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.executor.node import Node, NodeConfig
from p2pfsm.session import FailReason, Timeouts
from p2pfsm.tools.demo.host import DemoServer
from tests.helpers.serve_process import ServeProcess

from . import drive_nodes, free_port

needs_nixl_and_torch()

BLOCK = 4096
HELD = 16
WAIT_S = 60.0



def fetch_one(node: Node, peer: str, i: int) -> tuple[bool, FailReason | None]:
    """Fetch demo block i % HELD into block 0; check its bytes when it succeeds."""
    block = i % HELD
    fut = node.fetch(peer, f"req-{i}", [demo_key(block)], [0])
    assert node.run_until(fut.done, WAIT_S), f"fetch {i} got no result"
    result = fut.result()
    if result.success:
        assert bytes(node.region[0].numpy()) == demo_block(block, BLOCK), f"fetch {i}"
    else:
        assert result.reason is not None and result.detail, result
    return result.success, result.reason


def test_a_restarted_producer_is_found_again_and_no_result_is_lost(tmp_path: Path) -> None:
    port = free_port()
    peer = f"127.0.0.1:{port}"
    server = ServeProcess(tmp_path / "serve-1.log", HELD, BLOCK, port=port)
    # A short load deadline: a fetch that waits for the session is bounded by it.
    with Node(NodeConfig("tcp://127.0.0.1:0", 4, BLOCK, timeouts=Timeouts(load=3),
                         reconnect_backoff_s=(0.05, 0.5))) as node:
        try:
            session = node.connect(peer)
            assert node.run_until(lambda: session.ready or not session.alive, WAIT_S)
            before = [fetch_one(node, peer, i) for i in range(20)]
            assert all(ok for ok, _ in before), before
            server.kill()
            during = [fetch_one(node, peer, 100 + i) for i in range(5)]
            assert not any(ok for ok, _ in during)  # nobody there: each fails, with why
            assert {why for _, why in during} == {FailReason.SESSION_ENDED}
            server = ServeProcess(tmp_path / "serve-2.log", HELD, BLOCK, port=port)
            after = [fetch_one(node, peer, 200 + i) for i in range(40)]
        finally:
            server.stop()
    # The node found the new producer by itself: the stream succeeds again.
    assert any(ok for ok, _ in after), after
    first = next(i for i, (ok, _) in enumerate(after) if ok)
    assert all(ok for ok, _ in after[first:]), after
    counters = node.metrics.snapshot()["counters"]
    assert counters["redials"] >= 1 and counters["results_dropped"] == 0


def test_a_restarted_peer_that_connects_first_takes_the_pending_redials_place() -> None:
    """A redial is pending (its first attempt was refused, the next is a minute away)
    when the restarted producer connects to us: its session replaces the redial at once,
    and the fetch that waited goes to it. Two nodes in this process, stepped in turn."""
    port = free_port()
    peer = f"127.0.0.1:{port}"
    # Fetches wait up to 30 s (Timeouts.load), the redial after a failed attempt 60 s:
    # within the 20 s bound below, only the peer's own session can serve the fetch.
    consumer = Node(NodeConfig("tcp://127.0.0.1:0", 4, BLOCK, timeouts=Timeouts(load=30),
                               reconnect_backoff_s=(60.0, 60.0)))
    nodes = [consumer, DemoServer(NodeConfig(f"tcp://{peer}", HELD, BLOCK)).node]
    try:
        session = consumer.connect(peer)
        drive_nodes(nodes, lambda: session.ready or not session.alive, "handshake", WAIT_S)
        assert session.ready, consumer.deaths.get(peer)
        nodes.pop().close(timeout=2.0)  # the producer goes; nobody listens on its port
        # The node opens the session again at once; that attempt fails, the next waits.
        drive_nodes(nodes, lambda: (consumer.metrics.snapshot()["counters"]["redials"] == 1
                              and consumer.sessions[peer] is not session
                              and not consumer.sessions[peer].alive),
              "failed redial", WAIT_S)
        fut = consumer.fetch(peer, "meanwhile", [demo_key(3)], [0])
        assert not fut.done()  # it waits for a session
        nodes.append(DemoServer(NodeConfig(f"tcp://{peer}", HELD, BLOCK)).node)
        nodes[-1].connect(consumer.local_id)  # the restarted producer dials us first
        drive_nodes(nodes, fut.done, "result of the fetch that waited", 20.0)
        result = fut.result()
        assert result.success, result
        assert bytes(consumer.region[0].numpy()) == demo_block(3, BLOCK)
        assert consumer.sessions[peer].ready
        counters = consumer.metrics.snapshot()["counters"]
        assert counters["redials"] == 1 and counters["results_dropped"] == 0, counters
    finally:
        for node in nodes:
            node.close(timeout=2.0)
