"""One walk against a producer under test: drawn online from what our session enables, or
replayed from a list of steps; every frame and every byte checked as it comes.

A step is a plain dict (JSON), ``{"do": ACTION, ...}``:

- host inputs of the consumer role, as the input table (``models/inputs.toml``) lists
  them (``fetch``, ``lookup``, ``finish``); a fetch names its request (a new one, or
  one fetched before: its next round), the demo blocks (:data:`MISSING` for a key the
  target does not hold) and our destination blocks;
- frames a correct consumer may send beside its session, whose answers the models
  declare: ``dup-ack`` (a second connect_ack), ``stale-abort`` (an abort_fetch of a round
  that ended or is racing its end), ``unknown-type``;
- ``wait`` (pump for ``ms``);
- faults: ``delay`` (hold our sends ``ms``), ``reorder`` (no NIXL progress ``ms``),
  ``pause`` (do nothing ``ms``), ``restart`` (die without disconnect and come back on
  the same ``host:port`` with a new NIXL agent, a new incarnation and a fresh session).

When drawing, every candidate host input is tried on a copy of our session first: only
those the models enable in its current state are drawn. A replayed step that is not
enabled any more (a shrunk walk dropped what it needed) is skipped and marked so.

Online checks, after every step: every frame the target sent was accepted by our session
where it arrived (the oracle), frames come from the target's identity only, every
successful load is byte-exact, and every block of ours that no open load may write
still holds the sentinel byte (a WRITE into a released or never-fetched block shows at
once). At the end every request is finished, every load must have its result, and the
session must still be ready.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack
import torch

from p2pfsm.demo_blocks import demo_key
from p2pfsm.errors import LocalProtocolError
from p2pfsm.fsm import input_table
from p2pfsm.protocol import AbortFetch, ConnectAck
from p2pfsm.session import HostFetch, HostFinish, HostLookup, Input
from p2pfsm.tools.conform.faults import FAULTS
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.tester import NUM_BLOCKS
from p2pfsm.tools.conform.verdict import CaseFailure
from p2pfsm.tools.conform.walk_tester import Call, WalkTester, step_seconds

__all__ = ["FAULTS", "MISSING", "Outcome", "WalkFailure", "check_frames", "run_walk"]

MISSING: Final = 1 << 40
"""A demo block number no target holds."""
SENTINEL: Final = 0x5A
"""What every block of ours holds while no load may write it."""
RESTART_ATTEMPTS: Final = 3
SPEC_RID: Final = "r1"
SPEC_BUDGET: Final = ("fetch", "lookup", "finish")
SPEC_FAULTS: Final = frozenset({"delay", "reorder"})
CONSUMER_INPUTS: Final = tuple(
    name for name, row in input_table().of_kind("host").items()
    if row.machine in ("client_round", "client_lookup"))
"""The host inputs of the consumer role, read off the input table."""
_WEIGHTS: Final = {"fetch": 3.0, "fetch-missing": 1.0, "fetch-again": 1.0, "lookup": 1.5,
                   "finish": 2.0, "dup-ack": 0.3, "stale-abort": 0.8, "unknown-type": 0.3,
                   "wait": 2.0,
                   "delay": 0.5, "reorder": 0.5, "pause": 0.3, "restart": 0.15}


class WalkFailure(CaseFailure):
    """A broken rule, with a short id (``oracle``, ``identity``, ``bytes``,
    ``stray-write``, ``results``, ``ready``, ``handshake``, ``tester-error``) so that a
    shrunk walk can be held to the same rule."""

    def __init__(self, rule: str, expected: str, got: str) -> None:
        super().__init__(expected, got)
        self.rule = rule


def check_frames(t: WalkTester, who: str) -> None:
    """The walks' frame checks: every frame of ``who`` accepted by our session where it
    arrived (the oracle), and sent from one identity."""
    if t.violations:
        raise WalkFailure("oracle", f"every frame of the {who} accepted by p2pfsm's "
                          "session machines in the state it arrived in", t.summary())
    if t.other_ids:
        raise WalkFailure("identity", f"frames only from the identity {t.peer!r}",
                          f"frames from {sorted(set(t.other_ids))}")


@dataclass
class Outcome:
    """What a walk did: the steps as run (skipped ones marked), our session's calls, the
    frames both ways, and the failure (None: it passed)."""

    steps: list[dict[str, Any]]
    calls: list[Call]
    frames: list[str]
    failure: WalkFailure | None
    loads: int = 0
    served: int = 0
    restarts: int = 0
    identities: tuple[str, ...] = ()
    """Our tester's identity (``host:port``), one per incarnation."""

    @property
    def ran(self) -> list[dict[str, Any]]:
        """The steps that were not skipped."""
        return [s for s in self.steps if "skipped" not in s]


@dataclass
class _Load:
    rid: str
    blocks: list[int]
    slots: list[int]


@dataclass
class _Walk:
    target: Target
    faults: frozenset[str]
    spec: bool = False
    """Stay inside the TLA+ trace bounds: one request, one key, host inputs at most twice
    each, no frame beside our session, only faults the trace cannot show."""
    t: WalkTester = field(init=False)
    budget: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPEC_BUDGET, 2))
    testers: list[WalkTester] = field(default_factory=list)
    free: list[int] = field(default_factory=lambda: list(range(NUM_BLOCKS)))
    loads: dict[int, _Load] = field(default_factory=dict)
    unfinished: list[str] = field(default_factory=list)
    fetched: list[str] = field(default_factory=list)
    seen: int = 0
    serial: int = 0
    incarnation: int = 1
    restarts: int = 0
    done: list[dict[str, Any]] = field(default_factory=list)

    @property
    def held(self) -> int:
        return min(self.target.blocks, NUM_BLOCKS)

    # -- testers ------------------------------------------------------------------

    def open(self, bind: str = "127.0.0.1:0") -> WalkTester:
        t = WalkTester(self.target, bind=bind, incarnation=self.incarnation)
        self.testers.append(t)
        t.step_no = len(self.done)
        region = t.data.region
        assert region is not None
        region.fill_(SENTINEL)
        self.t = t
        self.free, self.loads, self.unfinished, self.fetched, self.seen = \
            list(range(NUM_BLOCKS)), {}, [], [], 0
        return t

    def handshake(self) -> None:
        t = self.open()
        t.start()
        t.wait(_settled(t), self.target.deadline)
        if not t.session.ready:
            raise WalkFailure("handshake", "the handshake to complete: the target's connect "
                              "and its connect_ack for ours (session: connecting -> "
                              "registering -> awaiting_ack -> ready)", t.summary())

    def restart(self) -> str:
        identity = self.t.local_id
        self.t.close()  # dies: nothing more is sent
        for attempt in range(1, RESTART_ATTEMPTS + 1):
            self.incarnation += 1
            t = self.open(bind=identity)
            t.start()
            t.wait(_settled(t), self.target.deadline)
            if t.session.ready:
                self.restarts += 1
                return f"ready after {attempt} connect(s)"
            t.close()
        raise WalkFailure("handshake", f"a ready session for the restarted peer within "
                          f"{RESTART_ATTEMPTS} connects (a connect of a new incarnation ends "
                          "the old session)", self.t.summary())

    def close(self) -> None:
        for t in self.testers:
            t.close()

    # -- checks -------------------------------------------------------------------

    def reclaim(self) -> None:
        """Check the loads that ended; give back the blocks their results released."""
        t = self.t
        for r in t.loads[self.seen:]:
            load = self.loads.pop(r.job_id, None)
            if load is None:
                continue
            if r.success:
                try:
                    t.check_blocks(load.blocks, load.slots)
                except CaseFailure as exc:
                    raise WalkFailure("bytes", exc.expected, exc.got) from None
            if r.released:
                region = t.data.region
                assert region is not None
                for s in load.slots:
                    region[s].fill_(SENTINEL)
                self.free += load.slots
        self.seen = len(t.loads)

    def check(self) -> None:
        """Every online check (see the module's docstring)."""
        t = self.t
        check_frames(t, "target")
        self.reclaim()
        region = t.data.region
        assert region is not None
        if self.free:
            idx = torch.tensor(sorted(self.free))
            bad = (region[idx] != SENTINEL).any(dim=1)
            if bool(bad.any()):
                slot = int(idx[int(bad.nonzero()[0])])
                raise WalkFailure(
                    "stray-write", f"no byte written into our block {slot}: no load of "
                    "ours may write it (never fetched into, or released by its round's "
                    "transfer_done or abort_ack)", t.summary())

    # -- drawing ------------------------------------------------------------------

    def draw(self, rng: random.Random) -> dict[str, Any]:
        """One step drawn from what is enabled now."""
        options: list[tuple[float, dict[str, Any]]] = []
        if self.spec and self.t.session.ready:
            for name in CONSUMER_INPUTS:
                if self.budget.get(name, 0) > 0:
                    options += self._spec_options(name, rng)
        elif self.t.session.ready:
            for name in CONSUMER_INPUTS:
                options += self._host_options(name, rng)
            options.append((_WEIGHTS["dup-ack"], {"do": "dup-ack"}))
            options.append((_WEIGHTS["unknown-type"], {"do": "unknown-type"}))
            if self.fetched:
                options.append((_WEIGHTS["stale-abort"],
                                {"do": "stale-abort", "rid": rng.choice(self.fetched),
                                 "round": 0}))
        options.append((_WEIGHTS["wait"], {"do": "wait", "ms": rng.randint(0, 50)}))
        bound = int(min(self.target.deadline / 2, 1.5) * 1000)
        for fault in sorted(self.faults & SPEC_FAULTS if self.spec else self.faults):
            ms = rng.randint(100, max(100, bound)) if fault == "pause" else rng.randint(10, 300)
            options.append((_WEIGHTS[fault], {"do": fault} if fault == "restart"
                            else {"do": fault, "ms": ms}))
        weights = [w for w, _ in options]
        return rng.choices([s for _, s in options], weights)[0]

    def _host_options(self, name: str, rng: random.Random) -> list[tuple[float, dict[str, Any]]]:
        out: list[tuple[float, dict[str, Any]]] = []
        if name == "fetch" and self.free:
            for kind in ("fetch", "fetch-missing", "fetch-again"):
                n = rng.randint(1, min(8, self.held))
                blocks = rng.sample(range(self.held), n)
                if kind == "fetch-missing":
                    blocks.insert(rng.randint(0, n), MISSING)
                if len(blocks) > len(self.free) or (kind == "fetch-again"
                                                    and not self.fetched):
                    continue
                rid = rng.choice(self.fetched) if kind == "fetch-again" else self._next_rid()
                slots = rng.sample(self.free, len(blocks))
                if self.t.enables(HostFetch(0, rid, _keys(blocks), tuple(slots))):
                    out.append((_WEIGHTS[kind], {"do": "fetch", "rid": rid, "blocks": blocks,
                                                 "slots": slots}))
        elif name == "lookup":
            blocks = [*rng.sample(range(self.held), rng.randint(1, min(4, self.held))),
                      MISSING]
            rid = self._next_rid()
            if self.t.enables(HostLookup(rid, _keys(blocks))):
                out.append((_WEIGHTS["lookup"], {"do": "lookup", "rid": rid, "blocks": blocks}))
        elif name == "finish" and self.unfinished:
            rid = rng.choice(self.unfinished)
            if self.t.enables(HostFinish(rid)):
                out.append((_WEIGHTS["finish"], {"do": "finish", "rid": rid}))
        return out

    def _spec_options(self, name: str, rng: random.Random) -> list[tuple[float, dict[str, Any]]]:
        """The spec profile's candidates: request r1, demo block 0 or a missing one."""
        blocks = [rng.choice((0, 0, MISSING))]
        event: Input
        if name == "fetch" and self.free:
            slots = [rng.choice(self.free)]
            event = HostFetch(0, SPEC_RID, _keys(blocks), tuple(slots))
            step = {"do": "fetch", "rid": SPEC_RID, "blocks": blocks, "slots": slots}
        elif name == "lookup":
            event = HostLookup(SPEC_RID, _keys(blocks))
            step = {"do": "lookup", "rid": SPEC_RID, "blocks": blocks}
        elif name == "finish":
            event = HostFinish(SPEC_RID)
            step = {"do": "finish", "rid": SPEC_RID}
        else:
            return []
        return [(_WEIGHTS[name], step)] if self.t.enables(event) else []

    def _next_rid(self) -> str:
        return f"w{self.serial + 1}"

    # -- running ------------------------------------------------------------------

    def run(self, step: dict[str, Any]) -> None:
        """Carry out one step, record it as run (or skipped), then check."""
        t = self.t
        t.step_no = len(self.done) + 1
        step = dict(step)
        self.done.append(step)
        try:
            skipped = self._do(step)
        except LocalProtocolError as exc:
            skipped = f"not enabled: {exc}"
        if skipped:
            step["skipped"] = skipped
        elif step.get("do") in self.budget:
            self.budget[str(step["do"])] -= 1
        self.t.pump(0)
        self.check()

    def _do(self, step: dict[str, Any]) -> str:
        t, do = self.t, step.get("do")
        rid = str(step.get("rid", ""))
        if rid.startswith("w") and rid[1:].isdigit():
            self.serial = max(self.serial, int(rid[1:]))
        if do in ("fetch", "lookup", "finish", "dup-ack", "stale-abort", "unknown-type") \
                and not t.session.ready:
            return "our session is not ready"
        if do == "fetch":
            blocks, slots = list(step["blocks"]), list(step["slots"])
            def released() -> bool:
                self.reclaim()
                return set(slots) <= set(self.free)

            if not t.wait(released, self.target.deadline):
                return "its destination blocks were not released in time"
            job = t.fetch(rid, blocks, slots)
            self.free = [s for s in self.free if s not in slots]
            self.loads[job] = _Load(rid, blocks, slots)
            self._started(rid)
            if rid not in self.fetched:
                self.fetched.append(rid)
        elif do == "lookup":
            t.lookup(rid, list(step["blocks"]))
            self._started(rid)
        elif do == "finish":
            if rid not in self.unfinished and not self.spec:
                return "no such request open"
            t.finish(rid)
            if rid in self.unfinished:
                self.unfinished.remove(rid)
        elif do == "dup-ack":
            t.send(ConnectAck(t.local_id))
        elif do == "stale-abort":
            t.send(AbortFetch(rid, int(step.get("round", 0))))
        elif do == "unknown-type":
            t.send_raw(msgpack.packb({"type": "conform-unknown"}), "<unknown type>")
        elif do == "wait":
            t.wait(lambda: False, step_seconds(step))
        elif do == "delay":
            t.hold_sends(step_seconds(step))
        elif do == "reorder":
            t.stall_nixl(step_seconds(step))
        elif do == "pause":
            t.pause(step_seconds(step))
        elif do == "restart":
            step["note"] = self.restart()
        else:
            return f"unknown action {do!r}"
        return ""

    def _started(self, rid: str) -> None:
        if rid not in self.unfinished:
            self.unfinished.append(rid)

    def _finish_quietly(self, rid: str) -> None:
        if self.t.session.ready and rid in self.unfinished:
            with contextlib.suppress(LocalProtocolError):
                self.t.finish(rid)
            self.unfinished.remove(rid)

    def finish_all(self) -> None:
        """The end: finish every open request (those with a load of held blocks in
        flight once it ended, or after ``--deadline``), wait for every load's result,
        watch one window, check everything once more and that the session is still
        ready."""
        t = self.t
        t.step_no = len(self.done) + 1

        def serving() -> set[str]:
            """Requests with a load of held blocks only still open (it should be served)."""
            self.reclaim()
            return {ld.rid for ld in self.loads.values() if MISSING not in ld.blocks}

        # Let loads of held blocks end as they would (a finish would abort them), then
        # finish every request.
        busy = serving()
        for rid in [r for r in self.unfinished if r not in busy]:
            self._finish_quietly(rid)
        t.wait(lambda: not serving(), self.target.deadline)
        for rid in list(self.unfinished):
            self._finish_quietly(rid)
        self.unfinished.clear()

        def settled() -> bool:
            self.reclaim()
            return not self.loads and not t.holding

        if not t.wait(settled, self.target.deadline + 2 * t.session.config.timeouts.abort_ack):
            self.check()
            raise WalkFailure("results", "one result for every load once every request is "
                              "finished (transfer_done or abort_ack for every round)",
                              t.summary())
        t.observe()
        self.check()
        if not t.session.ready:
            raise WalkFailure("ready", "the session still ready after the walk", t.summary())


def _settled(t: WalkTester) -> Callable[[], bool]:
    return lambda: t.session.ready or not t.session.alive


def _keys(blocks: Sequence[int]) -> tuple[bytes, ...]:
    return tuple(demo_key(b) for b in blocks)


def run_walk(target: Target, *, steps: Sequence[dict[str, Any]] | None = None,
             count: int = 0, seed: int = 0, faults: Sequence[str] = (),
             time_limit: float = 600.0, spec: bool = False) -> Outcome:
    """A walk of ``count`` steps drawn with ``seed`` (``steps`` None) or the replay of
    ``steps``; bounded by ``time_limit`` seconds of steps (then it ends early). ``spec``:
    draw inside the TLA+ trace bounds (see ``_Walk.spec``)."""
    w = _Walk(target, frozenset(faults), spec)
    rng = random.Random(seed)
    failure: WalkFailure | None = None
    end = time.monotonic() + time_limit
    try:
        w.handshake()
        todo = list(steps) if steps is not None else None
        n = len(todo) if todo is not None else count
        for i in range(n):
            if time.monotonic() > end:
                break
            w.run(todo[i] if todo is not None else w.draw(rng))
        w.finish_all()
    except WalkFailure as exc:
        failure = exc
    except Exception as exc:  # the target made the tester fail: a finding
        failure = WalkFailure("tester-error", "the tester to run on (the target broke it)",
                              f"tester error: {exc!r}")
    finally:
        calls = sorted((c for t in w.testers for c in t.calls), key=lambda c: c.at)
        frames = [f"{f.at:.3f}s {'->' if f.sent else '<-'} {f.text}"
                  for t in w.testers for f in t.frames]
        loads = sum(len(t.loads) for t in w.testers)
        served = sum(r.success for t in w.testers for r in t.loads)
        w.close()
    return Outcome(w.done, calls, frames, failure, loads, served, w.restarts,
                   tuple(dict.fromkeys(t.local_id for t in w.testers)))
