"""``python -m p2pfsm.tools.vllm_peer server|client ...``: the flags, and the start-up that
applies the harness's patches to vLLM (:mod:`p2pfsm.tools.vllm_peer.patches`), installs
p2pfsm's sessions when asked, runs the role and undoes the patches."""

from __future__ import annotations

import argparse
import faulthandler
import signal
import uuid
from collections.abc import Sequence

import p2pfsm.tools.vllm_peer as package
from p2pfsm.tools.vllm_peer import patches
from p2pfsm.tools.vllm_peer.client import run_client
from p2pfsm.tools.vllm_peer.common import STOP
from p2pfsm.tools.vllm_peer.plans import run_concurrent, run_links, run_plan
from p2pfsm.tools.vllm_peer.server import Server


def _on_signal(_sig: int, _frame: object) -> None:
    STOP.requested = True


def build_parser() -> argparse.ArgumentParser:
    """Every flag of both roles (the interop suite, conform and bench use them)."""
    doc = package.__doc__ or ""
    p = argparse.ArgumentParser(prog="python -m p2pfsm.tools.vllm_peer",
                                description=doc.split("\n\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    for name in ("server", "client"):
        q = sub.add_parser(name)
        q.add_argument("--block-len", type=int, default=4096)
        q.add_argument("--hash-seed", default="vllm-none-hash")
        q.add_argument("--config-json", default="",
                       help="model config dict whose fingerprint the peer must match")
        q.add_argument("--max-seconds", type=float, default=120.0, help="hard bound on the run")
        q.add_argument("--adapter", action="store_true",
                       help="run p2pfsm's sessions (p2pfsm.vllm.install()) instead of vLLM's")
        q.add_argument("--full", action="store_true",
                       help="the full install: p2pfsm's sessions, control and data transports "
                            "(p2pfsm.vllm.install(transport='p2pfsm'))")
    s = sub.choices["server"]
    s.add_argument("--blocks", type=int, default=16, help="demo blocks 0..N-1 held")
    s.add_argument("--port", type=int, default=0,
                   help="the loopback port to listen on (0: a free one); a restarted "
                        "server comes back under the same peer id")
    s.add_argument("--hold-back", default="", help="blocks stored only --late-after s later")
    s.add_argument("--late-after", type=float, default=1.0)
    s.add_argument("--finish-after", type=float, default=None,
                   help="finish_request each fetched request this long after its fetch")
    s.add_argument("--finish-prefix", default="",
                   help="--finish-after only for request ids starting with this")
    c = sub.choices["client"]
    c.add_argument("--connect", default="", help="HOST:PORT of the server")
    c.add_argument("--plan", default="",
                   help="a JSON file of steps to run instead of one flow (see run_plan)")
    c.add_argument("--links", default="",
                   help="SESSIONS=HOST:PORT,...: one session each, fetching in turn "
                        "(see run_links; instead of --connect)")
    c.add_argument("--concurrent", type=int, default=0,
                   help="fetches in flight at once (see run_concurrent)")
    c.add_argument("--per-request", type=int, default=4, help="--concurrent: blocks each")
    c.add_argument("--links-count", type=int, default=1, help="--saturate: sessions")
    c.add_argument("--saturate", type=int, default=0, help="--concurrent: fetches to run")
    c.add_argument("--keys", default="0-7")
    c.add_argument("--mode", choices=("pd", "sym"), default="pd")
    c.add_argument("--request-id", default=f"vllm-interop-{uuid.uuid4().hex[:12]}")
    c.add_argument("--load-timeout", type=float, default=30.0,
                   help="patches the release's load timeout constants")
    c.add_argument("--abort-ack-timeout", type=float, default=10.0)
    c.add_argument("--handshake-timeout", type=float, default=30.0)
    c.add_argument("--lookup-timeout", type=float, default=30.0)
    c.add_argument("--linger", type=float, default=0.2, help="keep polling after the result")
    c.add_argument("--repeat", type=int, default=1,
                   help="run the flow this many times, one after another, on the same "
                        "request id (vLLM restarts its round_seq at 0 each time)")
    c.add_argument("--hold-open", type=float, default=0.2,
                   help="keep the session open this long after the 'done' line")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGALRM, _on_signal)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack
    signal.alarm(max(1, int(args.max_seconds)))  # the hard bound, whatever a loop does
    if args.role == "client" and not (args.plan or args.links or args.concurrent
                                      or args.connect):
        raise SystemExit("client: --connect HOST:PORT or --plan FILE is required")
    patches.apply()  # before install(): the guard keeps the close it finds
    try:
        if args.adapter or args.full:
            from p2pfsm.vllm import install

            install("p2pfsm" if args.full else None)  # before any session or transport
        return _run(args)
    finally:
        if args.adapter or args.full:
            from p2pfsm.vllm import uninstall

            uninstall()
        patches.undo()


def _run(args: argparse.Namespace) -> int:
    if args.role == "server":
        Server(args).run()
        return 0
    if args.plan:
        return run_plan(args)
    if args.links:
        return run_links(args)
    if args.concurrent:
        return run_concurrent(args)
    return run_client(args)

