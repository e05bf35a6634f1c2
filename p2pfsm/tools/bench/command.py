"""``p2pfsm bench``: its options, and the driver that runs the chosen suites and prints them."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable
from typing import Any

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.tools.argtypes import peer_of, positive

__all__ = ["add_arguments", "run"]

_ISSUE29 = {"concurrency", "large", "throughput"}
"""Suites that --vs-vllm runs instead of the matrix."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``p2pfsm bench``."""
    p.add_argument("--suite", choices=("fsm", "transfer", "sweep", "workloads", "layouts",
                                       "peers", "concurrency", "large", "throughput",
                                       "instructions", "all"),
                   default=["all"], nargs="+",
                   help="fsm: control events through the machines vs open rounds; transfer: "
                        "fetches between two processes vs raw NIXL and ZeroMQ; sweep: GB/s "
                        "vs block size; workloads: lookup + fetch, concurrent requests, "
                        "fan-out, soak, CPU per GB, large-region handshake; layouts: a "
                        "cache per layer (K/V apart) vs one region and vs the raw WRITE of "
                        "its descriptors; peers: idle "
                        "peers on one serve; concurrency: C concurrent fetches on one "
                        "session vs one fetch of all their blocks, C consumer processes on "
                        "one producer; large: 16 MiB to 512 MiB fetches vs the raw WRITE; "
                        "throughput: fetches per second per core at saturation; instructions: "
                        "instructions per 1-block fetch on each side vs the raw job, counted "
                        "by callgrind (needs valgrind); all: fsm and transfer; several may "
                        "be given")
    p.add_argument("--peers", type=positive(int), default=128,
                   help="peers: how many idle clients")
    p.add_argument("--connect", metavar="tcp://HOST:PORT", default=None,
                   help="only time fetches of the demo blocks from this server (vLLM's or "
                        "ours)")
    p.add_argument("--shapes", nargs="+", default=["256x64KiB", "1x4KiB"],
                   help="--connect/--vs-vllm: fetch shapes, BLOCKSxSIZE (e.g. 256x64KiB)")
    p.add_argument("--vs-vllm", action="store_true",
                   help="the vLLM/p2pfsm client/server matrix (needs .venv-vllm); with "
                        "--suite all it adds the transfer raws")
    p.add_argument("--vllm", default="0.33.0", metavar="RELEASE",
                   help="--vs-vllm: the vLLM release the vLLM side runs, 0.33.0 (.venv-vllm, "
                        "the default) or 0.34.0 (.venv-vllm-0.34)")
    p.add_argument("--cells", nargs="+", metavar="SERVER/CLIENT", default=None,
                   help="--vs-vllm: the cells to run, each kind one of vllm (vLLM's sessions), "
                        "adapter (p2pfsm's sessions in vLLM: p2pfsm.vllm), p2pfsm (a node); "
                        "default: all nine")
    p.add_argument("--passes", type=positive(int), default=2,
                   help="--vs-vllm: interleaved passes, a fresh server per cell each")
    p.add_argument("--repeat", type=positive(int), default=20,
                   help="--connect/--vs-vllm: timed fetches per cell and pass")
    p.add_argument("--open-rounds", type=int, nargs="+", default=[0, 1000, 10_000, 100_000],
                   help="fsm: open-round counts")
    p.add_argument("--plot", metavar="DIR", default=None,
                   help="write PNG figures of what was measured into DIR (needs the 'plot' "
                        "extra: matplotlib)")
    p.add_argument("--number", type=positive(int), default=2000,
                   help="fsm: iterations per sample")
    p.add_argument("--rounds", type=positive(int), default=30,
                   help="transfer: rounds per measurement (at least 2)")
    p.add_argument("--per-round", type=positive(int), default=50,
                   help="transfer: small fetches and raw round trips per round")
    p.add_argument("--idle-seconds", type=positive(float), default=10.0,
                   help="transfer: idle window of the CPU measurement")
    p.add_argument("--soak", type=positive(int), default=1000,
                   help="workloads: small fetches back to back (drift, fds, RSS)")
    p.add_argument("--cpu-fetches", type=positive(int), default=60,
                   help="workloads: 256 x 64 KiB fetches of the CPU-per-GB run")
    p.add_argument("--region-mib", type=positive(int), default=1024,
                   help="workloads: region size of the handshake workload, MiB per side")
    p.add_argument("--consumers", type=int, default=16,
                   help="workloads: consumer processes of the fan-out (0: none)")
    p.add_argument("--fanout-fetches", type=positive(int), default=10,
                   help="workloads: fetches per fan-out consumer")
    p.add_argument("--no-memory-check", action="store_true",
                   help="workloads: run the region and fan-out workloads even when the "
                        "memory available now looks too small for them (skipped otherwise)")
    p.add_argument("--widths", nargs="+", default=["1", "4", "16", "64"],
                   help="concurrency: concurrent fetches of 4 x 64 KiB on one session")
    p.add_argument("--fanout-consumers", type=positive(int), nargs="*", default=[4, 16, 64],
                   help="concurrency: consumer-process counts of the fan-out (none: skip)")
    p.add_argument("--large-mib", type=positive(int), nargs="+", default=[16, 128, 512],
                   help="large: fetch sizes in MiB")
    p.add_argument("--large-blocks", nargs="+", default=["64KiB", "2MiB"],
                   help="large: block sizes (e.g. 64KiB 2MiB)")
    p.add_argument("--throughput-peers", type=positive(int), default=4,
                   help="throughput: consumer nodes")
    p.add_argument("--in-flight", type=positive(int), default=16,
                   help="throughput: fetches in flight per consumer node (at most 16)")
    p.add_argument("--throughput-fetches", type=positive(int), default=4000,
                   help="throughput: fetches of the measured window")
    p.add_argument("--throughput-drive", nargs="+", choices=("wait", "spin"), default=["wait"],
                   help="throughput: how the consumer drives its nodes, a row each: wait "
                        "(step until no news, then wait on their descriptors, as vLLM's "
                        "client waits on its sockets) or spin (step(0) in a tight loop)")
    p.add_argument("--instructions-fetches", type=positive(int), default=100,
                   help="instructions: timed fetches N of each callgrind run (N and 2N)")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    """Run what ``args`` (from :func:`add_arguments`) asks for; print it; exit status."""
    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    if set(args.suite) - {"fsm"} and args.rounds < 2:
        raise ConfigError(f"--rounds: expected at least 2, got {args.rounds}")
    from p2pfsm.tools.bench import report

    if args.plot is not None:  # before measuring: a missing matplotlib must not cost a run
        from p2pfsm.tools.bench import plot

        plot._pyplot()
    if args.vs_vllm:
        from p2pfsm.tools.bench import matrix

        matrix.use_release(args.vllm)
    results: dict[str, Any] = {}
    text: list[str] = []
    if args.connect is not None:
        from p2pfsm.tools.bench.client import fetch_loop

        peer = peer_of(args.connect)
        for shape in args.shapes:
            blocks, block_len = report.parse_shape(shape)
            progress(f"fetching {shape} from {peer}, {args.repeat} times")
            try:
                got = fetch_loop(peer, blocks, block_len, args.repeat)
            except TransportError as exc:  # e.g. the server holds another block size
                results[f"connect {shape}"] = {"error": str(exc)}
                text.append(f"{shape} from {peer}: not measured: {exc}")
                continue
            results[f"connect {shape}"] = got
            text.append(report.format_loop(f"{shape} from {peer}", got))
    elif args.vs_vllm and _ISSUE29 & set(args.suite):
        pass  # those suites run (concurrency and throughput add their vLLM cells)
    elif args.vs_vllm:
        from p2pfsm.tools.bench import matrix

        results["vs_vllm"] = got = matrix.run(passes=args.passes, repeat=args.repeat,
                                              shapes=args.shapes, cells=args.cells or matrix.CELLS,
                                              progress=progress)
        text += [f"vLLM {matrix.release()}, the adapter and p2pfsm (separate processes, fresh "
                 "servers, interleaved):",
                 matrix.format_matrix(got)]
    everything = "all" in args.suite
    chosen = tuple(dict.fromkeys(s for name in args.suite
                                 for s in (report.SUITES if name == "all" else (name,))))
    suites = () if args.connect is not None or (args.vs_vllm and everything) else chosen
    if args.vs_vllm and everything:
        suites = ("transfer",)
    with contextlib.ExitStack() as stack:
        _run_suites(args, suites, stack, progress, results, text)
    if args.plot is not None:
        from p2pfsm.tools.bench import plot

        for path in plot.write_all(results, args.plot):
            progress(f"wrote {path}")
    print(json.dumps(results) if args.json else "\n".join(text).strip("\n"))
    return 0


def _run_suites(args: argparse.Namespace, suites: tuple[str, ...], stack: contextlib.ExitStack,
                progress: Callable[[str], None], results: dict[str, Any],
                text: list[str]) -> None:
    """Run ``suites`` in order, adding to ``results`` and ``text``; transfer and workloads
    share one peer process when both run."""
    shared: list[Any] = []

    def peer() -> Any:
        if "transfer" not in suites or "workloads" not in suites:
            return None
        if not shared:
            from p2pfsm.tools.bench.peer import Peer

            progress("starting the bench peer process (shared by transfer and workloads)")
            shared.append(Peer())
            stack.callback(shared[0].stop)
        return shared[0]

    if "fsm" in suites:
        from p2pfsm.tools.bench import fsm as bench_fsm

        progress("fsm bench: one control event through the machines")
        rows = bench_fsm.run(open_counts=tuple(args.open_rounds), number=args.number)
        results["fsm"] = [r.__dict__ for r in rows]
        text += ["control event through the machines (consumer session, medians):",
                 bench_fsm.format_rows(rows)]
    if "transfer" in suites:
        from p2pfsm.tools.bench import transfer as bench_transfer
        from p2pfsm.tools.demo.host import require_data_plane

        require_data_plane()
        transfer = bench_transfer.run(rounds=args.rounds, number=args.per_round,
                                      idle_seconds=args.idle_seconds, progress=progress,
                                      peer=peer())
        results["transfer"] = transfer
        text += ["", "fetches through two nodes vs the raw operations beneath "
                 "(same run, same two processes):", bench_transfer.format_table(transfer)]
    if "sweep" in suites:
        from p2pfsm.tools.bench import sweep

        results["sweep"] = rows_ = sweep.sweep(progress=progress)
        text += ["", sweep.format_sweep(rows_)]
    if "workloads" in suites:
        from p2pfsm.tools.bench import workloads
        from p2pfsm.tools.demo.host import require_data_plane

        require_data_plane()
        results["workloads"] = got_w = workloads.run(
            rounds=args.rounds, soak=args.soak, cpu_fetches=args.cpu_fetches,
            region_mib=args.region_mib, consumers=args.consumers,
            fanout_fetches=args.fanout_fetches, progress=progress, peer=peer(),
            memory_check=not args.no_memory_check)
        text += ["", workloads.format_workloads(got_w)]
    if "layouts" in suites:
        from p2pfsm.tools.bench import layouts
        from p2pfsm.tools.demo.host import require_data_plane

        require_data_plane()
        results["layouts"] = got_l = layouts.run(rounds=args.rounds, progress=progress)
        text += ["", layouts.format_layouts(got_l)]
    if "peers" in suites:
        from p2pfsm.tools.bench import peers

        results["peers"] = got_peers = peers.run(count=args.peers, window_s=args.idle_seconds,
                                                 progress=progress)
        text += ["", peers.format_peers(got_peers)]
    _run_issue29_suites(args, suites, progress, results, text)


def _run_issue29_suites(args: argparse.Namespace, suites: tuple[str, ...],
                        progress: Callable[[str], None], results: dict[str, Any],
                        text: list[str]) -> None:
    """The concurrency, large and throughput suites (each with its own peer process)."""
    if _ISSUE29 & set(suites):
        from p2pfsm.tools.demo.host import require_data_plane

        require_data_plane()
    if "concurrency" in suites:
        from p2pfsm.tools.bench import concurrency

        results["concurrency"] = got_c = concurrency.run(
            widths=concurrency.parse_widths(args.widths), rounds=args.rounds,
            consumers=tuple(args.fanout_consumers), fanout_fetches=args.fanout_fetches,
            progress=progress, memory_check=not args.no_memory_check)
        if args.vs_vllm:
            from p2pfsm.tools.bench import matrix, vllm_concurrency

            got_c["vllm"] = vllm_concurrency.run(
                widths=concurrency.parse_widths(args.widths), rounds=args.rounds,
                progress=progress)
            got_c["vllm_release"] = matrix.release()  # the figures name it
        text += ["", concurrency.format_concurrency(got_c)]
    if "large" in suites:
        from p2pfsm.tools.bench import large
        from p2pfsm.tools.bench.report import parse_shape

        block_lens = tuple(parse_shape(f"1x{b}")[1] for b in args.large_blocks)
        results["large"] = got_l = large.run(sizes_mib=tuple(args.large_mib),
                                             blocks=block_lens, rounds=args.rounds,
                                             progress=progress)
        text += ["", large.format_large(got_l)]
    if "throughput" in suites:
        from p2pfsm.tools.bench import throughput

        rows = [throughput.run(peers=args.throughput_peers, in_flight=args.in_flight,
                               fetches=args.throughput_fetches, progress=progress,
                               drive=drive)
                for drive in dict.fromkeys(args.throughput_drive)]
        if args.vs_vllm:
            from p2pfsm.tools.bench import vllm_concurrency

            rows.append(vllm_concurrency.throughput(
                peers=args.throughput_peers, in_flight=args.in_flight,
                fetches=args.throughput_fetches, progress=progress))
        results["throughput"] = rows
        text += ["", throughput.format_throughput(rows)]
    if "instructions" in suites:
        from p2pfsm.tools.bench import instructions

        progress("instructions: each side under callgrind, N and 2N fetches (minutes)")
        counts = instructions.measure(fetches=args.instructions_fetches)
        results["instructions"] = [c.__dict__ for c in counts]
        text += ["", "instructions per 1 x 4 KiB fetch, callgrind (difference of N and 2N):",
                 instructions.format_counts(counts)]
