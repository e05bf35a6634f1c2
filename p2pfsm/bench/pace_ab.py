"""A/B of the loop's wait while a fetch is open: spinning vs blocking, both ends.

``python -m p2pfsm.bench.pace_ab [ROUNDS] [SMALL] [LARGE]`` starts two producer
processes (DemoServers of 16 x 4 KiB and 256 x 64 KiB) and a consumer node for each in
this process, then, round by round with the order of the variants alternating, sets the
same pace on both ends and times ``SMALL`` 1 x 4 KiB and ``LARGE`` 256 x 64 KiB fetches
(bytes verified at the end). Variants: ``old`` (the loop spins whenever the data plane
is at its busy pace: what a truncated 1 ms wait did), ``spin`` (spins for 20 ms after a
fetch is sent or a WRITE posted, then blocks up to 1 ms) and ``block`` (always blocks in
epoll on the control plane for up to 1 ms, the default) and ``wspin`` (``block``
on the consumer, ``spin`` on the producer). Prints medians, p10/p90, CPU
per fetch of each side and the load average.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import statistics
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from p2pfsm.bench.transfer import _Fetcher, _stats
from p2pfsm.executor.node import Node, NodeConfig

VARIANTS = {"old": (0.02, 0.02, 0), "spin": (0.02, 0.02, 1), "block": (0.0, 0.0, 1),
            "wspin": (0.0, 0.02, 1)}
"""name -> (consumer prompt_s, producer prompt_s, busy_progress_ms); a busy pace of 0 ms
is a spin."""
_SHAPES = {"small": (16, 4 * 1024), "large": (256, 64 * 1024)}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _set_pace(node: Node, variant: str, producer: bool = False) -> None:
    consumer_s, producer_s, busy_ms = VARIANTS[variant]
    prompt_s = producer_s if producer else consumer_s
    pace: Any = node.data._pace  # private knobs, set between fetches only
    pace.prompt_s, pace.busy_ms, pace.prompt_until = prompt_s, busy_ms, 0.0


def _producer(conn: Connection, shape: tuple[int, int]) -> None:
    from p2pfsm.demo.host import DemoServer

    server = DemoServer(NodeConfig("tcp://127.0.0.1:0", *shape))
    conn.send(server.node.local_id)
    try:
        while True:
            server.node.step(0.05)
            if conn.poll(0):
                cmd = conn.recv()
                if cmd[0] == "stop":
                    return
                _set_pace(server.node, cmd[1], producer=True)
                conn.send(_cpu())
    finally:
        server.node.close()


def main(rounds: int = 30, n_small: int = 25, n_large: int = 4) -> str:
    """Run the A/B; return the report."""
    spawn = multiprocessing.get_context("spawn")
    pairs: dict[str, tuple[Connection, Any, Node, _Fetcher]] = {}
    try:
        for name, shape in _SHAPES.items():
            conn, child = spawn.Pipe()
            proc = spawn.Process(target=_producer, args=(child, shape), daemon=True)
            proc.start()
            peer_id = conn.recv()
            node = Node(NodeConfig("tcp://127.0.0.1:0", *shape))
            pairs[name] = (conn, proc, node, _Fetcher(node, peer_id, shape[0] if name == "large"
                                                      else 1, name))
            session = node.connect(peer_id)
            node.run_until(lambda: session.ready or not session.alive, 30.0)  # noqa: B023
            for _ in range(5):
                pairs[name][3].once()

        def pace(name: str, variant: str) -> float:
            conn, _, node, _ = pairs[name]
            _set_pace(node, variant)
            conn.send(("pace", variant))
            while not conn.poll(0):
                node.step(0.001)
            return float(conn.recv())

        times: dict[tuple[str, str], list[float]] = {(v, k): [] for v in VARIANTS for k in pairs}
        cpu = {(v, k): [0.0, 0.0] for v in VARIANTS for k in pairs}
        loads, t0 = [], time.monotonic()
        for r in range(rounds):
            loads.append(os.getloadavg()[0])
            for variant in (list(VARIANTS) if r % 2 == 0 else list(VARIANTS)[::-1]):
                for name, count in (("small", n_small), ("large", n_large)):
                    fetcher = pairs[name][3]
                    peer0, ours0 = pace(name, variant), _cpu()
                    times[(variant, name)].extend(fetcher.once() for _ in range(count))
                    ours1, peer1 = _cpu(), pace(name, variant)
                    cpu[(variant, name)][0] += (ours1 - ours0) / count
                    cpu[(variant, name)][1] += (peer1 - peer0) / count
        for _, _, _, fetcher in pairs.values():
            fetcher.verify()
        lines = [f"{rounds} rounds, variants interleaved; load average (1 min) median "
                 f"{statistics.median(loads):.1f} (min {min(loads):.1f}, max {max(loads):.1f});"
                 f" {time.monotonic() - t0:.0f} s"]
        for name, unit, scale in (("small", "us", 1e6), ("large", "ms", 1e3)):
            for variant in VARIANTS:
                st = _stats(times[(variant, name)], scale)
                c = cpu[(variant, name)]
                lines.append(f"{name:5} {variant:5} median {st['median']:8.1f} p10 "
                             f"{st['p10']:8.1f} p90 {st['p90']:8.1f} {unit} n={st['n']:.0f}; "
                             f"CPU per fetch: consumer {c[0] / rounds * 1e3:.2f} ms, "
                             f"producer {c[1] / rounds * 1e3:.2f} ms")
        return "\n".join(lines)
    finally:
        for conn, proc, node, _ in pairs.values():
            conn.send(("stop",))
            node.close()
            proc.join(10.0)
            if proc.is_alive():
                proc.kill()


if __name__ == "__main__":
    print(main(*(int(a) for a in sys.argv[1:4])))
