"""Named regions between two processes: pairing by name, whatever the order.

The producer (a spawned process) names its regions ``L<layer>.K`` / ``L<layer>.V`` in
layer order, K before V. The consumer (this process) lists the same names in another
order (layers reversed, V before K), with its memory laid out another way, so a
positional pairing would swap K and V and the layers. Every byte of every region is
checked. Names that do not match end the handshake on both sides, naming what differs.
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

LAYERS = 4
NB = 12
SLICE = 128  # bytes of one block in one region
BLOCK = 2 * LAYERS * SLICE
UNTOUCHED = 0xA5
NAMES = [f"L{layer}.{half}" for layer in range(LAYERS) for half in "KV"]


def fill(name: str, block: int) -> int:
    """The byte the producer holds in ``block``'s slice of region ``name``."""
    return (NAMES.index(name) * 37 + block * 11 + 1) % 251


def key(block: int) -> bytes:
    return f"block-{block}".encode()


def producer_main(conn: Connection) -> None:
    """A producer whose cache is ``(layers, 2, blocks, ...)``, passed per layer and K/V
    as named views; serves, and tells its sessions' deaths, until told to stop."""
    cache = torch.empty((LAYERS, 2, NB, SLICE // 2), dtype=torch.float16)
    regions = {f"L{layer}.{half}": cache[layer, h]
               for layer in range(LAYERS) for h, half in enumerate("KV")}
    for name, region in regions.items():
        raw = region.view(torch.uint8)
        for i in range(NB):
            raw[i].fill_(fill(name, i))

    def on_fetch(peer_id: str, fetch: FetchArrived) -> None:
        blocks = [int(k.decode().rpartition("-")[2]) for k in fetch.missing]
        node.supply(peer_id, fetch.kv_request_id, list(fetch.missing), blocks)

    node = Node(NodeConfig("tcp://127.0.0.1:0", NB, BLOCK, memory=regions), on_fetch=on_fetch)
    with node:
        conn.send(("ready", node.local_id))
        while True:
            node.serve(stop=conn.poll)
            if conn.recv()[0] == "stop":
                break
            conn.send(("deaths", {peer: (dead.reason, None if dead.mismatch is None
                                         else dead.mismatch.field)
                                  for peer, dead in node.deaths.items()}))


@pytest.fixture
def producer() -> Child:
    child = Child(producer_main, name="named-regions producer")
    try:
        yield child
    finally:
        child.stop()


def test_named_regions_in_another_order_exchange_the_right_bytes(producer: Child) -> None:
    _, peer = producer.expect("ready", 120)
    # Another layout of the same regions: one (blocks, regions, slice) tensor.
    order = [f"L{layer}.{half}" for layer in reversed(range(LAYERS)) for half in "VK"]
    whole = torch.full((NB, len(order), SLICE), UNTOUCHED, dtype=torch.uint8)
    regions = {name: whole[:, r] for r, name in enumerate(order)}
    wanted = {3: 0, 11: 1, 5: 9, 0: 11}  # producer block -> our block
    with Node(NodeConfig("127.0.0.1:0", NB, BLOCK, memory=regions)) as node:
        session = node.connect(f"tcp://{peer}")  # the same peer as "host:port"
        assert node.connect(peer) is session and node.session(f"tcp://{peer}") is session
        drive(node, lambda: session.ready or not session.alive, 60.0, "handshake")
        assert session.ready, node.deaths
        load = node.fetch(f"tcp://{peer}", "named-1", [key(b) for b in wanted],
                          list(wanted.values()))
        drive(node, load.done, 60.0, "the fetch's result")
        result = load.result()
        assert result.success and result.released, result
        node.finish(peer, "named-1")
    for src, dst in wanted.items():
        for r, name in enumerate(order):
            assert bool((whole[dst, r] == fill(name, src)).all()), (src, dst, name)
    others = [b for b in range(NB) if b not in wanted.values()]
    assert bool((whole[others] == UNTOUCHED).all())


def test_names_that_differ_end_the_handshake_on_both_sides(producer: Child) -> None:
    _, peer = producer.expect("ready", 120)
    names = [*NAMES[:-1], "L3.v"]  # one name spelt differently
    cache = torch.zeros((len(names), NB, SLICE), dtype=torch.uint8)
    with Node(NodeConfig("tcp://127.0.0.1:0", NB, BLOCK,
                         memory=dict(zip(names, cache, strict=True)))) as node:
        session = node.connect(peer)
        drive(node, lambda: not session.alive, 60.0, "the session's end")
        mismatch = node.deaths[peer].mismatch
        assert mismatch is not None and mismatch.field == "layout_names"
        assert "names the peer lacks: [L3.v]" in str(mismatch)
        assert "names we lack: [L3.V]" in str(mismatch)
        ours = node.local_id
    deaths = producer.request("deaths", reply="deaths", timeout=60)[1]
    reason, field = deaths[ours]
    assert field == "layout_names", deaths
    assert "names the peer lacks: [L3.V]" in reason and "names we lack: [L3.v]" in reason


def test_the_data_plane_pairs_named_regions_by_name() -> None:
    """Behind the session's check: the data plane refuses names that differ, and pairs
    the same names listed in another order."""
    def plane(name: str, names: list[str]) -> DataPlane:
        memory = {n: torch.zeros((NB, SLICE), dtype=torch.uint8) for n in names}
        return DataPlane(name, NB, BLOCK, memory=memory)

    with plane("named-a", NAMES) as a, plane("named-b", NAMES[::-1]) as b, \
            plane("named-c", [*NAMES[1:], "extra"]) as c:
        with pytest.raises(TransportError, match=r"lacks: \[extra\]; names we lack: "
                                                 r"\[L0.K\]"):
            c.add_peer("a", a.metadata, a.base_addr, NB, BLOCK, a.layout.wire(),
                       a.layout.names)
        assert c.peers == ()
        a.add_peer("b", b.metadata, b.base_addr, NB, BLOCK, b.layout.wire(), b.layout.names)
        assert a.peers == ("b",)
