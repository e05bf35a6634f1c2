"""Benchmark: fetches of a cache laid out per layer, against the raw WRITE of the same
descriptors and against the same bytes in one plain region.

Two processes on 127.0.0.1: this one (the consumer node) and a spawned producer node.
For each layout (one plain region of ``block_len``-byte blocks, and ``L`` layers with K
and V apart, i.e. ``2L`` regions of ``block_len / 2L``-byte slices) both nodes register
that layout, and rounds interleave:

* ``raw``: the producer's data plane WRITEs every block into the same blocks of ours
  (``DataPlane.write``, the same descriptor lists a fetch uses: one per block-slice),
  polling in a tight loop, while this node runs its loop as it does while it expects
  blocks;
* ``fetch``: one fetch of every block through the two nodes (fetch frame, the producer's
  supply, one WRITE, transfer_done), every byte checked once before timing.

The ratios: fetch / raw of the same layout (the protocol's cost over the transport's),
and the per-layer fetch / the plain fetch (what the slices cost). Medians over rounds.
"""

from __future__ import annotations

import statistics
import time
from multiprocessing.connection import Connection
from typing import Any

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.tools.bench import nodes
from p2pfsm.tools.bench.procs import Child
from p2pfsm.tools.bench.report import Progress

__all__ = ["format_layouts", "run"]


_BLOCKS = 256
_BLOCK_LEN = 64 * 1024
_LAYERS = (0, 8, 32)  # 0: the plain region
_REPLY_TIMEOUT = 60.0


def _regions(layers: int, fill: bool) -> list[Any]:
    """The memory of a node: one ``(blocks, block_len)`` tensor (``layers == 0``), or a
    ``(2, blocks, slice)`` tensor per layer split into K and V regions (views, which keep
    their tensors alive). With ``fill``, block ``i``'s bytes in region ``r`` are
    ``(i * 7 + r) % 251``."""
    import torch

    if layers == 0:
        regions = [torch.zeros((_BLOCKS, _BLOCK_LEN), dtype=torch.uint8)]
    else:
        per = _BLOCK_LEN // (2 * layers)
        tensors = [torch.zeros((2, _BLOCKS, per), dtype=torch.uint8) for _ in range(layers)]
        regions = [t[half] for t in tensors for half in range(2)]
    if fill:
        for r, region in enumerate(regions):
            for i in range(_BLOCKS):
                region[i].fill_((i * 7 + r) % 251)
    return regions


def _memory(layers: int, regions: list[Any]) -> Any:
    return regions[0] if layers == 0 else regions


def _producer_main(conn: Connection) -> None:
    """One producer node at a time, per the layout asked for; raw WRITEs on demand."""
    from p2pfsm.executor.node import Node
    from p2pfsm.session import FetchArrived

    node: Node | None = None

    def on_fetch(peer_id: str, fetch: FetchArrived) -> None:
        assert node is not None
        blocks = [int.from_bytes(k, "big") for k in fetch.missing]
        node.supply(peer_id, fetch.kv_request_id, list(fetch.missing), blocks)

    conn.send(("ready",))
    try:
        while True:
            if node is not None:
                node.step(0.005)
                if not conn.poll(0):
                    continue
            cmd = conn.recv()
            if cmd[0] == "stop":
                return
            if cmd[0] == "node":
                if node is not None:
                    node.close()
                layers = cmd[1]
                regions = _regions(layers, fill=True)
                node = Node(nodes.config(_BLOCKS, _BLOCK_LEN, memory=_memory(layers, regions)),
                            on_fetch=on_fetch)
                conn.send(("node", node.local_id))
            elif cmd[0] == "raw":
                assert node is not None
                blocks = list(range(_BLOCKS))
                t0 = time.perf_counter()
                xfer = "raw"  # the node's own WRITEs are named (session, xfer)
                node.data.write(xfer, cmd[1], blocks, blocks)
                while xfer not in (done := dict(node.data.poll())):
                    if time.perf_counter() - t0 > _REPLY_TIMEOUT:
                        raise TransportError("raw WRITE: no outcome within 60 s")
                elapsed = time.perf_counter() - t0
                if not done[xfer]:
                    raise TransportError("raw WRITE failed")
                conn.send(("raw", elapsed))
    finally:
        if node is not None:
            node.close()


def _one_layout(producer: Child, layers: int, rounds: int) -> dict[str, Any]:
    from p2pfsm.executor.node import Node

    (_, peer_id) = producer.ask("node", layers)
    regions = _regions(layers, fill=False)
    keys = [i.to_bytes(8, "big") for i in range(_BLOCKS)]
    blocks = list(range(_BLOCKS))
    with Node(nodes.config(_BLOCKS, _BLOCK_LEN, memory=_memory(layers, regions))) as node:
        nodes.connect(node, peer_id)

        def fetch(n: int) -> float:
            t0 = time.perf_counter()
            load = node.fetch(peer_id, f"layouts-{layers}-{n}", keys, blocks)
            node.run_until(load.done, 30.0)
            elapsed = time.perf_counter() - t0
            if not load.done() or not load.result().success:
                raise TransportError(f"bench fetch failed: "
                                     f"{load.result() if load.done() else 'no result'}")
            return elapsed

        def paced() -> None:  # the target as a node that expects inbound writes
            node.data.expect_inbound(0.05, prompt=True)
            node.step(0.001)

        for n in range(3):
            fetch(-1 - n)
        for r, region in enumerate(regions):
            want = [(i * 7 + r) % 251 for i in range(_BLOCKS)]
            got = region[:, 0].tolist()
            if got != want or not bool((region == region[:, :1]).all()):
                raise TransportError(f"bench: region {r} holds wrong bytes after a fetch")
        producer.ask("raw", node.local_id, pump=paced)
        raw: list[float] = []
        fetched: list[float] = []
        for n in range(rounds):
            raw.append(producer.ask("raw", node.local_id, pump=paced)[1])
            fetched.append(fetch(n))
    raw_ms = statistics.median(raw) * 1e3
    fetch_ms = statistics.median(fetched) * 1e3
    return {"layers": layers, "regions": 1 if layers == 0 else 2 * layers,
            "slice_len": _BLOCK_LEN if layers == 0 else _BLOCK_LEN // (2 * layers),
            "raw_ms": raw_ms, "fetch_ms": fetch_ms, "ratio": fetch_ms / raw_ms,
            "rounds": rounds}


def run(rounds: int = 20, layers: tuple[int, ...] = _LAYERS,
        progress: Progress | None = None) -> dict[str, Any]:
    """Each layout's medians (raw WRITE, fetch) and ratios; see the module docstring."""
    if rounds < 2 or 0 not in layers or any(n < 0 or _BLOCK_LEN % (2 * n or 1) for n in layers):
        raise ConfigError(f"bench layouts: need rounds >= 2, the plain layout (0) and layer "
                          f"counts that split {_BLOCK_LEN} bytes evenly; got {rounds}, {layers}")
    say = progress or (lambda _line: None)
    t0 = time.monotonic()
    rows = []
    with Child(_producer_main, "p2pfsm-bench-layouts") as producer:
        producer.expect("ready", _REPLY_TIMEOUT)
        for n in layers:
            say(f"layouts: {_BLOCKS} x {_BLOCK_LEN // 1024} KiB as "
                f"{'one plain region' if n == 0 else f'{n} layers x K/V'}, {rounds} rounds")
            rows.append(_one_layout(producer, n, rounds))
    plain = next(row for row in rows if row["layers"] == 0)
    for row in rows:
        row["vs_plain"] = row["fetch_ms"] / plain["fetch_ms"]
    return {"blocks": _BLOCKS, "block_len": _BLOCK_LEN, "rows": rows,
            "wall_s": time.monotonic() - t0}


def format_layouts(result: dict[str, Any]) -> str:
    """The result of :func:`run` as a small text table."""
    lines = [f"fetch of {result['blocks']} x {result['block_len'] // 1024} KiB by layout "
             f"(medians; raw: the producer's WRITE of the same descriptors):",
             f"{'layout':<24} {'slice':>8} {'raw ms':>8} {'fetch ms':>9} {'fetch/raw':>10} "
             f"{'vs plain':>9}"]
    for row in result["rows"]:
        name = ("one plain region" if row["layers"] == 0
                else f"{row['layers']} layers x K/V ({row['regions']})")
        lines.append(f"{name:<24} {row['slice_len']:>8} {row['raw_ms']:>8.2f} "
                     f"{row['fetch_ms']:>9.2f} {row['ratio']:>9.2f}x {row['vs_plain']:>8.2f}x")
    lines.append(f"({result['rows'][0]['rounds']} rounds each; {result['wall_s']:.0f} s in all)")
    return "\n".join(lines)
