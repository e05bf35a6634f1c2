"""Caches laid out per layer, over real ZeroMQ and NIXL between two processes.

The producer is a spawned process whose KV cache is 32 layers, each a ``(2, blocks,
...)`` tensor with K and V apart: 64 regions. The consumer, in the test process, holds
the same geometry another way (one ``(blocks, 64, ...)`` tensor, each region a strided
view), so bases and strides differ while the slices pair up. Every byte of every region
is checked: the fetched blocks hold the producer's bytes, every other block is untouched.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.errors import TransportError
from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.executor.node import Node, NodeConfig
from p2pfsm.session import FetchArrived

from . import Child, drive

torch = needs_nixl_and_torch()

LAYERS = 32
REGIONS = 2 * LAYERS  # K and V apart
NB = 24
SLICE = 256  # bytes of one block in one region (64 float16 values)
BLOCK = REGIONS * SLICE
UNTOUCHED = 0x5A


def fill(region: int, block: int) -> int:
    """The byte the producer holds in ``block``'s slice of ``region``."""
    return (region * 37 + block * 11 + 1) % 251


def key(block: int) -> bytes:
    return f"block-{block}".encode()


def producer_main(conn: Connection) -> None:
    """A producer whose cache is a tensor per layer, K and V apart; serves until told."""
    layers = [torch.empty((2, NB, SLICE // 2), dtype=torch.float16) for _ in range(LAYERS)]
    regions = [layer[half] for layer in layers for half in range(2)]
    for r, region in enumerate(regions):
        raw = region.view(torch.uint8)
        for i in range(NB):
            raw[i].fill_(fill(r, i))

    def on_fetch(peer_id: str, fetch: FetchArrived) -> None:
        blocks = [int(k.decode().rpartition("-")[2]) for k in fetch.missing]
        node.supply(peer_id, fetch.kv_request_id, list(fetch.missing), blocks)

    node = Node(NodeConfig("tcp://127.0.0.1:0", NB, BLOCK, memory=regions),
                on_fetch=on_fetch)
    with node:
        conn.send(("ready", node.local_id, node.data.layout.wire() is not None))
        node.serve(stop=conn.poll)


@pytest.fixture
def producer() -> Child:
    child = Child(producer_main, name="per-layer producer")
    try:
        yield child
    finally:
        child.stop()


def test_a_fetch_moves_every_slice_of_every_layer(producer: Child) -> None:
    _, peer, sent_layout = producer.expect("ready", 120)
    assert sent_layout
    whole = torch.full((NB, REGIONS, SLICE), UNTOUCHED, dtype=torch.uint8)
    regions = [whole[:, r] for r in range(REGIONS)]  # strided: another layout, same slices
    wanted = {3: 0, 17: 1, 5: 9, 23: 22}  # producer block -> our block
    with Node(NodeConfig("tcp://127.0.0.1:0", NB, BLOCK, memory=regions)) as node:
        session = node.connect(peer)
        drive(node, lambda: session.ready or not session.alive, 60.0, "handshake")
        assert session.ready, node.deaths
        load = node.fetch(peer, "layers-1", [key(b) for b in wanted], list(wanted.values()))
        drive(node, load.done, 60.0, "the fetch's result")
        result = load.result()
        assert result.success and result.released, result
        node.finish(peer, "layers-1")
    for src, dst in wanted.items():
        for r in range(REGIONS):
            assert bool((whole[dst, r] == fill(r, src)).all()), (src, dst, r)
    others = [b for b in range(NB) if b not in wanted.values()]
    assert bool((whole[others] == UNTOUCHED).all())


def test_a_plain_node_and_a_per_layer_node_refuse_each_other(producer: Child) -> None:
    _, peer, _ = producer.expect("ready", 120)
    with Node(NodeConfig("tcp://127.0.0.1:0", NB, BLOCK)) as node:  # one plain region
        session = node.connect(peer)
        drive(node, lambda: not session.alive, 60.0, "the session's end")
        death = node.deaths[peer]
        assert death.mismatch is not None and death.mismatch.field == "layout"
        assert "64 regions of slices" in str(death.mismatch)
        assert "no layout field" in str(death.mismatch)


def test_the_data_plane_refuses_regions_that_do_not_pair_up() -> None:
    """Behind the session's check: a registration whose slices differ is refused."""
    def planes(name: str, count: int) -> DataPlane:
        memory = [torch.zeros((NB, 2 * SLICE // count), dtype=torch.uint8)
                  for _ in range(count)]
        return DataPlane(name, NB, 2 * SLICE, memory=memory)

    with planes("layouts-a", 2) as a, planes("layouts-b", 4) as b, \
            planes("layouts-c", 2) as c:
        wire = b.layout.wire()
        assert wire is not None
        with pytest.raises(TransportError, match=r"4 regions of slices .* ours is 2 regions"):
            a.add_peer("b", b.metadata, b.base_addr, NB, 2 * SLICE, wire)
        with pytest.raises(TransportError, match="one plain region, ours is 2 regions"):
            a.add_peer("b", b.metadata, b.base_addr, NB, 2 * SLICE)
        assert a.peers == ()
        a.add_peer("c", c.metadata, c.base_addr, NB, 2 * SLICE, c.layout.wire())
        assert a.peers == ("c",)


def test_a_peer_may_cost_as_many_descriptors_as_we_do_and_no_more() -> None:
    """``max_peer_blocks`` bounds descriptors (blocks x regions), floored at our own."""
    memory = [torch.zeros((NB, SLICE), dtype=torch.uint8) for _ in range(2)]
    with DataPlane("bound-a", NB, 2 * SLICE, memory=memory, max_peer_blocks=10) as a, \
            DataPlane("bound-b", NB, 2 * SLICE,
                      memory=[torch.zeros((NB, SLICE), dtype=torch.uint8)
                              for _ in range(2)]) as b:
        wire = b.layout.wire()
        assert wire is not None
        with pytest.raises(TransportError, match=f"num_blocks {NB + 1} x 2 regions exceeds "
                                                 f"{2 * NB}"):
            a.add_peer("b", b.metadata, b.base_addr, NB + 1, 2 * SLICE, wire)
        a.add_peer("b", b.metadata, b.base_addr, NB, 2 * SLICE, wire)
        assert a.peers == ("b",)
