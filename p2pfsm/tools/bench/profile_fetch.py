"""Where the microseconds of one fetch go, on each side: both nodes in this process.

``python -m p2pfsm.tools.bench.profile_fetch [--width C] [--blocks N] [--block-len B]
[--rounds R] [--top K]``: a producer DemoServer and a consumer node, both in this
thread, stepped in turn; each round issues C concurrent fetches of N blocks and steps
both nodes until all are done. First without a profiler: the CPU seconds
(``time.thread_time``) of each node's steps per fetch. Then with one
:class:`cProfile.Profile` per side (enabled only around that node's steps): the top
functions by own thread-CPU time, as shares of the profiled time and those shares
of the unprofiled CPU per fetch (the profiler inflates every call). Loopback only;
bounded by a deadline per round.

``--send-probe``: instead, a raw DEALER -> ROUTER send of a 120-byte frame, back to back
and after a gap (busy-waited) in which libzmq's I/O thread goes idle: wall and thread
CPU medians and the context switches inside ``send`` (why a send costs more inside a
node than in a tight loop).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["main"]

_ROUND_S = 60.0


def _rounds(node: Any, server: Any, parts: list[Any], rounds: int,
            around: Callable[[str, Callable[[], Any]], Any]) -> None:
    for _ in range(rounds):
        futs = around("consumer", lambda: [p.start() for p in parts])
        deadline = time.monotonic() + _ROUND_S
        while not all(f.done() for f in futs):
            if time.monotonic() > deadline:
                raise RuntimeError("profile: fetches not done in time")
            around("consumer", lambda: node.step(0))
            around("producer", lambda: server.node.step(0))
        for p, f in zip(parts, futs, strict=True):
            p.check(f)


def send_probe(sends: int = 400) -> None:
    """Print the cost of a raw DEALER send back to back and after 0.2 / 1 ms gaps."""
    import resource
    import statistics

    import zmq

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    frame = b"f" * 120
    try:
        dealer.send(frame)
        if not router.poll(10_000):
            raise RuntimeError("send probe: no frame within 10 s")
        router.recv_multipart()
        for gap in (0.0, 0.0002, 0.001):
            wall, cpu, switches = [], [], 0
            for _ in range(sends):
                t = time.perf_counter()
                while time.perf_counter() - t < gap:  # busy: our thread stays on its core
                    pass
                u0 = resource.getrusage(resource.RUSAGE_THREAD)
                t0, c0 = time.perf_counter(), time.thread_time()
                dealer.send(frame, zmq.NOBLOCK)
                cpu.append(time.thread_time() - c0)
                wall.append(time.perf_counter() - t0)
                u1 = resource.getrusage(resource.RUSAGE_THREAD)
                switches += u1.ru_nvcsw - u0.ru_nvcsw + u1.ru_nivcsw - u0.ru_nivcsw
                while router.poll(0):
                    router.recv_multipart()
            print(f"gap {gap * 1e3:.1f} ms: send wall median {statistics.median(wall) * 1e6:.1f} "
                  f"us, thread CPU median {statistics.median(cpu) * 1e6:.1f} us, "
                  f"{switches} context switches in {sends} sends")
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
        ctx.term()


def main(argv: Sequence[str] | None = None) -> int:
    from p2pfsm.executor.node import Node
    from p2pfsm.tools.bench import nodes
    from p2pfsm.tools.demo.host import DemoServer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--block-len", type=int, default=64 * 1024)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--send-probe", action="store_true")
    args = ap.parse_args(argv)
    if args.send_probe:
        send_probe()
        return 0
    total = args.width * args.blocks
    server = DemoServer(nodes.config(total, args.block_len))
    node = Node(nodes.config(total, args.block_len))
    try:
        session = node.connect(server.node.local_id)
        deadline = time.monotonic() + _ROUND_S
        while not session.ready and time.monotonic() < deadline:
            node.step(0)
            server.node.step(0)
        parts = [nodes.Fetcher(node, server.node.local_id, args.blocks, f"p{i}",
                               first=i * args.blocks) for i in range(args.width)]
        cpu = {"consumer": 0.0, "producer": 0.0}

        def timed(side: str, fn: Callable[[], Any]) -> Any:
            t0 = time.thread_time()
            got = fn()
            cpu[side] += time.thread_time() - t0
            return got

        _rounds(node, server, parts, 3, lambda _s, fn: fn())  # warm-up
        _rounds(node, server, parts, args.rounds, timed)
        fetches = args.rounds * args.width
        print(f"{args.width} concurrent fetches of {args.blocks} x {args.block_len} B, "
              f"{args.rounds} rounds, no profiler: CPU per fetch consumer "
              f"{cpu['consumer'] / fetches * 1e6:.1f} us, producer "
              f"{cpu['producer'] / fetches * 1e6:.1f} us")
        # Thread CPU time as the profiler's clock: a call's time excludes the moments the
        # thread was preempted (e.g. by libzmq's I/O thread it just woke up).
        profs = {side: cProfile.Profile(time.thread_time_ns, 1e-9)
                 for side in ("consumer", "producer")}

        def profiled(side: str, fn: Callable[[], Any]) -> Any:
            profs[side].enable()
            try:
                return fn()
            finally:
                profs[side].disable()

        _rounds(node, server, parts, args.rounds, profiled)
        for side, prof in profs.items():
            st = pstats.Stats(prof)
            rows = sorted(st.stats.items(),  # type: ignore[attr-defined]
                          key=lambda kv: -kv[1][2])
            own = sum(v[2] for _, v in rows)
            base = cpu[side] / fetches * 1e6
            print(f"\n{side}: {own / fetches * 1e6:.1f} us per fetch under the profiler, "
                  f"{base:.1f} us without; top by own time (share of the profiled time, "
                  f"that share of the unprofiled {base:.0f} us, calls per fetch, function):")
            for (path, line, name), (_cc, nc, tt, _ct, _callers) in rows[:args.top]:
                where = path.rsplit("/p2pfsm/", 1)[-1] if "/p2pfsm/" in path else path
                where = where.rsplit("site-packages/", 1)[-1]
                print(f"  {tt / own * 100:5.1f} % {tt / own * base:6.1f} us {nc / fetches:6.2f}"
                      f"  {where}:{line}({name})")
    finally:
        node.close()
        server.node.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
