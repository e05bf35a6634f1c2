"""Instructions per fetch on each side, counted by callgrind: a figure load cannot move.

``python -m p2pfsm.tools.bench.instructions [--fetches N] [--warmup W] [--block-len B]``

Two processes on loopback, one of them under ``valgrind --tool=callgrind``, the other
native. The measured process does ``W`` warm-up operations and then ``N`` timed ones;
it runs twice, with ``N`` and with ``2 N``, and the difference of its main thread's
instruction counts, divided by ``N``, is what one operation costs that side: start-up,
imports, handshake and warm-up cancel out. The main thread is the one that drives the
node (or the raw sockets); libzmq's I/O thread and UCX's threads are reported apart, as
"other threads". Four measurements:

* ``producer``: a ``DemoServer`` node serving 1-block fetches;
* ``consumer``: a node fetching them;
* ``raw producer``: the floor of the same job without p2pfsm: a ROUTER receives a
  request, posts a one-block NIXL WRITE into the peer, polls it to completion and replies;
* ``raw consumer``: a DEALER sends the request and waits for the reply (its peer's
  WRITE lands meanwhile).

Each ratio is p2pfsm's count over the raw one of the same side. Needs ``valgrind`` on
``PATH`` (Debian: ``apt-get install valgrind``) and the ``nixl`` extra; about 4 minutes
on 2 cores, most of it Python's start-up under valgrind.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2pfsm.tools.bench import nodes
from p2pfsm.tools.bench.procs import Command, run_to_end

__all__ = ["Count", "main", "measure"]

SIDES = ("producer", "consumer", "raw producer", "raw consumer")
_WAIT_S = 1800.0  # one valgrind run: start-up under valgrind takes minutes on a loaded box
_READY = "ready "


# -- the worker processes --------------------------------------------------------------


def _stop_on_term() -> None:
    """SIGTERM ends the worker through SystemExit, so that nodes close and callgrind
    writes its counts."""
    def _raise(_sig: int, _frame: Any) -> None:
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, _raise)


def _announce(*fields: str) -> None:
    print(_READY + " ".join(fields), flush=True)


def _serve(block_len: int, raw: bool) -> None:
    """A producer until SIGTERM: a DemoServer node; with ``raw``, also a ROUTER whose
    requests it answers with a raw one-block WRITE into the requester's block 0."""
    import zmq

    from p2pfsm.tools.demo.host import DemoServer

    _stop_on_term()
    server = DemoServer(nodes.config(1, block_len))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    try:
        port = router.bind_to_random_port("tcp://127.0.0.1")
        _announce(server.node.local_id, f"tcp://127.0.0.1:{port}")
        node = server.node
        if not raw:
            while True:
                node.step(1.0)
        while not router.poll(0):  # the handshake first: the WRITE needs the peer's agent
            node.step(0.05)
        k = 0
        while True:
            if not router.poll(1000):
                continue
            ident, peer_id = router.recv_multipart()
            k += 1
            xfer = ("raw", k)
            node.data.write(xfer, peer_id.decode(), [0], [0])
            while True:
                done = dict(node.data.poll())
                if xfer in done:
                    break
            router.send_multipart([ident, b"ok" if done[xfer] else b"failed"])
    finally:
        router.close(linger=0)
        ctx.term()
        server.node.close()


def _fetch(block_len: int, raw: bool, peer_id: str, router_addr: str, warmup: int,
           count: int) -> None:
    """A consumer: connect, ``warmup`` then ``count`` one-block operations, each checked;
    then close and exit."""
    import zmq

    from p2pfsm.demo_blocks import demo_block, demo_key
    from p2pfsm.errors import TransportError
    from p2pfsm.executor.node import Node

    node = Node(nodes.config(1, block_len))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    want = demo_block(0, block_len)
    try:
        nodes.connect(node, peer_id, 300.0)
        dealer.connect(router_addr)
        for i in range(warmup + count):
            node.region[0].zero_()
            if raw:
                dealer.send(node.local_id.encode())
                while not dealer.poll(1):
                    node.data.progress()
                if dealer.recv() != b"ok":
                    raise TransportError("instructions: the raw WRITE failed")
            else:
                fut = node.fetch(peer_id, f"ins-{i}", [demo_key(0)], [0])
                node.run_until(fut.done, 300.0)
                if not fut.done() or not fut.result().success:
                    raise TransportError(f"instructions: fetch {i} failed")
            if bytes(node.region[0].numpy().tobytes()) != want:
                raise TransportError(f"instructions: block {i} holds the wrong bytes")
    finally:
        dealer.close(linger=0)
        ctx.term()
        node.close()


# -- this process ----------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    """Instructions per operation of one side: its driving thread and the others."""

    side: str
    main: float
    others: float


def _worker_argv(role: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "p2pfsm.tools.bench.instructions", "--worker", role, *args]


def valgrind_argv(out: Path) -> list[str]:
    """The callgrind command line (each thread counted apart, into ``out``-NN) that a
    measured process's own argv follows."""
    return ["valgrind", "--tool=callgrind", "--separate-threads=yes",
            f"--callgrind-out-file={out}", "--dump-instr=no", "--dump-line=no"]


def thread_totals(out: Path) -> dict[int, int]:
    """Instructions of each thread of one callgrind run (callgrind's numbering, 1 = the
    main thread), read from its per-thread files ``out``-NN."""
    totals = {}
    for path in out.parent.glob(out.name + "-*"):
        text = path.read_text(errors="replace")
        got = re.search(r"^totals:\s+(\d+)", text, re.M) or re.search(
            r"^summary:\s+(\d+)", text, re.M)
        if got is not None:
            totals[int(path.name.rsplit("-", 1)[1])] = int(got.group(1))
    return totals


def _totals(out: Path) -> tuple[int, int]:
    """(main thread, other threads) instructions from callgrind's per-thread files."""
    totals = thread_totals(out)
    main = totals.get(1, 0)
    others = sum(total for thread, total in totals.items() if thread != 1)
    if main == 0:
        raise RuntimeError(f"instructions: no callgrind counts in {out.parent}")
    return main, others


def _start(argv: list[str], env: dict[str, str]) -> tuple[Command, list[str]]:
    """``argv`` started, and the fields of its ready line."""
    proc = Command(argv, f"instructions: {' '.join(argv[-3:])}", env)
    deadline = time.monotonic() + _WAIT_S
    try:
        while not (line := proc.readline(deadline)).startswith(_READY):
            pass
    except BaseException:
        proc.stop(_WAIT_S)
        raise
    return proc, line[len(_READY):].split()


def _one(side: str, count: int, warmup: int, block_len: int, work: Path) -> tuple[int, int]:
    """Run ``side`` once with ``count`` timed operations; its callgrind totals."""
    raw = side.startswith("raw")
    out = work / f"{side.replace(' ', '-')}-{count}" / "cg.out"
    out.parent.mkdir(parents=True)
    # One hash seed for every run: set and dict orders (and so the instructions) repeat.
    env = {"PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0"}
    base = ["--block-len", str(block_len)] + (["--raw"] if raw else [])
    measured_producer = side.endswith("producer")
    serve_argv = _worker_argv("serve", base)
    if measured_producer:
        serve_argv = valgrind_argv(out) + serve_argv
    server, (peer_id, router_addr) = _start(serve_argv, env)
    try:
        fetch_argv = _worker_argv("fetch", [*base, "--peer", peer_id, "--router", router_addr,
                                            "--warmup", str(warmup), "--fetches", str(count)])
        if not measured_producer:
            fetch_argv = valgrind_argv(out) + fetch_argv
        client = run_to_end(fetch_argv, _WAIT_S, env)
        if client is None or client.returncode != 0:
            raise RuntimeError(f"instructions: the {side} run's consumer failed:\n"
                               f"{'timed out' if client is None else client.stderr[-2000:]}")
    finally:
        server.stop(_WAIT_S)
    return _totals(out)


def measure(fetches: int = 100, warmup: int = 20, block_len: int = 4096,
            sides: Sequence[str] = SIDES) -> list[Count]:
    """Instructions per operation of each of ``sides``: two callgrind runs each."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("instructions: valgrind is not on PATH "
                           "(Debian: apt-get install valgrind)")
    counts = []
    with tempfile.TemporaryDirectory(prefix="p2pfsm-callgrind-") as tmp:
        for side in sides:
            m1, o1 = _one(side, fetches, warmup, block_len, Path(tmp))
            m2, o2 = _one(side, 2 * fetches, warmup, block_len, Path(tmp))
            counts.append(Count(side, (m2 - m1) / fetches, (o2 - o1) / fetches))
    return counts


def format_counts(counts: Sequence[Count]) -> str:
    """The table, with p2pfsm over raw per side where both were measured."""
    by = {c.side: c for c in counts}
    lines = [f"{'side':<14} {'driving thread':>15} {'other threads':>14} {'vs raw':>7}"]
    for c in counts:
        raw = by.get(f"raw {c.side}")
        ratio = f"{c.main / raw.main:6.2f}x" if raw is not None and raw.main > 0 else ""
        lines.append(f"{c.side:<14} {c.main:>15,.0f} {c.others:>14,.0f} {ratio:>7}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fetches", type=int, default=100, help="timed operations (N)")
    ap.add_argument("--warmup", type=int, default=20, help="warm-up operations")
    ap.add_argument("--block-len", type=int, default=4096)
    ap.add_argument("--side", choices=SIDES, nargs="+", default=list(SIDES))
    ap.add_argument("--worker", choices=("serve", "fetch"), help=argparse.SUPPRESS)
    ap.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--router", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.fetches < 1 or args.warmup < 0 or args.block_len < 1:
        ap.error("--fetches and --block-len must be positive, --warmup not negative")
    if args.worker == "serve":
        with contextlib.suppress(SystemExit):
            _serve(args.block_len, args.raw)
        return 0
    if args.worker == "fetch":
        _fetch(args.block_len, args.raw, args.peer, args.router, args.warmup, args.fetches)
        return 0
    counts = measure(args.fetches, args.warmup, args.block_len, args.side)
    print(f"instructions per 1 x {args.block_len} B fetch (callgrind, difference of "
          f"{args.fetches} and {2 * args.fetches} operations after {args.warmup} warm-up):")
    print(format_counts(counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
