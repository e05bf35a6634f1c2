"""``p2pfsm conform``: its options, and the driver that runs the cases and reports them."""

from __future__ import annotations

import argparse
import shlex
import socket
import sys
from pathlib import Path

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.tools.argtypes import fingerprint_arg, positive
from p2pfsm.tools.conform.faults import FAULTS, faults_arg
from p2pfsm.tools.conform.profiles import PROFILES

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``p2pfsm conform``."""
    p.add_argument("--target", default=None, metavar="tcp://HOST:PORT",
                   help="the implementation under test (its ROUTER; HOST:PORT is also the "
                        "identity it must present); required unless --list")
    p.add_argument("--role", choices=("producer", "consumer"), default="producer",
                   help="the role tested; the tester takes the other (default: producer)")
    p.add_argument("--profile", choices=PROFILES, default="native",
                   help="whose behaviour the target is meant to have: p2pfsm's (native, "
                        "the default) or a vLLM release's; cases whose expected outcome "
                        "differs by release are marked with this profile's")
    p.add_argument("--consumer-cmd", default=None, metavar="COMMAND",
                   help="--role consumer: the command that runs the consumer under test "
                        "against our producer, with {addr} (our HOST:PORT), {keys}, {mode} "
                        "(pd|sym), {load_timeout}, {abort_ack_timeout} and {repeat} filled "
                        "in; exit 0 = every load done and verified")
    p.add_argument("--cases", default=None, metavar="ID,...",
                   help="only these cases (default: every case of the role); --list "
                        "shows them")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--random", type=positive(int), default=None, metavar="STEPS",
                   help="instead of the directed cases, a seeded random walk of STEPS "
                        "actions of the tester's role (the consumer's against a producer, "
                        "the producer's against a consumer)")
    p.add_argument("--seed", type=int, default=1,
                   help="--random: the walk's seed (the same seed draws the same walk "
                        "where the target's timing agrees)")
    p.add_argument("--faults", type=faults_arg, default=FAULTS, metavar="LIST",
                   help="--random: the faults the walk may draw: all (default), none, or "
                        f"some of {','.join(FAULTS)} (the consumer role's walk: delay, "
                        "pause)")
    p.add_argument("--replay", default=None, metavar="FILE",
                   help="run the case of a replay file (written by a failing --random) "
                        "once, instead of the directed cases")
    p.add_argument("--validate-spec", default=None, metavar="TARGET_TRACE_LOG",
                   help="--random: walk inside the TLA+ spec's trace bounds and check the "
                        "walk with TLC trace validation, merged with the target's own "
                        "trace log (e.g. p2pfsm serve --trace FILE)")
    p.add_argument("--shrink-runs", type=positive(int), default=24, metavar="N",
                   help="--random: at most N re-runs to shrink a failing walk")
    p.add_argument("--shrink-seconds", type=positive(float), default=120.0,
                   metavar="SECONDS", help="--random: at most this long shrinking")
    p.add_argument("--json", default=None, metavar="FILE", help="write the JSON report")
    p.add_argument("--markdown", default=None, metavar="FILE",
                   help="write the Markdown report")
    p.add_argument("--block-len", type=positive(int), default=4096,
                   help="the target's bytes per block")
    p.add_argument("--hash-seed", default="vllm-none-hash", help="the target's hash seed")
    p.add_argument("--fingerprint", type=fingerprint_arg, default="",
                   help="the target's config fingerprint (16 hex digits, or '')")
    p.add_argument("--target-blocks", type=positive(int), default=16, metavar="N",
                   help="demo blocks 0..N-1 the target holds (p2pfsm.demo_blocks)")
    p.add_argument("--late-blocks", default="", metavar="BLOCKS",
                   help="demo blocks (e.g. 16-19) the target holds but stores only some "
                        "time after a request asks for them (its host's late supply)")
    p.add_argument("--window", type=positive(float), default=1.0, metavar="SECONDS",
                   help="observation window of a 'the target sends nothing' check")
    p.add_argument("--deadline", type=positive(float), default=10.0, metavar="SECONDS",
                   help="how long the target has for an answer it owes")


def _target_addr(url: str) -> tuple[str, str, int]:
    addr = url[len("tcp://"):] if url.startswith("tcp://") else url
    host, sep, port = addr.rpartition(":")
    if not sep or not host or "/" in host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--target: expected HOST:PORT or tcp://HOST:PORT, got {url!r}")
    return addr, host.strip("[]"), int(port)


def _probe(host: str, port: int, url: str, timeout: float) -> None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        raise TransportError(f"cannot reach {url}: {exc.strerror or exc}") from None


def _late_blocks(text: str) -> tuple[int, ...]:
    from p2pfsm.tools.demo.host import parse_keys

    try:
        return tuple(parse_keys(text)) if text else ()
    except ConfigError as exc:
        raise ConfigError(f"--late-blocks: {exc}") from None


def rerun_command(args: argparse.Namespace, case_id: str) -> str:
    """The command line that runs ``case_id`` (ids, comma-separated; "" for every case of
    the role) against the same target."""
    words = (["p2pfsm", "conform", "--role", args.role, "--consumer-cmd", args.consumer_cmd]
             if args.role == "consumer" else
             ["p2pfsm", "conform", "--target", args.target, "--role", args.role])
    if case_id:
        words += ["--cases", case_id]
    if getattr(args, "profile", "native") != "native":
        words += ["--profile", args.profile]
    for opt, default in (("block_len", 4096), ("hash_seed", "vllm-none-hash"),
                         ("fingerprint", ""), ("target_blocks", 16), ("window", 1.0),
                         ("deadline", 10.0), ("late_blocks", "")):
        value = getattr(args, opt)
        if value != default:
            words += [f"--{opt.replace('_', '-')}", str(value)]
    return shlex.join(words)


def run(args: argparse.Namespace) -> int:
    """Run what ``args`` asks for; 0 when every applicable case passed, 1 otherwise."""
    from p2pfsm.tools.conform import report
    from p2pfsm.tools.conform.runner import cases_for, run_cases
    from p2pfsm.tools.conform.target import Target

    ids = [i.strip() for i in args.cases.split(",") if i.strip()] if args.cases else None
    cases = cases_for(args.role, ids)
    if args.list:
        for c in cases:
            print(f"{c.id:28} {c.role:9} {c.description}")
        return 0
    if not cases:
        raise ConfigError(f"no case for the {args.role} role yet")
    if args.random is not None and args.replay is not None:
        raise ConfigError("--random and --replay exclude each other")
    if args.validate_spec is not None and args.role != "producer":
        raise ConfigError("--validate-spec: only the producer role's walk is checked by TLC")
    if args.validate_spec is not None and args.random is None:
        raise ConfigError("--validate-spec needs --random STEPS")
    if args.validate_spec is not None and not Path(args.validate_spec).is_file():
        raise ConfigError(f"--validate-spec: no trace log at {args.validate_spec}")
    if args.replay is not None:
        from p2pfsm.tools.conform.counterexample import read_replay

        read_replay(Path(args.replay))  # a bad file is a bad argument, before any probe
    if args.role == "consumer":
        if not args.consumer_cmd:
            raise ConfigError("--role consumer needs --consumer-cmd COMMAND")
        target = Target("", args.block_len, args.hash_seed, args.fingerprint,
                        args.target_blocks, args.window, args.deadline, args.consumer_cmd)
        args.target = f"consumer: {args.consumer_cmd}"
    else:
        if args.target is None:
            raise ConfigError("--target tcp://HOST:PORT is required")
        addr, host, port = _target_addr(args.target)
        _probe(host, port, args.target, args.deadline)
        target = Target(addr, args.block_len, args.hash_seed, args.fingerprint,
                        args.target_blocks, args.window, args.deadline,
                        late_blocks=_late_blocks(args.late_blocks))

    def progress(r: object) -> None:
        if not args.quiet:
            print(report.summary_line(r), flush=True)  # type: ignore[arg-type]

    if args.random is not None or args.replay is not None:
        from p2pfsm.tools.conform.walk_command import run_walk_mode

        results, _failed = run_walk_mode(
            args, target, lambda: shlex.split(rerun_command(args, "")), progress)
    else:
        results = run_cases(target, cases, progress, args.profile)
        for r in results:
            if r.verdict == "fail":
                print(report.failure_text(r, rerun_command(args, r.case)), file=sys.stderr)
    command = shlex.join(["p2pfsm", "conform", *sys.argv[2:]]) if sys.argv[1:2] == [
        "conform"] else rerun_command(args, args.cases or "")
    failed = [r for r in results if r.verdict == "fail"]
    if args.json:
        Path(args.json).write_text(report.as_json(args.target, command, results))
    if args.markdown:
        Path(args.markdown).write_text(report.as_markdown(args.target, command, results))
    if results and results[-1].cannot_test:  # the rest would fail the same way
        print(results[-1].cannot_test)
        return 2
    counts = {v: sum(r.verdict == v for r in results) for v in ("pass", "fail", "n/a")}
    print(f"{counts['pass']} pass, {counts['fail']} fail, {counts['n/a']} not applicable "
          f"({len(results)} cases against {args.target})")
    return 1 if failed else 0
