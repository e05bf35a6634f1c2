"""The two hosts of the fault campaigns, usable in the test process and in a child.

Neither imports torch: a child process gives its node a :class:`HostRegion` over a numpy
array (starts in ~1.5 s instead of ~5 s), the test process may pass a torch tensor whose
``.numpy()`` view is the same memory.

* :class:`Producer` serves demo blocks ``0..held-1`` at their own index. ``on_fetch``
  parks the missing keys and supplies them after a seeded random delay (the demand path:
  rounds stay open across a fault); ``on_round_ended`` drops the parked supply of a round
  that ended first (docs/howto/engine.md: a supply given later is taken for a later round and
  waits for its fetch, pinned until the store deadline: after a session to the same
  peer died and a new one opened, nobody fetches it); ``on_lookup`` pins the hits it
  holds. It keeps every supply future and every lookup-pin future, so a test can check
  that each one resolved.
* :class:`Consumer` fetches into destination ranges laid out between canary blocks and
  runs the :class:`Guard` on every result: a success is verified byte for byte, a
  ``released=True`` result checksums its destination at once; :meth:`Guard.verify`
  later recomputes every released range and every canary.

Both count every result the node hands out (``on_result``) per job id: "exactly one
result per job" is checked on those counts, not on the futures (which resolve once by
construction).
"""

from __future__ import annotations

import collections
import contextlib
import random
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import LocalProtocolError
from p2pfsm.executor.node import LookupAnswer, LookupAsk, Node, NodeConfig
from p2pfsm.executor.node.jobs import JobFuture
from p2pfsm.session import FetchArrived, LoadResult, LookupResult, RoundEnded, StoreResult

CANARY = 0xC5
"""Byte of the canary blocks (the demo blocks are SHAKE output: never all one byte)."""


def crc(arr: np.ndarray, lo: int, hi: int) -> int:
    return zlib.crc32(arr[lo:hi].tobytes())


class Counted:
    """Results the node handed out (``on_result``), per job id, and per kind."""

    def __init__(self) -> None:
        self.per_job: collections.Counter[tuple[str, int]] = collections.Counter()
        self.lookups = 0

    def __call__(self, peer_id: str, result: LoadResult | StoreResult | LookupResult) -> None:
        if isinstance(result, LookupResult):
            self.lookups += 1
        else:
            self.per_job[(type(result).__name__, result.job_id)] += 1

    def duplicates(self) -> list[tuple[str, int]]:
        return [job for job, n in self.per_job.items() if n != 1]


@dataclass
class Park:
    due: float
    peer_id: str
    kv_request_id: str
    round_seq: int
    keys: list[bytes]
    finish: bool  # some keys are not held: finish the request after this supply


class Producer:
    """Serves demo blocks with delayed supply and lookup pins (see the module docstring)."""

    def __init__(self, config: NodeConfig, memory_view: np.ndarray, held: int, seed: int,
                 supply_delay_s: float = 0.0) -> None:
        self.view = memory_view
        self.held = {demo_key(i): i for i in range(held)}
        self.rng = random.Random(seed)
        self.supply_delay_s = supply_delay_s
        self.parked: list[Park] = []
        self.supplies: list[JobFuture[StoreResult]] = []
        self.pins: list[JobFuture[StoreResult]] = []
        self.fetches_heard: list[tuple[str, str]] = []
        self.supply_refused = 0  # supplies the node refused (session already over)
        self.supply_dropped = 0  # parked supplies of a round that ended first
        self.counted = Counted()
        bl = config.block_len
        for i in range(held):
            memory_view[i] = np.frombuffer(demo_block(i, bl), dtype=np.uint8)
        self.node = Node(config, on_fetch=self._on_fetch, on_lookup=self._on_lookup,
                         on_result=self.counted, on_round_ended=self._on_round_ended)

    def _on_fetch(self, peer_id: str, fetch: FetchArrived) -> None:
        self.fetches_heard.append((peer_id, fetch.kv_request_id))
        keys = [k for k in fetch.missing if k in self.held]
        lacking = len(keys) < len(fetch.missing)
        if keys:
            # Supply first, then finish (as the demo host does): a supply after our own
            # finish would open a new round that waits for a fetch that never comes.
            delay = self.rng.uniform(0.0, self.supply_delay_s)
            self.parked.append(Park(time.monotonic() + delay, peer_id, fetch.kv_request_id,
                                    fetch.round_seq, keys, lacking))
        elif lacking:
            self.node.finish(peer_id, fetch.kv_request_id)

    def _on_round_ended(self, peer_id: str, ended: RoundEnded) -> None:
        # Its supply is no longer wanted: given now it would open a later round of the
        # request in whatever session the peer has (a new one, after a reconnect).
        keep = [p for p in self.parked if (p.peer_id, p.kv_request_id, p.round_seq)
                != (peer_id, ended.kv_request_id, ended.round_seq)]
        self.supply_dropped += len(self.parked) - len(keep)
        self.parked = keep

    def _on_lookup(self, peer_id: str, ask: LookupAsk) -> LookupAnswer:
        self.pins.append(ask.pins)
        return {k: self.held[k] for k in ask.keys if k in self.held}, ()

    def supply_due(self) -> float | None:
        """Supply what is due; the time of the next parked supply (None: nothing parked)."""
        now = time.monotonic()
        due = [p for p in self.parked if p.due <= now]
        self.parked = [p for p in self.parked if p.due > now]
        for p in due:
            try:
                fut = self.node.supply(p.peer_id, p.kv_request_id, p.keys,
                                       [self.held[k] for k in p.keys])
            except LocalProtocolError:
                self.supply_refused += 1  # the session (or request) ended meanwhile
                continue
            self.supplies.append(fut)
            if p.finish:
                with contextlib.suppress(LocalProtocolError):
                    self.node.finish(p.peer_id, p.kv_request_id)
        return min((p.due for p in self.parked), default=None)

    def parked_for(self, peer_id: str) -> bool:
        return any(p.peer_id == peer_id for p in self.parked)

    def step(self, max_wait: float) -> None:
        nxt = self.supply_due()
        if nxt is not None:
            max_wait = max(0.0, min(max_wait, nxt - time.monotonic()))
        self.node.step(max_wait)

    def state(self) -> dict[str, Any]:
        snap = self.node.metrics.snapshot()
        return {
            "open_supplies": sum(not f.done() for f in self.supplies),
            "open_pins": sum(not f.done() for f in self.pins),
            "supplies": len(self.supplies),
            "pins": len(self.pins),
            "parked": len(self.parked),
            "fetches_heard": len(self.fetches_heard),
            "duplicates": self.counted.duplicates(),
            "open_counts": {p: s.open_counts() for p, s in self.node.sessions.items()},
            "alive": {p: s.alive for p, s in self.node.sessions.items()},
            "gauges": dict(snap["gauges"]),
            "results_dropped": snap["counters"].get("results_dropped", 0),
            "counters": dict(snap["counters"]),
            "rounds": {p: [(r.fsm_label, r.fsm_state, len(r.demand), len(r.supply),
                            len(r.inflight), sorted(r.jobs))
                           for r in s.view.serve_rounds]
                       for p, s in self.node.sessions.items() if s.view.serve_rounds},
            "supply_refused": self.supply_refused,
            "supply_dropped": self.supply_dropped,
        }


def settled(state: dict[str, Any]) -> bool:
    """Every supply and pin resolved, no machine open, the node's gauges at zero."""
    return (state["open_supplies"] == 0 and state["open_pins"] == 0
            and all(not any(c.values()) for c in state["open_counts"].values())
            and state["gauges"].get("open_stores", 0) == 0
            and state["gauges"].get("open_loads", 0) == 0)


@dataclass
class Guarded:
    """One fetch and what the guard knows of it."""

    rid: str
    blocks: list[int]
    lo: int  # destination blocks [lo, lo + len(blocks))
    future: JobFuture[LoadResult] | None = None
    lookup: JobFuture[LookupResult] | None = None
    result: LoadResult | None = None
    released_crc: int | None = None
    verified: bool | None = None
    at: float = 0.0  # when the result came (monotonic)
    finished: bool = False  # the host finished the request (sym rounds)


@dataclass
class Guard:
    """Destination ranges between canary blocks; checksums at release; later checks."""

    view: np.ndarray
    block_len: int
    next_free: int = 0
    canaries: list[int] = field(default_factory=list)
    jobs: list[Guarded] = field(default_factory=list)

    def reset(self) -> None:
        self.view[:] = 0
        self.next_free, self.canaries, self.jobs = 0, [], []

    def fits(self, n: int) -> bool:
        start = self.next_free + (0 if self.canaries else 1)
        return bool(start + n + 1 <= self.view.shape[0])

    def place(self, rid: str, blocks: list[int]) -> Guarded:
        """The next destination range, a canary block on each side."""
        if not self.canaries:
            self._canary(0)
            self.next_free = 1
        lo = self.next_free
        self.view[lo:lo + len(blocks)] = 0
        self._canary(lo + len(blocks))
        self.next_free = lo + len(blocks) + 1
        job = Guarded(rid, blocks, lo)
        self.jobs.append(job)
        return job

    def _canary(self, index: int) -> None:
        self.view[index] = CANARY
        self.canaries.append(index)

    def on_result(self, job: Guarded, result: LoadResult) -> None:
        job.result, job.at = result, time.monotonic()
        hi = job.lo + len(job.blocks)
        if result.released:
            job.released_crc = crc(self.view, job.lo, hi)
        if result.success:
            job.verified = all(
                self.view[job.lo + k].tobytes() == demo_block(b, self.block_len)
                for k, b in enumerate(job.blocks))

    def verify(self) -> dict[str, Any]:
        """Writes after free (released ranges whose bytes changed) and changed canaries."""
        after_free = [
            j.rid for j in self.jobs if j.released_crc is not None
            and crc(self.view, j.lo, j.lo + len(j.blocks)) != j.released_crc]
        canary = bytes([CANARY]) * self.block_len
        changed = sum(1 for c in self.canaries if self.view[c].tobytes() != canary)
        # What landed late: the job's own blocks, complete (a late WRITE of that fetch)?
        whole = [j.rid for j in self.jobs if j.rid in after_free and all(
            self.view[j.lo + k].tobytes() == demo_block(b, self.block_len)
            for k, b in enumerate(j.blocks))]
        return {"writes_after_free": len(after_free), "after_free_rids": after_free,
                "after_free_whole": whole, "canaries_changed": changed,
                "released": sum(j.released_crc is not None for j in self.jobs),
                "unverified": sum(j.verified is False for j in self.jobs)}


class Consumer:
    """Fetches guarded ranges from one peer (see the module docstring)."""

    def __init__(self, config: NodeConfig, memory_view: np.ndarray) -> None:
        self.counted = Counted()
        self.guard = Guard(memory_view, config.block_len)
        self.node = Node(config, on_result=self.counted)
        self.lookups: list[JobFuture[LookupResult]] = []

    def connect(self, peer: str, timeout: float) -> bool:
        session = self.node.connect(peer)
        self.node.run_until(lambda: session.ready or not session.alive, timeout)
        return session.ready

    def fetch(self, peer: str, rid: str, blocks: list[int], sym: bool = False) -> Guarded:
        """PD: fetch at once. sym: a lookup first; :meth:`tick` fetches when it answers."""
        job = self.guard.place(rid, blocks)
        if sym:
            job.lookup = self.node.lookup(peer, rid, [demo_key(b) for b in blocks])
            self.lookups.append(job.lookup)
        else:
            self._start(peer, job)
        return job

    def _start(self, peer: str, job: Guarded) -> None:
        fut = self.node.fetch(peer, job.rid, [demo_key(b) for b in job.blocks],
                              range(job.lo, job.lo + len(job.blocks)))
        job.future = fut
        # Runs inside the node's step, the moment the result is handed out: the
        # checksum of a released range is taken before anything else can happen.
        fut.add_done_callback(lambda f: self.guard.on_result(job, f.result()))

    def tick(self, peer: str) -> None:
        """Host work between steps (never from a future's callback, which runs inside
        the node's step): fetch what answered lookups found; finish finished requests."""
        session = self.node.sessions.get(peer)
        alive = session is not None and session.alive
        for job in self.guard.jobs:
            if job.lookup is not None and job.lookup.done() and job.future is None:
                try:
                    self._start(peer, job)
                except LocalProtocolError:
                    job.lookup = None  # the session ended first: nothing was fetched
            if job.result is not None and not job.finished and job.lookup is not None:
                job.finished = True
                if alive:
                    with contextlib.suppress(LocalProtocolError):
                        self.node.finish(peer, job.rid)

    def step(self, peer: str, max_wait: float) -> None:
        self.tick(peer)
        self.node.step(max_wait)

    def jobs_done(self) -> bool:
        return all(j.result is not None or (j.future is None and j.lookup is None)
                   for j in self.guard.jobs) and all(f.done() for f in self.lookups)

    def report(self) -> dict[str, Any]:
        jobs = self.guard.jobs
        started = [j for j in jobs if j.future is not None]
        per_load = {k: n for k, n in self.counted.per_job.items() if k[0] == "LoadResult"}
        one = sum(1 for j in started if j.result is not None
                  and per_load.get(("LoadResult", j.result.job_id)) == 1)
        return {"jobs": len(started), "results": sum(j.result is not None for j in started),
                "exactly_one": one, "duplicates": self.counted.duplicates(),
                "succeeded": sum(bool(j.result and j.result.success) for j in started),
                "lookups": len(self.lookups),
                "lookups_done": sum(f.done() for f in self.lookups),
                "results_dropped":
                    self.node.metrics.snapshot()["counters"].get("results_dropped", 0),
                "alive": {p: x.alive for p, x in self.node.sessions.items()},
                "ready": {p: x.ready for p, x in self.node.sessions.items()},
                "deaths": self.node.metrics.snapshot()["counters"].get("deaths", 0),
                "redials": self.node.metrics.snapshot()["counters"].get("redials", 0),
                **self.guard.verify()}


def step_for(step: Callable[[float], None], seconds: float) -> None:
    """Keep a node stepping for ``seconds`` (the bounded "afterwards" of a check)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        step(min(left, 0.02))
