"""``p2pfsm bench --suite large``: large fetches against the raw NIXL WRITE of the same
descriptors.

Between the transfer bench's two processes. For each total size and block size, a
fresh node pair holds exactly that many blocks; each round times one raw WRITE of
every block by the peer's data plane into ours (this node progressing UCX in a tight
loop: the transport's floor with both ends progressing) and one fetch of every block
through the two nodes (verified once after the warm-up). The ratio is the fetch's
median over the raw WRITE's median (target: <= 1.1x from 16 MiB up).
"""

from __future__ import annotations

import gc
import statistics
from typing import Any

from p2pfsm.errors import ConfigError
from p2pfsm.tools.bench.nodes import Fetcher
from p2pfsm.tools.bench.peer import Peer, node_pair
from p2pfsm.tools.bench.report import Progress, quantiles

__all__ = ["BLOCKS", "SIZES_MIB", "format_large", "run"]

SIZES_MIB = (16, 128, 512)
BLOCKS = (64 * 1024, 2 * 1024 * 1024)
_TARGET = 1.1


def _cell(peer: Peer, total: int, block_len: int, rounds: int) -> dict[str, Any]:
    count = total // block_len
    node, peer_id = node_pair(peer, (count, block_len))
    try:
        fetcher = Fetcher(node, peer_id, count, f"large-{total}-{block_len}")
        for _ in range(2):
            fetcher.once()
        fetcher.verify()
        peer.ask("raw_write", node.local_id, 2, None, pump=node.data.progress)
        raw: list[float] = []
        fetched: list[float] = []
        for _ in range(rounds):
            raw.extend(peer.ask("raw_write", node.local_id, 1, None,
                                pump=node.data.progress)[1])
            fetched.append(fetcher.once())
    finally:
        node.close()
        peer.ask("drop")
        gc.collect()
    r_med, f_med = statistics.median(raw), statistics.median(fetched)
    return {"total": total, "block_len": block_len, "blocks": count,
            "raw_ms": quantiles(raw), "fetch_ms": quantiles(fetched),
            "raw_gbps": total / r_med / 1e9, "fetch_gbps": total / f_med / 1e9,
            "ratio": f_med / r_med}


def run(sizes_mib: tuple[int, ...] = SIZES_MIB, blocks: tuple[int, ...] = BLOCKS,
        rounds: int = 10, progress: Progress | None = None,
        peer: Peer | None = None) -> dict[str, Any]:
    """Every (size, block size) cell whose size is a whole number of blocks."""
    from p2pfsm.tools.bench.workloads import load_average

    if rounds < 1 or not sizes_mib or min(sizes_mib) < 1:
        raise ConfigError(f"large: need rounds >= 1 and sizes >= 1 MiB; got {rounds}, "
                          f"{sizes_mib}")
    say = progress or (lambda _line: None)
    own = peer is None
    peer = peer or Peer()
    cells: list[dict[str, Any]] = []
    try:
        for mib in sizes_mib:
            for bl in blocks:
                total = mib * 2**20
                if total % bl or total < bl:
                    continue
                say(f"  large: {mib} MiB in {bl // 1024} KiB blocks, {rounds} rounds")
                load0 = load_average()
                cell = _cell(peer, total, bl, rounds)
                cell["load"] = (load0 + load_average()) / 2
                cells.append(cell)
    finally:
        if own:
            peer.stop()
    return {"rounds": rounds, "target": _TARGET, "cells": cells}


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n // 1024} KiB"


def format_large(r: dict[str, Any]) -> str:
    """The result of :func:`run` as a text table."""
    lines = [f"large fetches vs the raw NIXL WRITE of the same descriptors, target "
             f"spinning (medians of {r['rounds']} rounds; target <= {r['target']}x):",
             f"  {'size':>8} {'block':>8} {'raw ms':>8} {'fetch ms':>9} {'raw GB/s':>8} "
             f"{'GB/s':>6} {'ratio':>6} {'load':>5}"]
    for c in r["cells"]:
        lines.append(f"  {_size(c['total']):>8} {_size(c['block_len']):>8} "
                     f"{c['raw_ms']['median']:>8.2f} {c['fetch_ms']['median']:>9.2f} "
                     f"{c['raw_gbps']:>8.2f} {c['fetch_gbps']:>6.2f} {c['ratio']:>5.2f}x "
                     f"{c['load']:>5.1f}")
    return "\n".join(lines)
