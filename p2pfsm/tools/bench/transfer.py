"""Benchmark: fetches through two Nodes, as ratios against the raw operations beneath.

Two processes on 127.0.0.1: this one (the consumer node) and a spawned peer (a
:class:`~p2pfsm.tools.demo.host.DemoServer`, the producer). Every ratio compares
measurements taken in the same run, between the same two processes, interleaved round
by round so that both sides of a ratio see the same machine load:

(a) ``fetch_large``: a full fetch of 256 x 64 KiB (our ``fetch()`` sends the fetch frame;
    the peer's session matches it with the supply its host gives, its node posts one NIXL
    WRITE, sees it land and sends transfer_done; our session turns that into the
    LoadResult) against two raw NIXL WRITEs of the same blocks into the same region by
    the same data plane of the peer (``DataPlane.write``, then ``poll`` in a tight loop):
    one while this node, the target, runs its own loop as it does while it expects
    blocks, one while it does nothing but UCX progress (the transport's floor: a
    WRITE's completion is an endpoint flush that needs the target to progress).
    Target: <= 1.5x the second.
(b) ``fetch_small``: one 4 KiB block fetched, against a raw ZeroMQ DEALER -> ROUTER ->
    DEALER round trip (the protocol's own pattern) and a tight blocking REQ -> REP round
    trip of a frame the size of that fetch frame, between plain pyzmq sockets in the same
    two processes. Target: <= 1.5x the REQ/REP round trip. Also the fetch's floor: that
    round trip plus a raw NIXL WRITE of the same one block (target spinning), since a
    fetch is one control round trip with one WRITE inside it.
(c) ``idle_cpu``: CPU time (user + system, all threads, ``getrusage``) of each connected
    node while it sits idle for ``idle_seconds``, once its post-handshake warm-up window
    is over. Target: < 1 % of one core.

Medians and p10/p90 are over single operations (``rounds`` rounds, each one raw
operation and one fetch for (a), ``number`` of each for (b)).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from p2pfsm.demo_blocks import demo_key
from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.protocol import Fetch, encode
from p2pfsm.tools.bench.nodes import Fetcher
from p2pfsm.tools.bench.peer import Peer, idle_cpu, node_pair
from p2pfsm.tools.bench.report import Progress

__all__ = ["format_table", "run"]

_LARGE = (256, 64 * 1024)
_SMALL = (16, 4 * 1024)
_TARGETS = {"fetch_large": 1.5, "fetch_small": 1.5, "idle_cpu_percent": 1.0}
_INBOUND_S = 0.05


def _stats(samples: list[float], scale: float) -> dict[str, float]:
    ordered = sorted(samples)
    cuts = (statistics.quantiles(ordered, n=10, method="inclusive") if len(ordered) > 1
            else ordered * 9)
    return {"median": statistics.median(ordered) * scale, "p10": cuts[0] * scale,
            "p90": cuts[-1] * scale, "n": float(len(ordered))}


def _large(peer: Peer, rounds: int, say: Progress) -> dict[str, Any]:
    node, peer_id = node_pair(peer, _LARGE)
    try:
        fetcher = Fetcher(node, peer_id, _LARGE[0], "large")
        for _ in range(3):
            fetcher.once()
        fetcher.verify()
        peer.ask("raw_write", node.local_id, 3, node=node)
        raw: list[float] = []
        fetched: list[float] = []
        prompt: list[float] = []

        def paced() -> None:  # the target as a node that expects inbound writes
            node.data.expect_inbound(_INBOUND_S, prompt=True)
            node.step(0.001)

        for r in range(rounds):
            raw.extend(peer.ask("raw_write", node.local_id, 1, pump=paced)[1])
            prompt.extend(peer.ask("raw_write", node.local_id, 1, pump=node.data.progress)[1])
            fetched.append(fetcher.once())
            if r % 10 == 9:
                say(f"  large: {r + 1}/{rounds} rounds")
    finally:
        node.close()
    raw_s, node_s, prompt_s = _stats(raw, 1e3), _stats(fetched, 1e3), _stats(prompt, 1e3)
    return {"unit": "ms", "blocks": _LARGE[0], "block_len": _LARGE[1],
            "raw": raw_s, "raw_prompt": prompt_s, "node": node_s,
            "ratio": node_s["median"] / raw_s["median"],
            "ratio_prompt": node_s["median"] / prompt_s["median"],
            "target": _TARGETS["fetch_large"]}


def _small(peer: Peer, rounds: int, number: int, idle_seconds: float,
           say: Progress) -> tuple[dict[str, Any], dict[str, Any]]:
    import zmq

    node, peer_id = node_pair(peer, _SMALL)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        fetcher = Fetcher(node, peer_id, 1, "small")
        for _ in range(20):
            fetcher.once()
        fetcher.verify()
        frame = encode(Fetch(f"bench-small-{10**6}", (demo_key(0),), (0,), 10**6))
        router = ctx.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        (_, peer_addr) = peer.ask("echo_setup", f"tcp://127.0.0.1:{port}")
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, f"127.0.0.1:{port}".encode())
        dealer.connect(peer_addr)
        (_, rep_addr) = peer.ask("rep_setup")
        req = ctx.socket(zmq.REQ)
        req.connect(rep_addr)
        raw: list[float] = []
        tight: list[float] = []
        fetched: list[float] = []
        write: list[float] = []
        for r in range(rounds + 1):
            # The fetch's data-plane floor: the same one block written raw, target spinning.
            one = peer.ask("raw_write", node.local_id, number, 1, pump=node.data.progress)[1]
            peer.conn.send(("rep", number))
            rtt = []
            for _ in range(number):  # blocking send and recv: the tightest round trip
                t0 = time.perf_counter()
                req.send(frame)
                if not req.poll(10_000):
                    raise TransportError("raw REQ/REP: no reply within 10 s")
                req.recv()
                rtt.append(time.perf_counter() - t0)
            peer.wait("rep")
            peer.conn.send(("echo", number))
            times = []
            for _ in range(number):
                t0 = time.perf_counter()
                dealer.send(frame)
                if not router.poll(10_000):
                    raise TransportError("raw echo: no reply within 10 s")
                router.recv_multipart()
                times.append(time.perf_counter() - t0)
            peer.wait("echo")
            ours = [fetcher.once() for _ in range(number)]
            if r:  # round 0 warms the raw sockets up
                tight.extend(rtt)
                raw.extend(times)
                write.extend(one)
                fetched.extend(ours)
            if r % 5 == 4:
                say(f"  small: {r + 1}/{rounds} rounds")
        for sock in (dealer, router, req):
            sock.close(linger=0)
        raw_s, node_s, tight_s = _stats(raw, 1e6), _stats(fetched, 1e6), _stats(tight, 1e6)
        write_s = _stats(write, 1e6)
        floor = tight_s["median"] + write_s["median"]
        small = {"unit": "us", "blocks": 1, "block_len": _SMALL[1], "frame_bytes": len(frame),
                 "raw": raw_s, "raw_tight": tight_s, "raw_write": write_s, "node": node_s,
                 "floor": floor,
                 "ratio": node_s["median"] / raw_s["median"],
                 "ratio_tight": node_s["median"] / tight_s["median"],
                 "ratio_floor": node_s["median"] / floor,
                 "target": _TARGETS["fetch_small"]}
        say(f"  idle: measuring both nodes for {idle_seconds:g} s")
        peer.conn.send(("idle", idle_seconds))
        settle, ours_cpu = idle_cpu(node, idle_seconds)
        (_, peer_settle, peer_cpu) = peer.wait("idle", node)
        idle = {"seconds": idle_seconds, "peer_percent": peer_cpu * 100,
                "local_percent": ours_cpu * 100, "settle_s": max(settle, peer_settle),
                "target_percent": _TARGETS["idle_cpu_percent"]}
    finally:
        ctx.term()
        node.close()
    return small, idle


def run(rounds: int = 30, number: int = 50, idle_seconds: float = 10.0,
        progress: Progress | None = None, peer: Peer | None = None) -> dict[str, Any]:
    """Measure (a), (b) and (c) of the module docstring; return them as a dict.

    Args:
        rounds: rounds of (a) and of (b).
        number: raw round trips and small fetches per round of (b).
        idle_seconds: the idle window of (c).
        progress: called with a line of progress now and then (e.g. to print on stderr).
        peer: a peer process to use (left running); by default one of its own.
    """
    if rounds < 2 or number < 1 or not idle_seconds > 0:
        raise ConfigError(f"bench: need rounds >= 2, number >= 1 and idle_seconds > 0; got "
                          f"{rounds}, {number}, {idle_seconds}")
    say = progress or (lambda _line: None)
    t0 = time.monotonic()
    own = peer is None
    if peer is None:
        say("transfer bench: starting the peer process")
        peer = Peer()
    try:
        say(f"(a) {_LARGE[0]} x {_LARGE[1] // 1024} KiB fetch vs raw NIXL WRITE, "
            f"{rounds} rounds")
        large = _large(peer, rounds, say)
        say(f"(b) 1 x {_SMALL[1] // 1024} KiB fetch vs raw ZeroMQ round trip, "
            f"{rounds} rounds of {number}")
        small, idle = _small(peer, rounds, number, idle_seconds, say)
    finally:
        if own:
            peer.stop()
    return {"fetch_large": large, "fetch_small": small, "idle_cpu": idle,
            "rounds": rounds, "number": number, "wall_s": time.monotonic() - t0}


def format_table(result: dict[str, Any]) -> str:
    """The result of :func:`run` as a small text table."""
    lines = [f"{'measurement':<34} {'median':>9} {'p10':>9} {'p90':>9}  {'ratio':>6}  target",
             ]
    for key, label, raws in (
        ("fetch_large", "fetch 256 x 64 KiB (Node)",
         (("raw", "raw WRITE, target at node pace"), ("raw_prompt", "raw WRITE, target spinning"))),
        ("fetch_small", "fetch 1 x 4 KiB (Node)",
         (("raw", "raw DEALER-ROUTER round trip"), ("raw_tight", "raw REQ-REP round trip"))),
    ):
        row = result[key]
        unit = row["unit"]
        for raw_key, raw_label in raws:
            stats = row[raw_key]
            lines.append(f"{raw_label + f' [{unit}]':<34} {stats['median']:>9.2f} "
                         f"{stats['p10']:>9.2f} {stats['p90']:>9.2f}")
        stats = row["node"]
        floor = row["ratio_prompt"] if key == "fetch_large" else row["ratio_tight"]
        if "raw_write" in row:
            stats = row["raw_write"]
            lines.append(f"{'raw WRITE of the 1 block [us]':<34} {stats['median']:>9.2f} "
                         f"{stats['p10']:>9.2f} {stats['p90']:>9.2f}")
            lines.append(f"{'floor: REQ-REP + that WRITE [us]':<34} {row['floor']:>9.2f}")
        stats = row["node"]
        lines.append(f"{label + f' [{unit}]':<34} {stats['median']:>9.2f} {stats['p10']:>9.2f} "
                     f"{stats['p90']:>9.2f}  {floor:>5.2f}x  <= {row['target']}x of the "
                     f"{'REQ-REP' if key == 'fetch_small' else 'last raw'} "
                     f"({row['ratio']:.2f}x of the first"
                     + (f", {row['ratio_floor']:.2f}x of the floor)" if "ratio_floor" in row
                        else ")"))
    idle = result["idle_cpu"]
    lines.append(f"{'idle CPU, peer node [% of a core]':<34} {idle['peer_percent']:>9.2f}"
                 f"{'':>20}  {'':>6}  < {idle['target_percent']} %")
    lines.append(f"{'idle CPU, local node [% of a core]':<34} {idle['local_percent']:>9.2f}"
                 f"{'':>20}  {'':>6}  < {idle['target_percent']} %")
    lines.append(f"({result['rounds']} rounds; (b) {result['number']} operations per round; "
                 f"idle over {idle['seconds']:g} s; {result['wall_s']:.0f} s in all)")
    return "\n".join(lines)
