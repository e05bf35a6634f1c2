"""A producer's session dies while its WRITE is stalled: the pins it reads stay held.

The consumer is a spawned node; the producer is a node in this process whose host
supplies only once the consumer is frozen (SIGSTOP). The WRITE then stays running (the
first WRITE to a peer needs the target to progress), and the producer's session dies
when ZeroMQ's heartbeat finds the consumer silent. The supply's StoreResult (what tells
the host it may reuse the source blocks) must not come while the WRITE may still read
them: only after the consumer is resumed and the WRITE has ended. Every wait bounded,
the consumer stopped by its PID.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from multiprocessing.connection import Connection

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.executor.node import Node, NodeConfig
from p2pfsm.executor.node.jobs import JobFuture
from p2pfsm.session import FetchArrived, StoreResult

from . import Child, drive

needs_nixl_and_torch()

BLOCK = 4096
KEY = b"stalled-key"


def consumer_main(conn: Connection, producer_id: str) -> None:
    """Connects, says when ready, fetches KEY into block 0 when told; runs its loop."""
    with Node(NodeConfig("tcp://127.0.0.1:0", 4, BLOCK)) as node:
        session = node.connect(producer_id)
        told = False
        while True:
            node.step(0.01)
            if session.ready and not told:
                conn.send(("ready",))
                told = True
            if conn.poll(0):
                cmd = conn.recv()
                if cmd[0] == "stop":
                    return
                if cmd[0] == "fetch":
                    node.fetch(producer_id, "stalled-1", [KEY], [0])
                    conn.send(("fetching",))


@pytest.fixture
def producer() -> Iterator[Node]:
    # A short ZMTP heartbeat, so the frozen consumer's connection is dropped soon.
    node = Node(NodeConfig("tcp://127.0.0.1:0", 4, BLOCK, heartbeat_ivl_ms=100,
                           heartbeat_timeout_ms=300))
    try:
        yield node
    finally:
        node.close(timeout=2.0)


def test_a_dead_sessions_stalled_write_keeps_its_pins_until_it_ends(producer: Node) -> None:
    fetches: list[tuple[str, FetchArrived]] = []
    producer.on_fetch = lambda peer, f: fetches.append((peer, f))
    child = Child(consumer_main, producer.local_id, name="frozen consumer")
    try:
        drive(producer, child.conn.poll, 60.0, "the consumer's handshake")
        child.expect("ready", 1.0)
        child.send("fetch")
        drive(producer, lambda: bool(fetches), 60.0, "the consumer's fetch")
        child.expect("fetching", 10.0)
        os.kill(child.pid, signal.SIGSTOP)

        peer, fetch = fetches[0]
        store: JobFuture[StoreResult] = producer.supply(peer, fetch.kv_request_id, [KEY], [2])
        assert producer.data.in_flight == 1, "the WRITE to a frozen new peer did not stall"
        session = producer.session(peer)
        drive(producer, lambda: not session.alive, 60.0, "the heartbeat's verdict on the consumer")
        assert peer not in producer.data.peers  # the dead session's peer is removed ...
        for _ in range(20):
            producer.step(0)
        assert producer.data.in_flight == 1  # ... but its WRITE still runs,
        assert not store.done()  # so the source block stays pinned

        os.kill(child.pid, signal.SIGCONT)
        drive(producer, store.done, 60.0, "the StoreResult once the consumer is resumed")
        assert producer.data.in_flight == 0
        result = store.result()
        assert result.job_id > 0
    finally:
        child.stop()
