"""``p2pfsm bench --suite sweep``: GB/s of a fetch vs block size, against the raw WRITE
(target spinning) and a memcpy of the same bytes, between the same two processes."""

from __future__ import annotations

import statistics
import time
from typing import Any

from p2pfsm.tools.bench.nodes import Fetcher
from p2pfsm.tools.bench.peer import Peer, node_pair
from p2pfsm.tools.bench.report import Progress

__all__ = ["format_sweep", "sweep"]

SIZES = (4096, 16384, 65536, 262144, 1 << 20, 2 << 20)
_TOTAL = 16 << 20


def _memcpy_s(nbytes: int, repeat: int) -> float:
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sweep(sizes: tuple[int, ...] = SIZES, repeat: int = 15,
          progress: Progress | None = None) -> list[dict[str, Any]]:
    """For each block size: blocks = 16 MiB / size (8..256); medians in GB/s."""
    say = progress or (lambda _line: None)
    rows = []
    peer = Peer()
    try:
        for size in sizes:
            blocks = max(8, min(256, _TOTAL // size))
            say(f"  sweep: {blocks} x {size // 1024} KiB")
            node, peer_id = node_pair(peer, (blocks, size))
            try:
                fetcher = Fetcher(node, peer_id, blocks, f"sweep{size}")
                for _ in range(3):
                    fetcher.once()
                fetcher.verify()
                fetched, raw = [], []
                for _ in range(repeat):
                    raw.extend(peer.ask("raw_write", node.local_id, 1,
                                        pump=node.data.progress)[1])
                    fetched.append(fetcher.once())
            finally:
                node.close()
            nbytes = blocks * size
            rows.append({"block_len": size, "blocks": blocks, "bytes": nbytes,
                         "fetch_gbps": nbytes / statistics.median(fetched) / 1e9,
                         "raw_gbps": nbytes / statistics.median(raw) / 1e9,
                         "memcpy_gbps": nbytes / _memcpy_s(nbytes, repeat) / 1e9})
    finally:
        peer.stop()
    return rows


def format_sweep(rows: list[dict[str, Any]]) -> str:
    lines = ["GB/s vs block size (medians; raw WRITE with the target spinning):",
             f"{'block':>8} {'blocks':>7} {'fetch':>8} {'raw WRITE':>10} {'memcpy':>8} "
             f"{'fetch/raw':>10}"]
    for r in rows:
        lines.append(f"{r['block_len'] // 1024:>5} KiB {r['blocks']:>7} {r['fetch_gbps']:>8.2f} "
                     f"{r['raw_gbps']:>10.2f} {r['memcpy_gbps']:>8.2f} "
                     f"{r['fetch_gbps'] / r['raw_gbps']:>10.2f}")
    return "\n".join(lines)
