"""A seeded random walk of the consumer's host actions against a producer under test.

One tester session; each step is drawn from a seeded ``random.Random``: a PD fetch of
held blocks, a fetch with a missing key (finished later: an abort), a lookup (finished
later: the terminal fetch), a finish, a duplicate connect_ack, an abort of a round that
ended, a frame of an unknown type, or a pause (0-50 ms of pumping, so that actions and
answers interleave differently). Destination blocks are reused once a load's result
says they are released, so a write landing after its round's terminal frame corrupts a
later check. The oracle holds every frame to the models throughout; at the end every
request is finished and every load must have one result, every successful load its
bytes exact, and the session must still be ready. The same seed replays the same walk.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import msgpack

from p2pfsm.conform.registry import Context
from p2pfsm.conform.target import Target
from p2pfsm.conform.tester import NUM_BLOCKS, Tester
from p2pfsm.conform.verdict import CaseFailure, CaseResult, NotApplicable, Verdict
from p2pfsm.protocol import AbortFetch, ConnectAck

__all__ = ["run_random"]

MISSING = 1 << 40
ACTIONS = ("fetch", "fetch-missing", "lookup", "finish", "dup-ack", "stale-abort",
           "unknown-type", "pause", "pause")


@dataclass
class _Walk:
    t: Tester
    rng: random.Random
    held: int
    free: list[int] = field(default_factory=lambda: list(range(NUM_BLOCKS)))
    open: list[str] = field(default_factory=list)  # requests not finished yet
    ended: list[str] = field(default_factory=list)
    loads: dict[int, tuple[str, list[int], list[int]]] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    serial: int = 0

    def rid(self) -> str:
        self.serial += 1
        return f"conform-walk-{self.serial}"

    def take(self, n: int) -> list[int] | None:
        if len(self.free) < n:
            return None
        self.rng.shuffle(self.free)
        got, self.free = self.free[:n], self.free[n:]
        return got

    def reclaim(self) -> None:
        """Check finished loads; free the destinations the results released."""
        for r in list(self.t.loads):
            entry = self.loads.pop(r.job_id, None)
            if entry is None:
                continue
            _rid, blocks, slots = entry
            if r.success:
                self.t.check_blocks(blocks, slots)
            if r.released:
                self.free += slots

    def step(self, action: str) -> None:
        t, rng = self.t, self.rng
        if action in ("fetch", "fetch-missing"):
            n = rng.randint(1, min(8, self.held))
            blocks = rng.sample(range(self.held), n)
            if action == "fetch-missing":
                blocks.insert(rng.randint(0, n), MISSING)
            slots = self.take(len(blocks))
            if slots is None:
                self.steps.append(f"{action}: skipped (no free block)")
                return
            rid = self.rid()
            job = t.fetch(rid, blocks, slots)
            self.loads[job] = (rid, blocks, slots)
            (self.open if action == "fetch-missing" else self.ended).append(rid)
            self.steps.append(f"{action} {rid} blocks {blocks} -> our {slots}")
        elif action == "lookup":
            rid = self.rid()
            blocks = rng.sample(range(self.held), rng.randint(1, min(4, self.held)))
            t.lookup(rid, [*blocks, MISSING])
            self.open.append(rid)
            self.steps.append(f"lookup {rid} blocks {blocks} + missing")
        elif action == "finish":
            if not self.open:
                self.steps.append("finish: none open")
                return
            rid = self.open.pop(rng.randrange(len(self.open)))
            t.finish(rid)
            self.ended.append(rid)
            self.steps.append(f"finish {rid}")
        elif action == "dup-ack":
            t.send(ConnectAck(t.local_id))
            self.steps.append("duplicate connect_ack")
        elif action == "stale-abort":
            if not self.ended:
                self.steps.append("stale-abort: none ended")
                return
            rid = rng.choice(self.ended)
            t.send(AbortFetch(rid, 0))
            self.steps.append(f"abort_fetch {rid} round 0 (stale or racing its end)")
        elif action == "unknown-type":
            t.send_raw(msgpack.packb({"type": "conform-unknown"}), "<unknown type>")
            self.steps.append("frame of unknown type")
        else:
            ms = rng.randint(0, 50)
            t.wait(lambda: False, ms / 1000)
            self.steps.append(f"pause {ms} ms")
        self.reclaim()


def walk(ctx: Context, steps: int, seed: int) -> str:
    """The walk's body (raises CaseFailure naming the steps taken so far)."""
    if ctx.target.blocks < 1:
        raise NotApplicable("the target holds no demo block")
    t = ctx.tester()
    t.handshake()
    w = _Walk(t, random.Random(seed), min(ctx.target.blocks, 64))
    try:
        for _ in range(steps):
            w.step(w.rng.choice(ACTIONS))
            t.check_clean()
        for rid in list(w.open):
            t.finish(rid)
            w.steps.append(f"finish {rid} (end of walk)")
        w.open.clear()
        def settled() -> bool:
            w.reclaim()
            return not w.loads

        t.expect(settled, "one result for every load once every request is finished (transfer_done "
                 "or abort_ack for every round)")
        t.observe()
        w.reclaim()
        t.check_clean()
        if not t.session.ready:
            raise CaseFailure("the session still ready after the walk", t.summary())
    except CaseFailure as exc:
        shown = w.steps[-15:]
        raise CaseFailure(exc.expected, f"{exc.got} | after {len(w.steps)} steps, the last: "
                          + "; ".join(shown)) from None
    results = len(t.loads)
    return f"{steps} steps, {results} loads ({sum(r.success for r in t.loads)} served)"


def run_random(target: Target, steps: int, seed: int) -> CaseResult:
    """The walk as one case result, ``random.seed-S``."""
    ctx = Context(target)
    started = time.monotonic()
    case_id = f"random.seed-{seed}"
    desc = f"a seeded random walk of {steps} consumer actions"
    rule = "every frame allowed by the models where it arrives; every load one result; " \
           "bytes exact; nothing lands in a released block"
    expected = got = note = ""
    try:
        note = walk(ctx, steps, seed)
        verdict = Verdict.PASS
    except CaseFailure as exc:
        verdict, expected, got = Verdict.FAIL, exc.expected, exc.got
    except NotApplicable as exc:
        verdict, note = Verdict.NOT_APPLICABLE, str(exc)
    finally:
        trace = tuple(f"{f.at:.3f}s {'->' if f.sent else '<-'} {f.text}"
                      for t in ctx.testers for f in t.frames)
        ctx.close()
    return CaseResult(case_id, "producer", desc, verdict, time.monotonic() - started,
                      expected or (rule if verdict is Verdict.FAIL else ""), got, note, trace)
