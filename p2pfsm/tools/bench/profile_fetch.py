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

``--instructions N``: instead, instructions per fetch on each side, counted by
``valgrind --tool=callgrind`` (a figure load cannot move): this module runs itself
under callgrind twice, ``W`` warm-up fetches then ``N`` and then ``2 N`` measured ones,
and the difference of the two runs over ``N`` is one fetch's cost on each side. The
producer node is driven by a thread of its own (callgrind counts each thread apart),
the consumer by the main thread; they take turns by hand-off, and each steps only
when its control plane has news, so the turns of a fetch do not follow the clock (the
worker prints them per fetch): the consumer sends the fetch and turns once, the
producer steps until it has served it (the consumer's UCX progressing between its
steps, which a WRITE within one process may need), the consumer steps until the
result is in. libzmq's and UCX's threads are reported apart ("other threads").

``--send-probe``: instead, a raw DEALER -> ROUTER send of a 120-byte frame, back to back
and after a gap (busy-waited) in which libzmq's I/O thread goes idle: wall and thread
CPU medians and the context switches inside ``send`` (why a send costs more inside a
node than in a tight loop).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]

_ROUND_S = 60.0
_COUNT_WAIT_S = 3600.0  # one callgrind run: start-up alone takes minutes on a loaded box


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


# -- instructions per fetch, in one process ---------------------------------------------

_WAIT_MS = 5000  # a turn's wait for news; every hand-off has news on its way
_MAX_STEPS = 1000


class _Producer:
    """A thread that runs the calls handed to it, one at a time, and hands back each
    result: the producer node lives and steps on it alone."""

    def __init__(self) -> None:
        import queue
        import threading

        self._calls: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            try:
                self._answers.put((True, call()))
            except BaseException as exc:  # handed back and raised on the caller's thread
                self._answers.put((False, exc))

    def __call__(self, call: Callable[[], Any]) -> Any:
        """``call()`` run on the producer thread; its result (or its exception)."""
        self._calls.put(call)
        ok, got = self._answers.get()
        if not ok:
            raise got
        return got

    def stop(self) -> None:
        self._calls.put(None)
        self._thread.join(_ROUND_S)


def _wait_step(node: Any) -> None:
    """Wait for news on ``node``'s control plane (at most :data:`_WAIT_MS`), then step it."""
    import select

    poller = select.poll()
    poller.register(node.fileno(), select.POLLIN)
    poller.poll(_WAIT_MS)
    node.step(0)


def _step_until(node: Any, done: Callable[[], bool]) -> int:
    """:func:`_wait_step` ``node`` until ``done()``; the steps taken."""
    steps = 0
    while not done():
        if steps >= _MAX_STEPS:
            raise RuntimeError("profile: a fetch did not end")
        _wait_step(node)
        steps += 1
    return steps


def count_worker(fetches: int, warmup: int, blocks: int, block_len: int) -> None:
    """The measured process of ``--instructions``: ``warmup`` then ``fetches`` verified
    fetches of ``blocks`` blocks, the producer on its own thread (started first, so it
    is callgrind's thread 2); prints the steps each side took per measured fetch. A
    measured fetch ends within :data:`_MAX_STEPS` steps of each side or fails."""
    producer = _Producer()
    try:
        from p2pfsm.executor.node import Node
        from p2pfsm.tools.bench import nodes
        from p2pfsm.tools.demo.host import DemoServer

        server = producer(lambda: DemoServer(nodes.config(blocks, block_len)))
        node = Node(nodes.config(blocks, block_len))
        try:
            session = node.connect(server.node.local_id)
            deadline = time.monotonic() + _ROUND_S
            while not session.ready:
                if time.monotonic() > deadline:
                    raise RuntimeError("profile: no handshake in time")
                node.step(0.01)
                producer(lambda: server.node.step(0.01))
            fetcher = nodes.Fetcher(node, server.node.local_id, blocks, "i")
            counters = server.node.metrics._counters  # read on the producer's thread
            steps = [0, 0]
            # The first WRITEs to a peer need the target's UCX progress as well (its
            # wire-up): warm up with both nodes stepping in turn.
            for _ in range(warmup):
                fetcher.clear()
                fut = fetcher.start()
                end = time.monotonic() + _ROUND_S
                while not fut.done() and time.monotonic() < end:
                    node.step(0)
                    producer(lambda: server.node.step(0))
                fetcher.check(fut)
                fetcher.verify()
            for _ in range(fetches):
                fetcher.clear()
                fut = fetcher.start()
                node.step(0)  # the fetch frame goes out
                served = counters["served_bytes"]
                # The producer steps when the frame is in, then (while its WRITE is in
                # flight) again after each of the consumer's UCX progress calls: in one
                # process the target's progress is what lets a WRITE complete.
                producer(lambda: _wait_step(server.node))
                taken = [1, 0]
                while counters["served_bytes"] == served:
                    if taken[0] >= _MAX_STEPS:
                        raise RuntimeError("profile: the producer did not serve a fetch")
                    node.data.progress()
                    producer(lambda: server.node.step(0))
                    taken[0] += 1
                taken[1] = 1 + _step_until(node, fut.done)
                fetcher.check(fut)
                fetcher.verify()
                steps = [steps[0] + taken[0], steps[1] + taken[1]]
            print(f"steps per fetch: producer {steps[0] / max(fetches, 1):.2f}, consumer "
                  f"{steps[1] / max(fetches, 1):.2f}", flush=True)
        finally:
            node.close()
            producer(server.node.close)
    finally:
        producer.stop()


def _thread_totals(out: Path) -> dict[int, int]:
    """Instructions of each thread (callgrind's numbering, 1 = main) of one run, which
    must hold both nodes' threads (1 and 2)."""
    from p2pfsm.tools.bench.instructions import thread_totals

    totals = thread_totals(out)
    if 1 not in totals or 2 not in totals:
        raise RuntimeError(f"profile: no callgrind counts of both nodes' threads in {out.parent}")
    return totals


def _module_name() -> str:
    """This module's import name, also when it runs as ``__main__``."""
    spec = globals().get("__spec__")
    return __name__ if __name__ != "__main__" or spec is None else str(spec.name)


def count_instructions(fetches: int, warmup: int, blocks: int, block_len: int,
                       keep: Path | None = None) -> dict[str, float]:
    """Instructions per fetch of the consumer's thread, the producer's and the others
    (libzmq, UCX): two callgrind runs of :func:`count_worker`, the difference over
    ``fetches``; ``keep``: a directory to leave callgrind's files in (for
    ``callgrind_annotate``), else they go."""
    import shutil
    import subprocess
    import sys
    import tempfile

    from p2pfsm.tools.bench.instructions import valgrind_argv

    if shutil.which("valgrind") is None:
        raise RuntimeError("profile: valgrind is not on PATH (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="p2pfsm-callgrind-") as scratch:
        tmp = scratch if keep is None else str(keep)
        outs, procs = [], []
        for n in (fetches, 2 * fetches):  # both runs at once: nothing of one moves the other
            out = Path(tmp) / f"n{n}" / "cg.out"
            out.parent.mkdir(parents=True)
            argv = [*valgrind_argv(out), sys.executable, "-m", _module_name(),
                    "--count-worker", str(n), "--warmup", str(warmup), "--blocks",
                    str(blocks), "--block-len", str(block_len)]
            # One hash seed for every run: set and dict orders (so the counts) repeat. No
            # bytecode written: the two runs start together, and one compiling a module
            # the other then reads from its cache would not cancel out.
            env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
            outs.append(out)
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        try:
            for n, proc in zip((fetches, 2 * fetches), procs, strict=True):
                stdout, stderr = proc.communicate(timeout=_COUNT_WAIT_S)
                if proc.returncode != 0:
                    raise RuntimeError(f"profile: the callgrind run failed:\n{stderr[-2000:]}")
                print(f"N = {n}: {stdout.strip()}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        runs = [_thread_totals(out) for out in outs]
    one, two = runs

    def per(sel: Callable[[dict[int, int]], int]) -> float:
        return (sel(two) - sel(one)) / fetches

    return {"consumer": per(lambda t: t[1]), "producer": per(lambda t: t[2]),
            "other threads": per(lambda t: sum(v for k, v in t.items() if k > 2))}


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
    ap.add_argument("--instructions", type=int, metavar="N",
                    help="instructions per fetch by callgrind: N and 2 N fetches")
    ap.add_argument("--warmup", type=int, default=20, help="--instructions: warm-up fetches")
    ap.add_argument("--keep", type=Path, metavar="DIR",
                    help="--instructions: leave callgrind's files in DIR (one folder per run)")
    ap.add_argument("--count-worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.count_worker is not None:
        count_worker(args.count_worker, args.warmup, args.blocks, args.block_len)
        return 0
    if args.instructions is not None:
        if args.instructions < 1 or args.warmup < 0:
            ap.error("--instructions must be positive and --warmup not negative")
        counts = count_instructions(args.instructions, args.warmup, args.blocks,
                                    args.block_len, args.keep)
        print(f"instructions per fetch of {args.blocks} x {args.block_len} B in one process "
              f"(callgrind, difference of {args.instructions} and {2 * args.instructions} "
              f"fetches after {args.warmup} warm-up): "
              + ", ".join(f"{side} {n:,.0f}" for side, n in counts.items()))
        return 0
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
