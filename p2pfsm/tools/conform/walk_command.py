"""``p2pfsm conform --random`` and ``--replay``: run the walk, print the shortest failing
case in the models' terms with the command that replays it, write the replay file."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from p2pfsm.errors import ConfigError
from p2pfsm.tools.conform.counterexample import read_replay, write_replay
from p2pfsm.tools.conform.random_walk import Budget, WalkReport, run_random, run_replay
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.verdict import CaseResult
from p2pfsm.tools.verify.tlc import TlcNotFound

__all__ = ["run_walk_mode"]


def _replay_path(args: argparse.Namespace, name: str) -> Path:
    near = args.json or args.markdown
    folder = Path(near).parent if near else Path.cwd()
    return folder / f"conform-{name}.replay.json"


def run_walk_mode(args: argparse.Namespace, target: Target, rerun: Callable[[], list[str]],
                  progress: Callable[[CaseResult], None]) -> tuple[list[CaseResult], bool]:
    """Run the walk or the replay ``args`` ask for; (its results, whether it failed).
    ``rerun()``: the words of a command against the same target and configuration."""
    if args.replay is not None:
        out = Path(args.replay)
        rep: WalkReport = run_replay(target, read_replay(out), out.stem.split(".")[0])
    else:
        spec_log = Path(args.validate_spec) if args.validate_spec else None
        try:
            rep = run_random(target, args.random, args.seed, args.faults,
                             Budget(args.shrink_runs, args.shrink_seconds), spec_log)
        except TlcNotFound as exc:
            raise ConfigError(f"--validate-spec: {exc}") from None
        out = _replay_path(args, f"random-seed-{args.seed}")
    progress(rep.result)
    if rep.outcome.failure is None:
        return [rep.result], False
    if args.replay is None:
        write_replay(out, args.target, rep.rule, rep.case, seed=args.seed,
                     faults=list(args.faults), original_steps=rep.original,
                     confirmed=rep.confirmed)
    again = shlex.join([*rerun(), "--replay", str(out)])
    head = (f"FAIL {rep.result.case}: rule {rep.rule}; shortest case found: "
            f"{len(rep.case)} step(s) of {rep.original}, {rep.replays} replay(s)"
            + ("" if rep.confirmed or args.replay is not None
               else " (a replay did NOT fail again: timing-dependent)"))
    print(f"{head}\n{rep.counterexample}\n  replay: {again}", file=sys.stderr)
    return [rep.result], True

