"""Results that cannot be lost, asyncio, and the host's lookup pins: a real Node in this
process against a :func:`node_peers.peer_main` producer in a child process (ZeroMQ and
NIXL on 127.0.0.1). Every wait is bounded and names what it waited for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.aio import AsyncNode
from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import LocalProtocolError, TransportError
from p2pfsm.executor.node import LookupAnswer, Node, NodeConfig
from p2pfsm.executor.node.jobs import LookupAsk
from p2pfsm.session import FailReason, FetchArrived, LoadResult, StoreResult, Timeouts
from p2pfsm.tools.demo.host import fill_demo_region

from . import Child
from .node_peers import peer_main

needs_nixl_and_torch()

BLOCK = 4096
HELD = 16


def config(**kw: Any) -> NodeConfig:
    kw.setdefault("timeouts", Timeouts(load=20))
    return NodeConfig("tcp://127.0.0.1:0", 32, BLOCK, **kw)


def start_producer(children: list[Child], withhold: tuple[int, ...] = ()) -> tuple[Child, str]:
    child = Child(peer_main, config(), HELD, withhold, name="producer")
    children.append(child)
    _, peer_id = child.expect("ready", 60.0)
    return child, peer_id


def drive(node: Node, done: Callable[[], bool], timeout: float, what: str) -> None:
    if not node.run_until(done, timeout):
        raise AssertionError(f"no {what} within {timeout} s; deaths={dict(node.deaths)}")


def ready_node(peer_id: str) -> Node:
    node = Node(config())
    session = node.connect(peer_id)
    drive(node, lambda: session.ready or not session.alive, 30.0, "handshake")
    assert session.ready, dict(node.deaths)
    return node


def verify(node: Node, blocks: range, dest: range) -> None:
    for b, d in zip(blocks, dest, strict=True):
        assert bytes(node.region[d].numpy()) == demo_block(b, BLOCK), f"block {b} -> {d}"


def drive_all(nodes: tuple[Node, ...], done: Callable[[], bool], what: str) -> None:
    """Step every node of this process in turn until ``done()``; fail naming ``what``
    after 30 s (a bound no load reaches: the waits are for sub-second events)."""
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, f"no {what}"
        for n in nodes:
            n.step(0.005)


def keys(blocks: range) -> list[bytes]:
    return [demo_key(i) for i in blocks]


# ------------------------------------------------------------------ sync futures
def test_a_wait_with_nothing_driving_the_node_raises_instead_of_hanging(
        children: list[Child]) -> None:
    _, peer = start_producer(children)
    with ready_node(peer) as node:
        fut = node.fetch(peer, "r1", keys(range(4)), range(4))
        with pytest.raises(LocalProtocolError, match="would hang: nothing drives the node"):
            fut.result(timeout=5)
        with pytest.raises(LocalProtocolError, match="would hang"):
            fut.exception()
        drive(node, fut.done, 20.0, "load result")
        assert fut.result() == LoadResult(fut.result().job_id, "r1", True, True)
        verify(node, range(4), range(4))


def test_cancel_on_a_sync_fetch_finishes_the_request_and_the_result_still_comes(
        children: list[Child]) -> None:
    producer, peer = start_producer(children, withhold=(2,))
    with ready_node(peer) as node:
        fut = node.fetch(peer, "r1", keys(range(4)), range(4))
        # The producer heard the fetch and parked block 2: the round cannot finish.
        deadline = time.monotonic() + 20
        while not producer.conn.poll(0):
            assert time.monotonic() < deadline, "the producer never heard the fetch"
            node.step(0.02)
            assert not fut.done()
        assert producer.recv(1.0, "fetch report")[0] == "fetch"
        assert fut.cancel() is False
        assert not fut.cancelled()
        drive(node, fut.done, 15.0, "result of the cancelled fetch")
        res = fut.result()
        assert (res.success, res.released) == (False, True)  # aborted, and acknowledged
        assert res.reason is FailReason.FINISHED and res.detail.startswith(f"from {peer}: ")
        counters = node.metrics.snapshot()["counters"]
        assert counters["fetches_failed"] == counters["fetches_failed_finished"] == 1


# ---------------------------------------------------------------------- asyncio
def test_asyncio_fetch_cancel_mid_flight_still_delivers_the_final_result(
        children: list[Child]) -> None:
    producer, peer = start_producer(children, withhold=(5,))

    async def main() -> tuple[LoadResult, LoadResult, int]:
        loop = asyncio.get_running_loop()
        async with AsyncNode(config()) as anode:
            await anode.connect(peer, timeout=30)
            ok = await asyncio.wait_for(anode.fetch(peer, "good", keys(range(4)), range(4)),
                                        20)
            verify(anode.node, range(4), range(4))

            heard = asyncio.Event()
            loop.add_reader(producer.conn.fileno(), heard.set)
            try:
                handle = anode.fetch(peer, "stuck", keys(range(4, 8)), range(8, 12))
                task = asyncio.ensure_future(handle)
                await asyncio.wait_for(heard.wait(), 20)
            finally:
                loop.remove_reader(producer.conn.fileno())
            assert producer.recv(1.0, "fetch report")[0] == "fetch"
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            final = await asyncio.wait_for(handle.final, 15)
            return ok, final, anode.wakeups

    ok, final, wakeups = asyncio.run(main())
    assert ok.success and ok.released
    assert final.kv_request_id == "stuck"
    assert (final.success, final.released) == (False, True)
    assert wakeups > 0


def test_asyncio_connect_to_a_refused_address_raises_the_death_reason() -> None:
    async def main() -> None:
        async with AsyncNode(config()) as anode:
            with pytest.raises(TransportError, match="connection refused"):
                await anode.connect("127.0.0.1:1", timeout=10)

    asyncio.run(main())


def test_asyncio_node_after_aclose_says_it_is_closed_and_shows_its_metrics() -> None:
    heard: list[object] = []

    async def main() -> AsyncNode:
        async with AsyncNode(config(), on_result=lambda peer, r: heard.append(r)) as anode:
            with pytest.raises(TransportError):
                await anode.connect("127.0.0.1:1", timeout=10)
        return anode

    anode = asyncio.run(main())
    assert anode.metrics is anode.node.metrics and anode.node.on_result is not None

    async def after() -> None:
        with pytest.raises(LocalProtocolError, match="AsyncNode is closed"):
            await anode.connect("127.0.0.1:1", timeout=10)
        with pytest.raises(LocalProtocolError, match="node is closed"):
            await anode.lookup("127.0.0.1:1", "r", [b"k"])

    asyncio.run(after())


def test_an_idle_asyncio_node_wakes_at_its_idle_tick_not_continuously(
        children: list[Child]) -> None:
    _, peer = start_producer(children)

    async def main() -> int:
        async with AsyncNode(config()) as anode:
            await anode.connect(peer, timeout=30)
            # Let the post-handshake busy window end, then count wake-ups over an idle span.
            deadline = time.monotonic() + 30
            while anode.node.data.progress_interval_ms < 50:
                assert time.monotonic() < deadline, "the busy window never ended"
                await asyncio.sleep(0.05)
            before, t0 = anode.wakeups, time.monotonic()
            await asyncio.sleep(0.5)
            return int((anode.wakeups - before) / (time.monotonic() - t0))

    per_second = asyncio.run(main())
    # The idle tick is 50 ms (20/s); a loop spinning on the descriptor would be thousands.
    assert per_second < 100, per_second


# ----------------------------------------------------------------- lookup pins
class PinningHost:
    """A producer host whose lookup hits are pinned until their handle says so."""

    def __init__(self) -> None:
        self.index = {demo_key(i): i for i in range(HELD)}
        self.asks: list[LookupAsk] = []
        self.fetches: list[FetchArrived] = []
        self.unpinned: list[StoreResult] = []

    def on_lookup(self, _peer: str, ask: LookupAsk) -> LookupAnswer:
        self.asks.append(ask)
        ask.pins.add_done_callback(lambda f: self.unpinned.append(f.result()))
        return {k: self.index[k] for k in ask.keys if k in self.index}, ()

    def on_fetch(self, _peer: str, fetch: FetchArrived) -> None:
        self.fetches.append(fetch)


def test_lookup_pins_are_released_through_the_handle_given_to_on_lookup() -> None:
    host = PinningHost()
    producer = Node(config(), on_lookup=host.on_lookup, on_fetch=host.on_fetch)
    consumer = Node(config())
    nodes = (producer, consumer)

    def both(done: Callable[[], bool], what: str) -> None:
        drive_all(nodes, done, what)

    try:
        fill_demo_region(producer, HELD)
        session = consumer.connect(producer.local_id)
        both(lambda: session.ready, "handshake")
        probe = consumer.lookup(producer.local_id, "r1", keys(range(2, 6)))
        both(probe.done, "lookup answer")
        assert probe.result().hits == (True,) * 4
        (ask,) = host.asks
        assert not ask.pins.done()  # pinned until the round is over
        load = consumer.fetch(producer.local_id, "r1", keys(range(2, 6)), range(4))
        both(load.done, "load")
        assert load.result().success
        both(ask.pins.done, "pin release")
        assert ask.pins.result().success and host.unpinned == [ask.pins.result()]
        # The round was supplied by the lookup: on_fetch is told nothing is missing.
        assert [f.missing for f in host.fetches] == [()]
        for i in range(4):
            assert bytes(consumer.region[i].numpy()) == demo_block(2 + i, BLOCK)
    finally:
        for n in nodes:
            n.close(timeout=2.0)


# ------------------------------------------------------------ host callbacks that raise
class RaisingHost:
    """A producer host with bugs: its callbacks raise for requests named ``bad-*``, and
    ``on_result`` raises on every result (after noting it); ``stop`` asks the loop to end."""

    def __init__(self) -> None:
        self.index = {demo_key(i): i for i in range(HELD)}
        self.node: Node | None = None
        self.results: list[StoreResult] = []

    def on_fetch(self, peer: str, fetch: FetchArrived) -> None:
        if fetch.kv_request_id.startswith("bad"):
            raise RuntimeError(f"host bug on the fetch of {fetch.kv_request_id}")
        if fetch.kv_request_id == "stop":
            raise SystemExit("the host ends its loop")
        assert self.node is not None
        mine = list(fetch.missing)
        self.node.supply(peer, fetch.kv_request_id, mine, [self.index[k] for k in mine])

    def on_lookup(self, _peer: str, ask: LookupAsk) -> LookupAnswer:
        if ask.kv_request_id.startswith("bad"):
            raise ValueError(f"host bug on the lookup of {ask.kv_request_id}")
        return {k: self.index[k] for k in ask.keys if k in self.index}, ()

    def on_result(self, _peer: str, result: Any) -> None:
        self.results.append(result)
        raise RuntimeError("host bug on a result")


def test_host_callbacks_that_raise_fail_their_request_and_the_node_serves_on() -> None:
    """Each raising callback is counted and logged, fails only what it was about (the
    fetch: transfer_done(false); the lookup: every key a miss), and the producer's loop
    goes on: the next fetch on the same session is served and verified. A BaseException
    that is not an Exception (SystemExit) is the host asking the loop to end: it leaves."""
    host = RaisingHost()
    producer = Node(config(), on_lookup=host.on_lookup, on_fetch=host.on_fetch,
                    on_result=host.on_result)
    host.node = producer
    consumer = Node(config())
    nodes = (producer, consumer)

    def both(done: Callable[[], bool], what: str) -> None:
        drive_all(nodes, done, what)

    try:
        fill_demo_region(producer, HELD)
        session = consumer.connect(producer.local_id)
        both(lambda: session.ready, "handshake")
        peer = producer.local_id
        bad_load = consumer.fetch(peer, "bad-fetch", keys(range(0, 4)), range(4))
        both(bad_load.done, "the failed fetch's result")
        assert not bad_load.result().success
        bad_probe = consumer.lookup(peer, "bad-lookup", keys(range(4, 8)))
        both(bad_probe.done, "the failed lookup's answer")
        assert bad_probe.result().answered and bad_probe.result().hits == (False,) * 4
        good = consumer.fetch(peer, "good", keys(range(8, 12)), range(4, 8))
        both(good.done, "the next fetch")
        assert good.result().success and session.ready
        verify(consumer, range(8, 12), range(4, 8))
        both(lambda: len(host.results) == 1, "the supply's StoreResult")
        assert host.results[0].success
        assert producer.metrics.snapshot()["counters"]["host_errors"] == 3
        consumer.fetch(peer, "stop", keys(range(0, 1)), range(8, 9))
        with pytest.raises(SystemExit, match="ends its loop"):
            both(lambda: False, "the host's SystemExit")
    finally:
        for n in nodes:
            n.close(timeout=2.0)
