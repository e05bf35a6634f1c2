"""A producer's host hears, through ``on_round_ended``, that a round it was asked to
supply ended without it, and a supply for a request the peer finished fails at once: two
nodes in this process over real ZeroMQ and NIXL on 127.0.0.1, stepped in turn; every
wait bounded; both nodes closed."""

from __future__ import annotations

from helpers.requires import needs_nixl_and_torch

from p2pfsm.demo_blocks import demo_key
from p2pfsm.executor.node import Node, NodeConfig
from p2pfsm.executor.node.jobs import LookupAsk
from p2pfsm.session import FailReason, FetchArrived, RoundEnded, Timeouts

from . import drive_nodes

needs_nixl_and_torch()

BLOCK = 4096


def test_the_producer_hears_that_an_aborted_round_ended() -> None:
    fetched: list[FetchArrived] = []
    ended: list[RoundEnded] = []
    # The host hears the fetch and never supplies: the consumer's load deadline aborts it.
    producer = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK),
                    on_fetch=lambda _peer, f: fetched.append(f),
                    on_round_ended=lambda _peer, e: ended.append(e))
    consumer = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, timeouts=Timeouts(load=0.5)))
    nodes = [producer, consumer]
    try:
        session = consumer.connect(producer.local_id)
        drive_nodes(nodes, lambda: session.ready or not session.alive, "handshake")
        load = consumer.fetch(producer.local_id, "re-1", [demo_key(1)], [0])
        drive_nodes(nodes, lambda: load.done() and bool(ended), "the load's end on both sides")
        assert [f.kv_request_id for f in fetched] == ["re-1"]
        assert ended == [RoundEnded("re-1", 0, False, "aborted")]
        result = load.result()
        assert result.reason is FailReason.TIMEOUT and result.released
    finally:
        for node in nodes:
            node.close(timeout=2.0)


def test_a_supply_after_the_peer_finished_the_request_fails_at_once() -> None:
    asks: list[LookupAsk] = []

    def on_lookup(_peer: str, ask: LookupAsk) -> tuple[dict[bytes, int], tuple[bytes, ...]]:
        asks.append(ask)
        return {demo_key(1): 1}, ()  # a hit, pinned until ask.pins resolves

    # Store deadline 30 s (the default): a parked supply would hold its pins that long.
    producer = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK), on_lookup=on_lookup)
    consumer = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK))
    nodes = [producer, consumer]
    try:
        session = consumer.connect(producer.local_id)
        drive_nodes(nodes, lambda: session.ready or not session.alive, "handshake")
        probe = consumer.lookup(producer.local_id, "pf-1", [demo_key(1)])
        drive_nodes(nodes, probe.done, "the lookup's answer")
        assert probe.result().hits == (True,)
        # The consumer finishes the request without fetching: its terminal fetch ends
        # the lookup's round on the producer, which releases the pins.
        consumer.finish(producer.local_id, "pf-1")
        drive_nodes(nodes, asks[0].pins.done, "the terminal fetch")
        assert asks[0].pins.result().reason is FailReason.NOT_SERVED
        late = producer.supply(consumer.local_id, "pf-1", [demo_key(1)], [1])
        assert late.done()  # refused in the call itself, not at the store deadline
        result = late.result()
        assert not result.success and result.reason is FailReason.NOT_SERVED
        assert "terminal fetch" in result.detail
        # Another request of the same peer is not affected: its supply waits for a fetch.
        other = producer.supply(consumer.local_id, "pf-2", [demo_key(2)], [2])
        load = consumer.fetch(producer.local_id, "pf-2", [demo_key(2)], [3])
        drive_nodes(nodes, lambda: load.done() and other.done(), "the other request's load")
        assert load.result().success and other.result().success
    finally:
        for node in nodes:
            node.close(timeout=2.0)
