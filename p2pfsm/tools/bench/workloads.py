"""``p2pfsm bench --suite workloads``: what users do, between the transfer bench's two
processes (this one the consumer node, a spawned peer the producer, 256 x 64 KiB
blocks; the first four share one node pair; every fetch
byte-verified against the demo block model, its destination zeroed before it).

* ``lookup``: a symmetric lookup of 256 keys (192 held by the peer, 64 not), then a
  fetch of the hits: time to the lookup's answer (ready to fetch) and in total;
* ``concurrent``: 8 fetches of 32 x 64 KiB in flight at once on one session: each one's
  latency and the aggregate GB/s, against one 256-block fetch of the same bytes;
* ``soak``: ``soak`` 1 x 64 KiB fetches back to back: the first 100 against the last 100
  (drift), descriptors and resident memory of both processes before and after;
* ``cpu``: CPU seconds per GB moved, each side, over a run of 256 x 64 KiB fetches;
* ``region``: a node with a ``region_mib`` MiB region on each side (checked against the
  memory available first): construction (allocation + NIXL registration) on each side,
  connect -> ready, and the region freed after;
* ``fanout`` (:mod:`p2pfsm.tools.bench.fanout`): many consumer processes fetching from one
  producer at once.

Medians with p10/p90 (p99 where the sample allows) over single operations. The load
average of the machine is recorded with each workload: on a small shared machine it is
what moves the absolute numbers.
"""

from __future__ import annotations

import gc
import os
import resource
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from p2pfsm.demo_blocks import demo_key
from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.tools.bench import nodes
from p2pfsm.tools.bench.nodes import Fetcher
from p2pfsm.tools.bench.peer import Peer, node_pair
from p2pfsm.tools.bench.procstat import cpu_s, fds, rss
from p2pfsm.tools.bench.report import Progress, quantiles

if TYPE_CHECKING:
    from p2pfsm.executor.node import Node

__all__ = ["format_workloads", "run"]

_BLOCK = 64 * 1024
_LOOKUP_HELD, _LOOKUP_ABSENT = 192, 64
_CONCURRENT, _PER_REQUEST = 8, 32
_EDGE = 100  # fetches at each end of the soak
_ABSENT_BASE = 10**9  # demo block numbers the peer never holds


def load_average() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _lookup(node: Node, peer_id: str, rounds: int) -> dict[str, Any]:
    """Lookup of 256 keys (192 held), then a fetch of the hits."""
    blocks = _LOOKUP_HELD + _LOOKUP_ABSENT
    wanted = [demo_key(i) for i in range(_LOOKUP_HELD)]
    wanted += [demo_key(_ABSENT_BASE + i) for i in range(_LOOKUP_ABSENT)]
    check = Fetcher(node, peer_id, _LOOKUP_HELD, "lookup-check")  # verifies, never fetches
    ready, total = [], []
    for r in range(rounds + 2):  # two warm-up rounds
        rid = f"bench-lookup-{r}"
        node.region.zero_()
        t0 = time.perf_counter()
        ask = node.lookup(peer_id, rid, wanted)
        node.run_until(ask.done, 30.0)
        t1 = time.perf_counter()
        answer = ask.result() if ask.done() else None
        if answer is None or not answer.answered:
            raise TransportError(f"bench lookup {r}: no answer")
        hits = [i for i, hit in enumerate(answer.hits) if hit]
        if hits != list(range(_LOOKUP_HELD)):
            raise TransportError(f"bench lookup {r}: {len(hits)} hits, expected the "
                                 f"{_LOOKUP_HELD} held keys")
        load = node.fetch(peer_id, rid, [wanted[i] for i in hits], hits)
        node.run_until(load.done, 30.0)
        t2 = time.perf_counter()
        node.finish(peer_id, rid)
        if not load.done() or not load.result().success:
            raise TransportError(f"bench lookup {r}: the fetch of the hits failed")
        check.verify()
        if r >= 2:
            ready.append(t1 - t0)
            total.append(t2 - t0)
    return {"keys": blocks, "hits": _LOOKUP_HELD, "block_len": _BLOCK,
            "lookup_ms": quantiles(ready), "total_ms": quantiles(total)}


def _concurrent(node: Node, peer_id: str, rounds: int,
                width: int = _CONCURRENT) -> dict[str, Any]:
    """``width`` fetches in flight at once on one session, against one fetch of them all."""
    blocks = width * _PER_REQUEST
    parts = [Fetcher(node, peer_id, _PER_REQUEST, f"c{i}", first=i * _PER_REQUEST)
             for i in range(width)]
    whole = Fetcher(node, peer_id, blocks, "whole")
    each: list[float] = []
    aggregate: list[float] = []
    single: list[float] = []
    for r in range(rounds + 2):
        node.region.zero_()
        t0 = time.perf_counter()
        futs = [part.start() for part in parts]
        done_at: dict[int, float] = {}
        deadline = time.monotonic() + 30.0
        while len(done_at) < width and time.monotonic() < deadline:
            node.step(0.01)
            now = time.perf_counter()
            for i, fut in enumerate(futs):
                if i not in done_at and fut.done():
                    done_at[i] = now
        for part, fut in zip(parts, futs, strict=True):
            part.check(fut)
        whole.verify()
        whole.clear()
        one = whole.once()
        whole.verify()
        if r >= 2:
            each.extend(t - t0 for t in done_at.values())
            aggregate.append(max(done_at.values()) - t0)
            single.append(one)
    nbytes = blocks * _BLOCK
    return {"requests": width, "blocks_each": _PER_REQUEST, "block_len": _BLOCK,
            "request_ms": quantiles(each), "all_done_ms": quantiles(aggregate),
            "single_ms": quantiles(single),
            "aggregate_gbps": nbytes / statistics.median(aggregate) / 1e9,
            "single_gbps": nbytes / statistics.median(single) / 1e9}


def _soak(node: Node, peer_id: str, peer_pid: int, count: int) -> dict[str, Any]:
    """``count`` one-block fetches back to back; drift, descriptors and memory on both
    sides."""
    fetcher = Fetcher(node, peer_id, 1, "soak")
    me = os.getpid()
    times = []
    for _ in range(20):
        fetcher.once()
    before = {"fds": fds(me), "rss": rss(me), "peer_fds": fds(peer_pid),
              "peer_rss": rss(peer_pid)}
    for _ in range(count):
        fetcher.clear()
        times.append(fetcher.once())
        fetcher.verify()
    after = {"fds": fds(me), "rss": rss(me), "peer_fds": fds(peer_pid),
             "peer_rss": rss(peer_pid)}
    edge = min(_EDGE, max(1, count // 2))
    first, last = quantiles(times[:edge]), quantiles(times[-edge:])
    return {"count": count, "edge": edge, "block_len": node.config.block_len,
            "first_ms": first, "last_ms": last, "drift": last["median"] / first["median"],
            "all_ms": quantiles(times), "before": before, "after": after}


def _cpu(node: Node, peer_id: str, peer_pid: int, fetches: int) -> dict[str, Any]:
    """CPU seconds per GB moved on each side over ``fetches`` fetches of 256 x 64 KiB."""
    fetcher = Fetcher(node, peer_id, 256, "cpu")
    verify_cpu = 0.0
    for _ in range(3):
        fetcher.once()
    ours0, theirs0, wall0 = _own_cpu(), cpu_s(peer_pid), time.perf_counter()
    for _ in range(fetches):
        fetcher.once()
        v0 = _own_cpu()
        fetcher.verify()
        fetcher.clear()
        verify_cpu += _own_cpu() - v0
    wall = time.perf_counter() - wall0
    ours, theirs = _own_cpu() - ours0 - verify_cpu, cpu_s(peer_pid) - theirs0
    gb = fetches * 256 * _BLOCK / 1e9
    return {"fetches": fetches, "gb": gb, "wall_s": wall, "gbps": gb / wall,
            "consumer_cpu_s_per_gb": ours / gb, "producer_cpu_s_per_gb": theirs / gb,
            "consumer_core_share": ours / wall, "producer_core_share": theirs / wall}


def _region(peer: Peer, mib: int, memory_check: bool = True) -> dict[str, Any]:
    """A ``mib`` MiB region on each side: construction, connect -> ready, freed after
    (skipped when the memory available now would not hold it, unless not ``memory_check``)."""
    from p2pfsm.executor.node import Node
    from p2pfsm.tools.demo.host import available_memory, check_region

    blocks = mib * 1024 * 1024 // _BLOCK
    have = available_memory()
    try:  # both processes hold one, plus headroom for everything else
        if memory_check:
            check_region(blocks * 2 + 4096, _BLOCK, what="--region-mib")
    except ConfigError as exc:
        return {"mib": mib, "skipped": str(exc), "available": have}
    me = os.getpid()
    rss0 = rss(me)
    (_, peer_id, peer_setup) = peer.ask("region", blocks, _BLOCK)
    try:
        t0 = time.perf_counter()
        node = Node(nodes.config(blocks, _BLOCK))
        setup = time.perf_counter() - t0
        try:
            rss_held = rss(me)
            ready = nodes.connect(node, peer_id, 60.0)
        finally:
            node.close()
        del node
        gc.collect()
        rss_freed = rss(me)
    finally:
        peer.ask("drop")
    return {"mib": mib, "blocks": blocks, "block_len": _BLOCK, "available": have,
            "consumer_setup_s": setup, "producer_setup_s": peer_setup,
            "connect_ready_ms": ready * 1e3, "rss_before_mib": rss0 / 2**20,
            "rss_held_mib": rss_held / 2**20, "rss_freed_mib": rss_freed / 2**20}


def _measure(steps: list[tuple[str, str, Callable[[], dict[str, Any]]]],
             out: dict[str, Any], say: Progress) -> None:
    for key, what, measure in steps:
        say(f"  {key}: {what}")
        load0 = load_average()
        result = measure()
        result["load"] = (load0 + load_average()) / 2
        out[key] = result


def run(rounds: int = 30, soak: int = 1000, cpu_fetches: int = 60, region_mib: int = 1024,
        consumers: int = 16, fanout_fetches: int = 10, progress: Progress | None = None,
        peer: Peer | None = None, memory_check: bool = True) -> dict[str, Any]:
    """Every workload of the module docstring; a dict of their results.

    Args:
        rounds: measured rounds of ``lookup`` and ``concurrent``.
        soak: fetches of the soak (at least 2).
        cpu_fetches: 256 x 64 KiB fetches of the CPU-per-GB run.
        region_mib: region size of the handshake workload (MiB, each side).
        consumers: consumer processes of the fan-out (0: skip it).
        fanout_fetches: fetches per consumer in the fan-out.
        progress: called with a line of progress now and then.
        peer: a peer process to use (left running); by default one of its own.
        memory_check: skip ``region`` and ``fanout`` (saying so in their result) when
            the memory available at the time would not hold them; False runs them
            regardless (a result that does not depend on what else the machine runs).
    """
    from p2pfsm.tools.bench import fanout

    if rounds < 1 or soak < 2 or cpu_fetches < 1 or region_mib < 1 or consumers < 0 \
            or fanout_fetches < 1:
        raise ConfigError(f"bench workloads: need rounds >= 1, soak >= 2, cpu fetches, "
                          f"region MiB and fan-out fetches >= 1, consumers >= 0; got "
                          f"{rounds}, {soak}, {cpu_fetches}, {region_mib}, {consumers}, "
                          f"{fanout_fetches}")
    say = progress or (lambda _line: None)
    t0 = time.monotonic()
    out: dict[str, Any] = {}
    own = peer is None
    if peer is None:
        say("workloads bench: starting the peer process")
        peer = Peer()
    try:
        # One node pair (256 x 64 KiB, the peer holding all 256) for the first four.
        node, peer_id = node_pair(peer, (256, _BLOCK))
        try:
            steps: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
                ("lookup", f"lookup of {_LOOKUP_HELD + _LOOKUP_ABSENT} keys + fetch of the "
                           f"hits, {rounds} rounds", lambda: _lookup(node, peer_id, rounds)),
                ("concurrent", f"{_CONCURRENT} concurrent fetches on one session, {rounds} "
                               "rounds", lambda: _concurrent(node, peer_id, rounds)),
                ("soak", f"{soak} fetches of 1 x 64 KiB back to back",
                 lambda: _soak(node, peer_id, peer.pid, soak)),
                ("cpu", f"CPU per GB over {cpu_fetches} fetches of 256 x 64 KiB",
                 lambda: _cpu(node, peer_id, peer.pid, cpu_fetches)),
            ]
            _measure(steps, out, say)
        finally:
            node.close()
        steps = [("region", f"{region_mib} MiB region handshake",
                  lambda: _region(peer, region_mib, memory_check))]
        if consumers:
            steps.append(("fanout", f"{consumers} consumers x {fanout_fetches} fetches from "
                                    "one producer",
                          lambda: fanout.run(peer, consumers, fanout_fetches, say,
                                             memory_check)))
        _measure(steps, out, say)
    finally:
        if own:
            peer.stop()
    out["wall_s"] = time.monotonic() - t0
    return out


def _q(stats: dict[str, float], p99: bool = False) -> str:
    tail = f", p99 {stats['p99']:.2f}" if p99 else ""
    return f"{stats['median']:.2f} ms (p10 {stats['p10']:.2f}, p90 {stats['p90']:.2f}{tail})"


def format_workloads(r: dict[str, Any]) -> str:
    """The result of :func:`run` as lines of text."""
    lines = ["workloads (two processes; medians, every fetch byte-verified; load = 1-min "
             "load average during the workload):"]
    if "lookup" in r:
        w = r["lookup"]
        lines += [f"lookup {w['keys']} keys ({w['hits']} hits) + fetch of the hits "
                  f"[load {w['load']:.1f}]:",
                  f"  lookup -> ready to fetch {_q(w['lookup_ms'])}",
                  f"  lookup + fetch           {_q(w['total_ms'])}"]
    if "concurrent" in r:
        w = r["concurrent"]
        lines += [f"{w['requests']} concurrent fetches of {w['blocks_each']} x 64 KiB on one "
                  f"session [load {w['load']:.1f}]:",
                  f"  per request  {_q(w['request_ms'], True)}",
                  f"  all done     {_q(w['all_done_ms'])}: {w['aggregate_gbps']:.2f} GB/s",
                  f"  one fetch of all {w['requests'] * w['blocks_each']} blocks "
                  f"{_q(w['single_ms'])}: {w['single_gbps']:.2f} GB/s"]
    if "soak" in r:
        w = r["soak"]
        b, a = w["before"], w["after"]
        lines += [f"{w['count']} fetches of 1 x {w['block_len'] // 1024} KiB back to back "
                  f"[load {w['load']:.1f}]:",
                  f"  first {w['edge']} {_q(w['first_ms'])}; last {w['edge']} "
                  f"{_q(w['last_ms'])}; last/first {w['drift']:.2f}x",
                  f"  fds {b['fds']} -> {a['fds']} (peer {b['peer_fds']} -> {a['peer_fds']}); "
                  f"RSS {b['rss'] / 2**20:.1f} -> {a['rss'] / 2**20:.1f} MiB (peer "
                  f"{b['peer_rss'] / 2**20:.1f} -> {a['peer_rss'] / 2**20:.1f})"]
    if "cpu" in r:
        w = r["cpu"]
        lines += [f"CPU per GB moved, {w['fetches']} x 256 x 64 KiB ({w['gb']:.2f} GB at "
                  f"{w['gbps']:.2f} GB/s) [load {w['load']:.1f}]:",
                  f"  consumer {w['consumer_cpu_s_per_gb']:.2f} CPU s/GB "
                  f"({w['consumer_core_share'] * 100:.0f} % of a core), producer "
                  f"{w['producer_cpu_s_per_gb']:.2f} CPU s/GB "
                  f"({w['producer_core_share'] * 100:.0f} % of a core)"]
    if "region" in r:
        w = r["region"]
        if "skipped" in w:
            lines.append(f"{w['mib']} MiB region handshake: skipped: {w['skipped']}")
        else:
            lines += [f"{w['mib']} MiB region on each side ({w['blocks']} x 64 KiB) "
                      f"[load {w['load']:.1f}]:",
                      f"  node construction (allocate + register): consumer "
                      f"{w['consumer_setup_s'] * 1e3:.0f} ms, producer "
                      f"{w['producer_setup_s'] * 1e3:.0f} ms; connect -> ready "
                      f"{w['connect_ready_ms']:.1f} ms",
                      f"  consumer RSS {w['rss_before_mib']:.0f} -> {w['rss_held_mib']:.0f} "
                      f"-> {w['rss_freed_mib']:.0f} MiB after it is freed"]
    if "fanout" in r:
        from p2pfsm.tools.bench import fanout

        lines.append(fanout.format_fanout(r["fanout"]))
    lines.append(f"({r.get('wall_s', 0.0):.0f} s in all)")
    return "\n".join(lines)
