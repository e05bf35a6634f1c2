"""The ``p2pfsm`` command line: demo, serve, fetch, keygen, diagrams, check, bench, conform.

Every command prints one clear error line and exits 2 on bad arguments or a
refused operation; no traceback reaches the user for expected failures. Sizes are
checked before anything is allocated. Global options: ``--version``; ``-v`` (INFO),
``-vv`` (DEBUG) and ``-q`` (errors only, no progress lines) set the level of the
``p2pfsm`` logger, which writes to stderr (WARNING by default). Output cut short by a
closed pipe (``p2pfsm check --json | head -1``) ends the command quietly, exit 141.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from p2pfsm.errors import ConfigError, P2PFSMError, TransportError
from p2pfsm.tools.argtypes import fingerprint_arg, peer_of, positive
from p2pfsm.tools.bench.command import add_arguments as add_bench_arguments
from p2pfsm.tools.conform.command import add_arguments as add_conform_arguments

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
PROBE_TIMEOUT = 1.0
"""Seconds ``fetch`` waits for its TCP probe of the peer before starting the node."""

log = logging.getLogger("p2pfsm.tools.cli")

Command = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"p2pfsm: error: {message}\n")


def _cmd_diagrams(args: argparse.Namespace) -> int:
    from p2pfsm.fsm import machines
    from p2pfsm.tools import diagrams

    out = Path(args.out) if args.out is not None else diagrams.default_out()
    specs = machines()
    if args.check:
        stale = diagrams.stale(specs, out)
        if stale:
            again = "p2pfsm diagrams" + ("" if args.out is None else f" --out {out}")
            print(f"p2pfsm: stale diagrams (run `{again}`): {', '.join(stale)}",
                  file=sys.stderr)
            return 1
        print(f"diagrams up to date: {len(specs)} machines in {out}")
        return 0
    count, svgs = diagrams.write(specs, out)
    tables = (", tla/MachineTables.tla and the architecture page's fact lists"
              if count > len(specs) + 2 else "")
    print(f"wrote {count} generated files (diagrams in {out}, the page "
          f"{diagrams.page_path(out)}{tables})"
          + (f" and {len(svgs)} SVGs" if svgs else "; no graphviz `dot`: no SVG"))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    try:
        verify = importlib.import_module("p2pfsm.tools.verify")
    except ImportError as exc:
        raise P2PFSMError(f"model checking is not available ({exc}): "
                          "pip install 'p2pfsm[check]'") from exc
    rest = list(args.rest)
    if getattr(args, "quiet", False) and "-q" not in rest and "--quiet" not in rest:
        rest.append("--quiet")
    return int(verify.check_main(rest))


def _cmd_bench(args: argparse.Namespace) -> int:
    from p2pfsm.tools.bench.command import run

    return run(args)


def _cmd_conform(args: argparse.Namespace) -> int:
    from p2pfsm.tools.conform.command import run

    return run(args)


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


def _split_host_port(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); port 0..65535."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535 or " " in host:
        raise ConfigError(f"{what}: expected HOST:PORT, got {text!r}")
    return host, int(port)


def _probe(peer: str, timeout: float) -> None:
    """A plain TCP connect to the peer, before torch, NIXL and the node start (seconds):
    a refused or unresolvable peer is reported at once. Anything else (a timeout, an
    unreachable network) is left to the node and its ``--connect-timeout``."""
    host, port = _split_host_port(peer, "--connect")
    started = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except ConnectionRefusedError:
        raise TransportError(f"cannot reach {peer}: transport lost: connection refused") from None
    except socket.gaierror as exc:
        raise TransportError(f"cannot reach {peer}: cannot resolve {host!r}: {exc}") from None
    except OSError as exc:
        log.info("probe of %s: %s; leaving it to the node", peer, exc)
    else:
        log.debug("probe of %s: accepted in %.1f ms", peer, (time.monotonic() - started) * 1e3)


def _node_config(args: argparse.Namespace, bind: str, blocks: int, **extra: Any) -> Any:
    from p2pfsm.executor.node import NodeConfig
    from p2pfsm.session import Timeouts

    timeouts = Timeouts(
        load=getattr(args, "load_timeout", 30.0),
        abort_ack=getattr(args, "abort_ack_timeout", 10.0),
        handshake=getattr(args, "timeout", 30.0),
    )
    curve_secret = getattr(args, "curve_secret", None)
    allow = tuple(getattr(args, "allow", None) or ())
    peer_key = getattr(args, "peer_key", None)
    if curve_secret is not None or allow or peer_key is not None:
        if curve_secret is None:
            raise ConfigError("--allow / --peer-key need --curve-secret FILE")
        if not allow:
            raise ConfigError("--curve-secret needs --allow FILE_OR_DIR (the peers' public keys)")
        extra.update(curve_secret_key=curve_secret, curve_allow=allow)
        if peer_key is not None:
            extra["curve_peer_key"] = peer_key
    if getattr(args, "dial_back_any_host", False):
        extra["dial_back_any_host"] = True
    if getattr(args, "answer_lookups_in_parts", False):
        extra["answer_lookups_in_parts"] = True
    return NodeConfig(bind=bind, num_blocks=blocks, block_len=args.block_len,
                      hash_seed=args.hash_seed, fingerprint=args.fingerprint, timeouts=timeouts,
                      connect_timeout_ms=max(1, round(args.connect_timeout * 1000)),
                      trace=args.trace, **extra)


def _cmd_keygen(args: argparse.Namespace) -> int:
    import zmq.auth

    name = args.name
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"--name: expected a plain file name, got {name!r}")
    out = Path(args.dir)
    public, secret = out / f"{name}.key", out / f"{name}.key_secret"
    for path in (public, secret):
        if path.exists():
            raise ConfigError(f"{path} exists: not overwriting a key")
    try:
        out.mkdir(parents=True, exist_ok=True)
        old = os.umask(0o077)  # the secret key is readable by its owner only
        try:
            written = zmq.auth.create_certificates(str(out), name)
        finally:
            os.umask(old)
        os.chmod(public, 0o644)
    except OSError as exc:
        raise ConfigError(f"cannot write keys in {out}: {exc}") from None
    print(f"public key {written[0]}\nsecret key {written[1]}")
    return 0


def _metrics_address(text: str | None) -> tuple[str, int] | None:
    """Validate ``--metrics HOST:PORT`` and that prometheus_client is importable."""
    if text is None:
        return None
    host, port = _split_host_port(text, "--metrics")
    try:
        importlib.import_module("prometheus_client")
    except ImportError as exc:
        raise ConfigError(f"--metrics needs prometheus_client ({exc}): "
                          "pip install 'p2pfsm[prometheus]'") from None
    return host, port


def _start_metrics(node: Any, address: tuple[str, int]) -> Any:
    """Serve ``node.metrics`` on ``address``; returns the server (``.url``, ``.close()``)."""
    try:
        from p2pfsm.prometheus import serve_metrics
    except ImportError as exc:
        raise ConfigError(f"--metrics is not available: {exc}") from None
    source = getattr(node, "metrics", None)
    if source is None:
        raise ConfigError("--metrics: this node keeps no metrics")
    host, port = address
    try:
        return serve_metrics(node, host, port)  # labelled node=<local_id>, as a library
    except OSError as exc:
        raise ConfigError(f"--metrics: cannot serve on {host}:{port}: {exc}") from None


def serve_config(args: argparse.Namespace) -> Any:
    """The NodeConfig of ``p2pfsm serve`` (``--advertise-host``, ``--max-peers`` and
    ``--max-new-peers-per-s`` passed only when given, so the node's own defaults apply
    otherwise)."""
    extra: dict[str, Any] = {}
    if args.advertise_host is not None:
        extra["advertise_host"] = args.advertise_host
    if args.max_peers is not None:
        extra["max_peers"] = args.max_peers
    if args.max_new_peers_per_s is not None:
        extra["max_new_peers_per_s"] = args.max_new_peers_per_s
    try:
        return _node_config(args, args.bind, args.blocks, **extra)
    except TypeError as exc:  # a node without those fields
        raise ConfigError(f"this node does not take {', '.join(extra)}: {exc}") from None


def _cmd_serve(args: argparse.Namespace) -> int:
    from p2pfsm.tools.demo.host import check_region, parse_keys, require_data_plane

    check_region(args.blocks, args.block_len)
    metrics_at = _metrics_address(args.metrics)
    config = serve_config(args)
    require_data_plane()
    from p2pfsm.tools.demo.host import DemoServer

    hold_back = parse_keys(args.hold_back) if args.hold_back else []
    server = DemoServer(config, hold_back, args.late_after)
    stop = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    metrics = None
    try:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        if metrics_at is not None:
            metrics = _start_metrics(server.node, metrics_at)
            print(f"metrics on {metrics.url}", file=sys.stderr, flush=True)
        print(f"serving {args.blocks} blocks of {args.block_len} B on "
              f"tcp://{server.node.local_id}", flush=True)
        server.serve(lambda: stop)
    finally:
        if metrics is not None:
            metrics.close()
        server.node.close()
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from p2pfsm.tools.demo.host import check_region, parse_keys, require_data_plane

    peer = peer_of(args.connect)
    blocks = parse_keys(args.keys)
    check_region(len(blocks), args.block_len, what="--keys")
    _probe(peer, min(PROBE_TIMEOUT, args.connect_timeout))
    require_data_plane()
    from p2pfsm.executor.node import Node
    from p2pfsm.tools.demo.host import run_fetch

    node = Node(_node_config(args, args.bind, max(len(blocks), 1)))
    reports = []
    try:
        for attempt in range(args.repeat):
            if attempt:  # the same request again, into the same (zeroed) blocks
                node.region[:len(blocks)].zero_()
            reports.append(run_fetch(node, peer, blocks, args.mode, args.timeout))
    finally:
        node.close()
    out = dict(reports[-1].__dict__)
    if args.repeat > 1:
        out["attempts"] = [r.__dict__ for r in reports]
    print(json.dumps(out))
    return 0 if all(r.success and r.verified for r in reports) else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.sim:
        return _cmd_sim_demo(args)
    from p2pfsm.tools.demo.run import run_demo

    summary = run_demo(blocks=args.blocks, block_len=args.block_len)
    if args.json:
        print(json.dumps(summary))
    else:
        lines = summary["lines"]
        assert isinstance(lines, list)
        print("\n".join(str(line) for line in lines))
    return 0 if summary["ok"] else 1


def _add_peer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--block-len", type=positive(int), default=4096, help="bytes per block")
    p.add_argument("--hash-seed", default="vllm-none-hash", help="prefix-cache hash seed")
    p.add_argument("--fingerprint", type=fingerprint_arg, default="",
                   help="model-config fingerprint: 16 hex digits, or '' (the default, as "
                        "a NodeConfig without model_config) for none")
    p.add_argument("--connect-timeout", type=positive(float), default=10.0, metavar="SECONDS",
                   help="give up a peer connection not up by then (a refused one at once)")
    p.add_argument("--trace", metavar="FILE", default=None,
                   help="write each session call that is a spec action to FILE (JSON lines)")
    p.add_argument("--curve-secret", metavar="FILE", default=None,
                   help="our NAME.key_secret (p2pfsm keygen): ZeroMQ CURVE on every "
                        "connection; needs --allow. Default: NULL security (vLLM's)")
    p.add_argument("--allow", metavar="FILE_OR_DIR", action="append", default=None,
                   help="public key file of a peer let in, or a directory of *.key files "
                        "(repeatable)")


def _verbosity(parser: argparse.ArgumentParser, dest: str) -> None:
    """-v/-q; on the main parser and again on each command (``p2pfsm serve -v``)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="count", default=0, dest=f"{dest}verbose",
                       help="log more to stderr: -v INFO, -vv DEBUG (default: WARNING)")
    group.add_argument("-q", "--quiet", action="store_true", dest=f"{dest}quiet",
                       help="log errors only; no progress lines")


def version() -> str:
    """The installed distribution's version (the package's own when not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("p2pfsm")
    except PackageNotFoundError:
        import p2pfsm

        return p2pfsm.__version__


def _global_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="p2pfsm", description=(__doc__ or "").replace("``", ""),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"p2pfsm {version()}")
    _verbosity(parser, "")
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = _global_parser()
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name, **kwargs)
        if kwargs.get("add_help", True):
            _verbosity(p, "sub_")
        return p

    p = command("demo", help="start a server process, fetch from it, verify every byte")
    p.add_argument("--blocks", type=int, default=16, help="blocks to move (1-64)")
    p.add_argument("--block-len", type=positive(int), default=65536, help="bytes per block")
    p.add_argument("--sim", action="store_true", help="run in the simulated world instead")
    p.add_argument("--seed", type=int, default=1, help="seed of the simulated network (--sim)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_demo)

    p = command("serve", help="serve the demo block model until stopped")
    p.add_argument("--bind", required=True,
                   help="HOST:PORT or tcp://HOST:PORT (port 0: any free port)")
    p.add_argument("--blocks", type=positive(int), default=256,
                   help="blocks held (0..N-1); blocks x (block-len + 512 B) must fit in "
                        "the memory available, and N <= 2**31")
    p.add_argument("--advertise-host", default=None, metavar="HOST",
                   help="the host peers dial back and see in our id (default: the bind "
                        "host; needed when binding 0.0.0.0)")
    p.add_argument("--max-peers", type=positive(int), default=None, metavar="N",
                   help="most peer connections at once (default: the node's, 128)")
    p.add_argument("--max-new-peers-per-s", type=positive(int), default=None, metavar="N",
                   help="new peer identities admitted per source host and second, a "
                        "burst of N at once; more are dropped (default: the node's, 500)")
    p.add_argument("--metrics", default=None, metavar="HOST:PORT",
                   help="serve Prometheus metrics on http://HOST:PORT/metrics "
                        "(needs prometheus_client: pip install 'p2pfsm[prometheus]')")
    p.add_argument("--dial-back-any-host", action="store_true",
                   help="dial a connecting peer back at the host its id names even when "
                        "its connection comes from another address (peers behind NAT)")
    p.add_argument("--answer-lookups-in-parts", action="store_true",
                   help="answer a lookup's keys as they resolve (one lookup_resp for the "
                        "keys held now, one per later answer) instead of in one reply")
    p.add_argument("--hold-back", default="", metavar="BLOCKS",
                   help="blocks (e.g. 12-15) stored only --late-after s after a request "
                        "first asks for them: a fetch waits for them as demand, a lookup "
                        "leaves them pending")
    p.add_argument("--late-after", type=positive(float), default=1.0, metavar="SECONDS",
                   help="--hold-back: how late (default: 1)")
    _add_peer_options(p)
    p.set_defaults(func=_cmd_serve)

    p = command("fetch", help="fetch demo blocks from a server and verify them")
    p.add_argument("--connect", required=True, help="HOST:PORT or tcp://HOST:PORT of the server")
    p.add_argument("--keys", default="0-15",
                   help="block numbers, e.g. 0-15 or 0-3,9999 (at most 65536 keys)")
    p.add_argument("--mode", choices=("pd", "sym"), default="pd",
                   help="pd: fetch directly; sym: lookup, then fetch the hits")
    p.add_argument("--bind", default="tcp://127.0.0.1:0", help="our own ROUTER address")
    p.add_argument("--load-timeout", type=positive(float), default=30.0)
    p.add_argument("--abort-ack-timeout", type=positive(float), default=10.0)
    p.add_argument("--timeout", type=positive(float), default=30.0, help="handshake deadline")
    p.add_argument("--repeat", type=positive(int), default=1,
                   help="fetch this many times, one after another, under the same request "
                        "id (each needs its own round; exit 0 only if every one loaded)")
    p.add_argument("--peer-key", metavar="FILE", default=None,
                   help="the server's public key file (default: the --allow key, when "
                        "there is exactly one)")
    _add_peer_options(p)
    p.set_defaults(func=_cmd_fetch)

    p = command("keygen", help="write a CURVE keypair: DIR/NAME.key and DIR/NAME.key_secret")
    p.add_argument("dir", metavar="DIR", help="directory to write into (created if missing)")
    p.add_argument("--name", default="node", help="file name of the pair (default: node)")
    p.set_defaults(func=_cmd_keygen)

    p = command("diagrams", help="draw every machine of models/ into docs/diagrams")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output directory (default: docs/diagrams of the source checkout, "
                        "when run inside it; required anywhere else)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when the diagrams in the output directory are stale")
    p.set_defaults(func=_cmd_diagrams)

    p = command("check", help="model-check the TLA+ spec with TLC", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_check)

    p = command("bench", help="measure and print ratios against raw operations")
    add_bench_arguments(p)
    p.set_defaults(func=_cmd_bench)

    p = command("conform", help="run the conformance suite against any implementation")
    add_conform_arguments(p)
    p.set_defaults(func=_cmd_conform)
    return parser


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record.short = record.name.removeprefix("p2pfsm.").removeprefix("tools.")
        return super().format(record)


def configure_logging(verbose: int, quiet: bool) -> None:
    """The ``p2pfsm`` logger to stderr: WARNING, -v INFO, -vv DEBUG, -q ERROR."""
    if quiet:
        level = logging.ERROR
    else:
        level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logger = logging.getLogger("p2pfsm")
    logger.setLevel(level)
    logger.propagate = False
    for handler in list(logger.handlers):
        if getattr(handler, "_p2pfsm_cli", False):
            logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Format("p2pfsm %(levelname)s %(short)s: %(message)s"))
    handler._p2pfsm_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)


def _settle_verbosity(args: argparse.Namespace) -> None:
    verbose = getattr(args, "verbose", 0) + getattr(args, "sub_verbose", 0)
    quiet = getattr(args, "quiet", False) or getattr(args, "sub_quiet", False)
    if verbose and quiet:
        raise ConfigError("-v and -q: choose one")
    args.verbose, args.quiet = verbose, quiet
    configure_logging(verbose, quiet)


def _command_index(argv: Sequence[str]) -> int:
    """Index of the command word (the first argument not an option), or len(argv)."""
    return next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))


def _run(argv: list[str]) -> int:
    at = _command_index(argv)
    if argv[at:at + 1] == ["check"]:
        # `check` has its own parser (p2pfsm.tools.verify); hand it every remaining argument.
        args = _global_parser().parse_args(argv[:at])
        rest = argv[at + 1:]
        quick = argparse.ArgumentParser(add_help=False)
        _verbosity(quick, "sub_")
        known, _ = quick.parse_known_args(rest)
        args.sub_verbose, args.sub_quiet = known.sub_verbose, known.sub_quiet
        args.rest = rest

        def check() -> int:
            _settle_verbosity(args)
            return _cmd_check(args)
        return _guard(check)
    args = build_parser().parse_args(argv)
    func: Command = args.func

    def command() -> int:
        _settle_verbosity(args)
        return func(args)
    return _guard(command)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # UCX logs (an ERROR line when a peer's listener is gone, any line at a raised
    # UCX_LOG_LEVEL) go to stdout by default, which --json output must own alone; unless
    # the user chose a log file, send them to stderr. Read when NIXL first loads UCX, and
    # inherited by the processes a command spawns.
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    try:
        try:
            code = _run(argv)
        except SystemExit:  # argparse's --help, --version and usage errors
            sys.stdout.flush()
            raise
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`p2pfsm check --json | head -1`): stop quietly, as a
        # command killed by SIGPIPE would, and keep Python from failing to flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code


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
