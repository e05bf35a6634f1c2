"""A timed, byte-verified fetch loop against any server holding the demo block model.

``python -m p2pfsm.tools.bench.client --connect HOST:PORT --blocks N --block-len L --repeat R``
connects a p2pfsm node, fetches demo blocks ``0..N-1`` into the same indexes ``warmup + R``
times, verifies every byte of each fetch, and prints one JSON line: ``times`` (seconds of
each timed fetch, warm-up excluded), ``failures``, ``verify_failures``, ``handshake_s``.
The same loop backs ``p2pfsm bench --connect`` in-process (:func:`fetch_loop`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import ConfigError
from p2pfsm.tools.bench import nodes

__all__ = ["fetch_loop", "main"]


def fetch_loop(peer_id: str, blocks: int, block_len: int, repeat: int, warmup: int = 3,
               timeout: float = 30.0) -> dict[str, Any]:
    """Fetch ``blocks`` demo blocks from ``peer_id`` ``warmup + repeat`` times; the report."""
    from p2pfsm.executor.node import Node

    if blocks < 1 or block_len < 1 or repeat < 1 or warmup < 0:
        raise ConfigError(f"bench client: need blocks, block_len, repeat >= 1 and warmup >= 0; "
                          f"got {blocks}, {block_len}, {repeat}, {warmup}")
    node = Node(nodes.config(blocks, block_len))
    try:
        handshake = nodes.connect(node, peer_id, timeout)
        keys = [demo_key(i) for i in range(blocks)]
        dest = list(range(blocks))
        want = [demo_block(i, block_len) for i in range(blocks)]
        region = node.region
        times: list[float] = []
        failures = verify_failures = 0
        for n in range(warmup + repeat):
            region.zero_()
            t0 = time.perf_counter()
            fut = node.fetch(peer_id, f"bench-client-{n}", keys, dest)
            node.run_until(fut.done, timeout)
            elapsed = time.perf_counter() - t0
            if not fut.done() or not fut.result().success:
                failures += 1
                continue
            if any(bytes(region[i].numpy()) != want[i] for i in dest):
                verify_failures += 1
            elif n >= warmup:
                times.append(elapsed)
    finally:
        node.close()
    return {"times": times, "failures": failures, "verify_failures": verify_failures,
            "handshake_s": handshake}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--connect", required=True, help="HOST:PORT of the server")
    p.add_argument("--blocks", type=int, default=1)
    p.add_argument("--block-len", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    print(json.dumps(fetch_loop(args.connect, args.blocks, args.block_len, args.repeat,
                                args.warmup)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
