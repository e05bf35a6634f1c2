"""The ``p2pfsm`` command line: demo, diagrams, check, bench (and the executor's commands).

Every command prints one clear error line and exits 2 on bad arguments or a
refused operation; no traceback reaches the user for expected failures.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from p2pfsm.errors import ConfigError, P2PFSMError

Command = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"p2pfsm: error: {message}\n")


def _cmd_diagrams(args: argparse.Namespace) -> int:
    from p2pfsm.diagrams import render, write_svgs
    from p2pfsm.fsm import machines

    out = Path(args.out)
    specs = machines()
    wanted = render(specs, out)
    if args.check:
        stale = [str(p) for p, text in wanted.items()
                 if not p.is_file() or p.read_text() != text]
        extra = sorted(str(p) for p in out.glob("*.mmd") if p not in wanted)
        if stale or extra:
            print(f"p2pfsm: stale diagrams (run `p2pfsm diagrams`): {', '.join(stale + extra)}",
                  file=sys.stderr)
            return 1
        print(f"diagrams up to date: {len(wanted)} machines in {out}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for path, text in wanted.items():
        path.write_text(text)
    svgs = write_svgs(specs, out)
    print(f"wrote {len(wanted)} mermaid diagrams"
          + (f" and {len(svgs)} SVGs" if svgs else " (no graphviz `dot`: no SVG)") + f" to {out}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    try:
        verify = importlib.import_module("p2pfsm.verify")
    except ImportError as exc:
        raise P2PFSMError(f"model checking is not available: {exc}") from exc
    return int(verify.check_main(list(args.rest)))


def _cmd_bench(args: argparse.Namespace) -> int:
    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.suite != "fsm" and args.rounds < 2:
        raise ConfigError(f"--rounds: expected at least 2, got {args.rounds}")
    results: dict[str, Any] = {}
    text: list[str] = []
    if args.suite in ("fsm", "all"):
        from p2pfsm.bench import fsm as bench_fsm

        progress("fsm bench: one control event through the machines")
        rows = bench_fsm.run(number=args.number)
        results["fsm"] = [r.__dict__ for r in rows]
        text += ["control event through the machines (consumer session, medians):",
                 bench_fsm.format_rows(rows)]
    if args.suite in ("transfer", "all"):
        from p2pfsm.bench import transfer as bench_transfer

        transfer = bench_transfer.run(rounds=args.rounds, number=args.per_round,
                                      idle_seconds=args.idle_seconds, progress=progress)
        results["transfer"] = transfer
        text += ["", "fetches through two nodes vs the raw operations beneath "
                 "(same run, same two processes):", bench_transfer.format_table(transfer)]
    print(json.dumps(results) if args.json else "\n".join(text).strip("\n"))
    return 0


def _cmd_sim_demo(args: argparse.Namespace) -> int:
    from p2pfsm.sim.demo import run_demo

    summary = run_demo(seed=args.seed, blocks=args.blocks)
    if args.json:
        print(json.dumps(summary))
    else:
        lines = summary["lines"]
        assert isinstance(lines, list)
        print("\n".join(str(line) for line in lines))
    return 0 if summary["ok"] else 1


def _positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value
    return parse


def _peer_of(url: str) -> str:
    if not url.startswith("tcp://") or ":" not in url[6:]:
        raise ConfigError(f"--connect: expected tcp://HOST:PORT, got {url!r}")
    return url[len("tcp://"):]


def _node_config(args: argparse.Namespace, bind: str, blocks: int) -> Any:
    from p2pfsm.executor.node import NodeConfig
    from p2pfsm.session import Timeouts

    timeouts = Timeouts(
        load=getattr(args, "load_timeout", 30.0),
        abort_ack=getattr(args, "abort_ack_timeout", 10.0),
        handshake=getattr(args, "timeout", 30.0),
    )
    return NodeConfig(bind=bind, num_blocks=blocks, block_len=args.block_len,
                      hash_seed=args.hash_seed, fingerprint=args.fingerprint, timeouts=timeouts,
                      connect_timeout_ms=max(1, round(args.connect_timeout * 1000)),
                      trace=args.trace)


def _cmd_serve(args: argparse.Namespace) -> int:
    from p2pfsm.demo.host import DemoServer

    server = DemoServer(_node_config(args, args.bind, args.blocks))
    stop = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"serving {args.blocks} blocks of {args.block_len} B on "
          f"tcp://{server.node.local_id}", flush=True)
    try:
        server.node.serve(lambda: stop)
    finally:
        server.node.close()
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from p2pfsm.demo.host import parse_keys, run_fetch
    from p2pfsm.executor.node import Node

    peer = _peer_of(args.connect)
    blocks = parse_keys(args.keys)
    node = Node(_node_config(args, args.bind, max(len(blocks), 1)))
    try:
        report = run_fetch(node, peer, blocks, args.mode, args.timeout)
    finally:
        node.close()
    print(json.dumps(report.__dict__))
    return 0 if report.success and report.verified else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.sim:
        return _cmd_sim_demo(args)
    from p2pfsm.demo.run import run_demo

    summary = run_demo(blocks=args.blocks, block_len=args.block_len)
    if args.json:
        print(json.dumps(summary))
    else:
        lines = summary["lines"]
        assert isinstance(lines, list)
        print("\n".join(str(line) for line in lines))
    return 0 if summary["ok"] else 1


def _add_peer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block-len", type=_positive(int), default=4096, help="bytes per block")
    p.add_argument("--hash-seed", default="vllm-none-hash", help="prefix-cache hash seed")
    p.add_argument("--fingerprint", default="", help="model-config fingerprint (16 hex)")
    p.add_argument("--connect-timeout", type=_positive(float), default=10.0, metavar="SECONDS",
                   help="give up a peer connection not up by then (a refused one at once)")
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="write each session call that is a spec action to FILE (JSON lines)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="p2pfsm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("demo", help="start a server process, fetch from it, verify every byte")
    p.add_argument("--blocks", type=int, default=16, help="blocks to move (1-64)")
    p.add_argument("--block-len", type=_positive(int), default=65536, help="bytes per block")
    p.add_argument("--sim", action="store_true", help="run in the simulated world instead")
    p.add_argument("--seed", type=int, default=1, help="seed of the simulated network (--sim)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("serve", help="serve the demo block model until stopped")
    p.add_argument("--bind", required=True, help="tcp://HOST:PORT (port 0: any free port)")
    p.add_argument("--blocks", type=_positive(int), default=256, help="blocks held (0..N-1)")
    _add_peer_options(p)
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("fetch", help="fetch demo blocks from a server and verify them")
    p.add_argument("--connect", required=True, help="tcp://HOST:PORT of the server")
    p.add_argument("--keys", default="0-15", help="block numbers, e.g. 0-15 or 0-3,9999")
    p.add_argument("--mode", choices=("pd", "sym"), default="pd",
                   help="pd: fetch directly; sym: lookup, then fetch the hits")
    p.add_argument("--bind", default="tcp://127.0.0.1:0", help="our own ROUTER address")
    p.add_argument("--load-timeout", type=_positive(float), default=30.0)
    p.add_argument("--abort-ack-timeout", type=_positive(float), default=10.0)
    p.add_argument("--timeout", type=_positive(float), default=30.0, help="handshake deadline")
    _add_peer_options(p)
    p.set_defaults(func=_cmd_fetch)

    p = sub.add_parser("diagrams", help="draw every machine of models/ into docs/diagrams")
    p.add_argument("--out", default="docs/diagrams", help="output directory")
    p.add_argument("--check", action="store_true", help="exit 1 when committed diagrams are stale")
    p.set_defaults(func=_cmd_diagrams)

    p = sub.add_parser("check", help="model-check the TLA+ spec with TLC", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("bench", help="measure and print ratios against raw operations")
    p.add_argument("--suite", choices=("fsm", "transfer", "all"), default="all",
                   help="fsm: control events through the machines; transfer: fetches "
                        "between two processes; all: both")
    p.add_argument("--number", type=_positive(int), default=2000,
                   help="fsm: iterations per sample")
    p.add_argument("--rounds", type=_positive(int), default=30,
                   help="transfer: rounds per measurement (at least 2)")
    p.add_argument("--per-round", type=_positive(int), default=50,
                   help="transfer: small fetches and raw round trips per round")
    p.add_argument("--idle-seconds", type=_positive(float), default=10.0,
                   help="transfer: idle window of the CPU measurement")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        # `check` has its own parser (p2pfsm.verify); hand it every remaining argument.
        return _guard(lambda: _cmd_check(argparse.Namespace(rest=argv[1:])))
    args = parser.parse_args(argv)
    func: Command = args.func
    return _guard(lambda: func(args))


def _guard(run: Callable[[], int]) -> int:
    """Run a command; expected failures become one error line and exit status 2."""
    try:
        return run()
    except P2PFSMError as exc:
        print(f"p2pfsm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
