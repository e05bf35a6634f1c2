"""``p2pfsm bench --suite concurrency``: C fetches in flight at once on one session
against one fetch of all their blocks, and C consumer processes on one producer.

Between the transfer bench's two processes (this one the consumer node, the spawned
peer the producer DemoServer, 64 KiB blocks). For each C in ``widths``, every round
runs C concurrent fetches of 4 x 64 KiB (issued together, the node stepped until all
are done) and then, as the raw baseline of the same round, one fetch of all C x 4
blocks; every byte is verified after both. The ratio is the aggregate GB/s of the C
fetches over that of the one fetch (medians of the same run). With ``consumers``, the
fan-out (:mod:`p2pfsm.tools.bench.fanout`) adds C consumer processes on one producer.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.tools.bench.nodes import Fetcher
from p2pfsm.tools.bench.peer import Peer, node_pair
from p2pfsm.tools.bench.report import Progress, quantiles

__all__ = ["WIDTHS", "format_concurrency", "parse_widths", "run"]

WIDTHS = (1, 4, 16, 64)
PER_REQUEST = 4
_BLOCK = 64 * 1024
_TIMEOUT = 60.0
_TARGET = 0.8  # issue 29: 64 concurrent >= 0.8x the GB/s of one fetch of all blocks


def parse_widths(texts: list[str]) -> tuple[int, ...]:
    """``["1", "4,16"]`` -> (1, 4, 16); a ConfigError for anything not a positive int."""
    out: list[int] = []
    for text in texts:
        for part in text.split(","):
            if not part.strip().isdigit() or int(part) < 1:
                raise ConfigError(f"concurrency: expected positive integers, got {text!r}")
            out.append(int(part))
    return tuple(dict.fromkeys(out))


def _width(node: Any, peer_id: str, width: int, rounds: int) -> dict[str, Any]:
    blocks = width * PER_REQUEST
    parts = [Fetcher(node, peer_id, PER_REQUEST, f"w{width}-{i}", first=i * PER_REQUEST)
             for i in range(width)]
    whole = Fetcher(node, peer_id, blocks, f"w{width}-all")
    together: list[float] = []
    single: list[float] = []
    for r in range(rounds + 2):
        whole.clear()
        t0 = time.perf_counter()
        futs = [part.start() for part in parts]
        deadline = time.monotonic() + _TIMEOUT
        while not all(f.done() for f in futs) and time.monotonic() < deadline:
            node.step(0.01)
        t1 = time.perf_counter()
        for part, fut in zip(parts, futs, strict=True):
            part.check(fut)
        whole.verify()
        whole.clear()
        one = whole.once()
        whole.verify()
        if r >= 2:  # two rounds of warm-up
            together.append(t1 - t0)
            single.append(one)
    nbytes = blocks * _BLOCK
    t_med, s_med = statistics.median(together), statistics.median(single)
    return {"width": width, "blocks_each": PER_REQUEST, "block_len": _BLOCK,
            "all_done_ms": quantiles(together), "single_ms": quantiles(single),
            "aggregate_gbps": nbytes / t_med / 1e9, "single_gbps": nbytes / s_med / 1e9,
            "ratio": s_med / t_med}


def run(widths: tuple[int, ...] = WIDTHS, rounds: int = 20, consumers: tuple[int, ...] = (),
        fanout_fetches: int = 10, progress: Progress | None = None,
        peer: Peer | None = None, memory_check: bool = True) -> dict[str, Any]:
    """Every width, then every consumer count of the fan-out; a dict of results."""
    from p2pfsm.tools.bench import fanout
    from p2pfsm.tools.bench.workloads import load_average

    if rounds < 1 or not widths or min(widths) < 1:
        raise ConfigError(f"concurrency: need rounds >= 1 and widths >= 1; got {rounds}, "
                          f"{widths}")
    say = progress or (lambda _line: None)
    own = peer is None
    peer = peer or Peer()
    out: dict[str, Any] = {"rounds": rounds, "target": _TARGET, "widths": [], "fanout": []}
    try:
        node, peer_id = node_pair(peer, (max(256, max(widths) * PER_REQUEST), _BLOCK))
        try:
            for w in widths:
                say(f"  concurrency: {w} x {PER_REQUEST} x 64 KiB vs one fetch, {rounds} rounds")
                load0 = load_average()
                row = _width(node, peer_id, w, rounds)
                row["load"] = (load0 + load_average()) / 2
                out["widths"].append(row)
        finally:
            node.close()
        for c in consumers:
            say(f"  concurrency: fan-out of {c} consumer processes")
            load0 = load_average()
            try:
                got = fanout.run(peer, c, fanout_fetches, say, memory_check)
            except TransportError as exc:
                got = {"consumers": c, "skipped": str(exc)}
            got["load"] = (load0 + load_average()) / 2
            out["fanout"].append(got)
    finally:
        if own:
            peer.stop()
    return out


def format_concurrency(r: dict[str, Any]) -> str:
    """The result of :func:`run` as a text table."""
    from p2pfsm.tools.bench import fanout

    lines = [f"C concurrent fetches of {PER_REQUEST} x 64 KiB on one session vs one fetch of "
             f"all C x {PER_REQUEST} blocks (medians of {r['rounds']} rounds; target at C=64: "
             f">= {r['target']}x):",
             f"  {'C':>3} {'all done ms':>11} {'one fetch ms':>12} {'GB/s C':>7} "
             f"{'GB/s one':>8} {'ratio':>6} {'load':>5}"]
    for w in r["widths"]:
        lines.append(f"  {w['width']:>3} {w['all_done_ms']['median']:>11.2f} "
                     f"{w['single_ms']['median']:>12.2f} {w['aggregate_gbps']:>7.2f} "
                     f"{w['single_gbps']:>8.2f} {w['ratio']:>5.2f}x {w['load']:>5.1f}")
    for v in r.get("vllm", []):
        ours = next((w for w in r["widths"] if w["width"] == v["width"]), None)
        speed = v["all_done_ms"]["median"] / ours["all_done_ms"]["median"] if ours else 0.0
        vs = f"; vLLM's time / p2pfsm's {speed:.2f}x (target at C=64: >= 3x)" if ours else ""
        lines.append(f"  vLLM <-> vLLM, C={v['width']}: all done "
                     f"{v['all_done_ms']['median']:.2f} ms, {v['aggregate_gbps']:.2f} GB/s{vs}")
    one = next((w["single_gbps"] for w in r["widths"]
                if w["width"] * PER_REQUEST == fanout._SHAPE[0]), None)
    for f in r["fanout"]:
        lines.append(fanout.format_fanout(f))
        if one and "aggregate_gbps" in f:
            lines.append(f"  {f['aggregate_gbps'] / one:.2f}x the GB/s of one 256-block fetch "
                         "of this run (target at 64 consumers: >= 0.7x)")
    return "\n".join(lines)
