"""The ``p2pfsm`` command line: demo, diagrams, check, bench (and the executor's commands).

Every command prints one clear error line and exits 2 on bad arguments or a
refused operation; no traceback reaches the user for expected failures.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from p2pfsm.errors import P2PFSMError

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
    from p2pfsm import bench_fsm

    rows = bench_fsm.run(number=args.number)
    if args.json:
        print(json.dumps({"fsm": [r.__dict__ for r in rows]}))
    else:
        print("control event through the machines (consumer session, medians):")
        print(bench_fsm.format_rows(rows))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from p2pfsm.sim_demo import run_demo

    summary = run_demo(seed=args.seed, blocks=args.blocks)
    if args.json:
        print(json.dumps(summary))
    else:
        lines = summary["lines"]
        assert isinstance(lines, list)
        print("\n".join(str(line) for line in lines))
    return 0 if summary["ok"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="p2pfsm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("demo", help="run a two-peer transfer and verify every byte")
    p.add_argument("--seed", type=int, default=1, help="seed of the simulated network")
    p.add_argument("--blocks", type=int, default=16, help="blocks to move (1-64)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("diagrams", help="draw every machine of models/ into docs/diagrams")
    p.add_argument("--out", default="docs/diagrams", help="output directory")
    p.add_argument("--check", action="store_true", help="exit 1 when committed diagrams are stale")
    p.set_defaults(func=_cmd_diagrams)

    p = sub.add_parser("check", help="model-check the TLA+ spec with TLC", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("bench", help="measure and print ratios against raw operations")
    p.add_argument("--number", type=int, default=2000, help="iterations per sample")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Command = args.func
    try:
        return func(args)
    except P2PFSMError as exc:
        print(f"p2pfsm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
