"""What a node tells its operator: logs naming a rejected handshake field, metrics of
real fetches, and bounded history on a node whose peers keep dying. Real ZeroMQ and NIXL
on 127.0.0.1; the peer runs in a child process."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.demo_blocks import demo_key
from p2pfsm.executor.node import Node, NodeConfig
from p2pfsm.protocol import Connect, encode
from p2pfsm.session import DEFAULT_HASH_SEED, Timeouts

from . import Child
from .node_peers import peer_main

needs_nixl_and_torch()


def start_peer(children: list[Child], block_len: int) -> str:
    child = Child(peer_main, NodeConfig("tcp://127.0.0.1:0", 32, block_len), 16, (),
                  name="peer")
    children.append(child)
    return str(child.expect("ready", 60.0)[1])


def test_a_rejected_handshake_is_logged_with_the_field_and_counted(
        children: list[Child], caplog: pytest.LogCaptureFixture) -> None:
    peer = start_peer(children, block_len=8192)
    caplog.set_level(logging.INFO, logger="p2pfsm")
    with Node(NodeConfig("tcp://127.0.0.1:0", 32, 4096)) as node:
        session = node.connect(peer)
        assert node.run_until(lambda: not session.alive, 30), "the mismatch was not noticed"
        assert node.deaths[peer].mismatch is not None
        counters = node.metrics.snapshot()["counters"]
    rejected = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert rejected and "'block_len'" in rejected[0].getMessage(), caplog.text
    assert rejected[0].levelno == logging.WARNING and rejected[0].name == "p2pfsm.node"
    assert counters["handshakes_rejected"] == 1 and counters["deaths"] == 1
    assert counters["handshakes"] == 0


def test_metrics_count_real_fetches_and_time_them(children: list[Child]) -> None:
    peer = start_peer(children, block_len=4096)
    with Node(NodeConfig("tcp://127.0.0.1:0", 32, 4096, timeouts=Timeouts(load=1))) as node:
        session = node.connect(peer)
        assert node.run_until(lambda: session.ready or not session.alive, 30)
        loads = [node.fetch(peer, f"r{i}", [demo_key(i)], [i]) for i in range(3)]
        # The peer holds blocks 0..15 and never supplies 20: the load deadline aborts it.
        missing = node.fetch(peer, "gone", [demo_key(20)], [10])
        assert node.run_until(lambda: all(f.done() for f in (*loads, missing)), 30)
        assert all(f.result().success for f in loads) and not missing.result().success
        node.step(0)
        snap = node.metrics.snapshot()
        assert snap["gauges"] == {"peers": 1, "open_loads": 0, "open_stores": 0,
                                  "destinations_held": 0}
    c = snap["counters"]
    assert (c["fetches_started"], c["fetches_succeeded"], c["fetches_failed"]) == (4, 3, 1)
    assert c["fetches_failed_timeout"] == 1 and c["fetches_failed_peer_failed"] == 0
    assert c["fetch_bytes"] == 3 * 4096 and c["handshakes"] == 1
    assert c["results_dropped"] == 0 and c["aborts_sent"] == 1
    assert snap["histograms"]["fetch_seconds"]["count"] == 4
    assert snap["histograms"]["handshake_seconds"]["count"] == 1


def test_history_of_dead_peers_is_bounded_and_the_totals_kept() -> None:
    # reconnect_backoff_s=None: each refused session stays dead (no redial).
    with Node(NodeConfig("tcp://127.0.0.1:0", 8, 4096, history=2,
                         reconnect_backoff_s=None)) as node:
        peers = [f"127.0.0.1:{port}" for port in (1, 2, 3, 4)]  # nobody listens there
        for peer in peers:
            session = node.connect(peer)
            assert node.run_until(lambda s=session: not s.alive, 10), peer  # type: ignore[misc]
        assert list(node.deaths) == peers[-2:]
        assert all(d.reason == "transport lost: connection refused"
                   for d in node.deaths.values())
        assert len(node.sessions) <= 2
        assert node.metrics.snapshot()["counters"]["deaths"] == 4
        node.step(0)
        assert node.metrics.snapshot()["gauges"]["peers"] == 0


def test_a_session_past_its_violation_budget_is_closed_and_its_jobs_get_results() -> None:
    producer = Node(NodeConfig("tcp://127.0.0.1:0", 8, 4096, max_violations=3))
    consumer = Node(NodeConfig("tcp://127.0.0.1:0", 8, 4096, timeouts=Timeouts(load=30)))
    nodes = (producer, consumer)

    try:
        session = consumer.connect(producer.local_id)
        _until(nodes, lambda: session.ready and consumer.local_id in producer.sessions
                    and producer.sessions[consumer.local_id].ready, "handshake")
        load = consumer.fetch(producer.local_id, "r1", [demo_key(0)], [0])  # never supplied
        for k in range(3):
            assert consumer.control.send(producer.local_id, b"\xc1 not msgpack %d" % k)
        _until(nodes, lambda: len(producer.violations) == 3, "three rejected frames")
        assert producer.sessions[consumer.local_id].alive  # within the budget
        assert consumer.control.send(producer.local_id, b"\xc1 one too many")
        _until(nodes, lambda: not session.alive, "the producer's disconnect")
        _until(nodes, load.done, "the load's result")
        assert not load.result().success
        assert producer.metrics.snapshot()["counters"]["violation_closes"] == 1
        assert not producer.sessions[consumer.local_id].alive
    finally:
        for n in nodes:
            n.close(timeout=2.0)


def _pair(producer_idle: float | None, consumer_idle: float | None) -> tuple[Node, Node]:
    producer = Node(NodeConfig("tcp://127.0.0.1:0", 8, 4096, idle_timeout_s=producer_idle))
    consumer = Node(NodeConfig("tcp://127.0.0.1:0", 8, 4096, idle_timeout_s=consumer_idle))
    return producer, consumer


def _step_both(nodes: tuple[Node, Node], done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        for n in nodes:
            n.step(0.005)
    return done()


def _until(nodes: tuple[Node, Node], done: Callable[[], bool], what: str) -> None:
    """Step both nodes until ``done``, failing with ``what`` after 20 s."""
    assert _step_both(nodes, done, 20), f"no {what}"


def test_an_idle_inbound_session_is_evicted_and_the_consumer_can_reconnect() -> None:
    nodes = _pair(producer_idle=0.5, consumer_idle=None)
    producer, consumer = nodes
    try:
        session = consumer.connect(producer.local_id)
        assert _step_both(nodes, lambda: session.ready, 20), "handshake"
        assert _step_both(nodes, lambda: not session.alive, 10), "no eviction"
        assert producer.metrics.snapshot()["counters"]["idle_closes"] == 1
        again = consumer.connect(producer.local_id)
        assert again is not session
        assert _step_both(nodes, lambda: again.ready, 20), "no second handshake"
        load = consumer.fetch(producer.local_id, "r1", [demo_key(0)], [0])
        producer_session = producer.sessions[consumer.local_id]
        assert _step_both(nodes, lambda: producer_session.has_pending_work, 10)
        # Open work is never evicted, however long it waits.
        assert not _step_both(nodes, lambda: not producer_session.alive, 1.5)
        consumer.finish(producer.local_id, "r1")
        assert _step_both(nodes, load.done, 20)
    finally:
        for n in nodes:
            n.close(timeout=2.0)


def test_a_session_we_dialled_is_never_evicted_for_idleness() -> None:
    nodes = _pair(producer_idle=None, consumer_idle=0.3)
    producer, consumer = nodes
    try:
        session = consumer.connect(producer.local_id)
        assert _step_both(nodes, lambda: session.ready, 20), "handshake"
        assert not _step_both(nodes, lambda: not session.alive, 1.5)
        assert consumer.metrics.snapshot()["counters"]["idle_closes"] == 0
    finally:
        for n in nodes:
            n.close(timeout=2.0)


def test_frames_that_arrived_before_a_new_connect_go_to_the_old_session() -> None:
    """A burst [garbage x 40, connect] reaches the producer in one poll after its session
    to us was closed: the garbage belongs to the closed session, the connect opens a new
    one, and the new session must not be charged with the old one's frames (it was: the
    queue was routed by peer id when drained, after the connect had replaced the session)."""
    producer = Node(NodeConfig("tcp://127.0.0.1:0", 8, 4096, max_violations=2))
    consumer = Node(NodeConfig("tcp://127.0.0.1:0", 8, 4096))
    nodes = (producer, consumer)

    try:
        me = consumer.local_id
        session = consumer.connect(producer.local_id)
        _until(nodes, lambda: session.ready and me in producer.sessions
                    and producer.sessions[me].ready, "handshake")
        for k in range(3):  # over the budget of 2: the producer closes our session
            assert consumer.control.send(producer.local_id, b"\xc1 bad %d" % k)
        _until(nodes, lambda: not producer.sessions[me].alive, "the violation close")
        old = producer.sessions[me]
        hello = encode(Connect(me, consumer.data.metadata, consumer.data.base_addr, 8, 4096,
                               "", DEFAULT_HASH_SEED))
        for k in range(40):
            assert consumer.control.send(producer.local_id, b"\xc1 late %d" % k)
        assert consumer.control.send(producer.local_id, hello)
        deadline = time.monotonic() + 20
        while producer.sessions[me] is old:  # the connect came last: all 40 came before it
            assert time.monotonic() < deadline, "the burst did not arrive"
            producer.step(0.005)
        producer.step(0)
        assert producer.sessions[me].alive, "the new session was charged the old frames"
        assert producer.metrics.snapshot()["counters"]["violation_closes"] == 1
    finally:
        for n in nodes:
            n.close(timeout=2.0)
