"""One walk against a consumer under test: how we (the producer) serve its fetches and
lookups over one session, every frame it sends checked online, its printed results
checked against what we served.

The target is the ``--consumer-cmd`` process (as for the directed consumer cases),
launched once per run with ``{repeat}`` = the walk's ``serve`` steps: it connects to
us, and fetches its ``{keys}`` that many times under one request id (``{mode}`` sym:
a lookup before each fetch). A step is a plain dict (JSON), ``{"do": ACTION, ...}``:

- ``consumer`` (``mode``, ``blocks``): how the consumer is launched (the walk's first
  step; a case without it runs ``pd`` of demo blocks 0-3);
- ``serve`` (``how``): the answer to the consumer's next fetch: ``supply`` (WRITEs,
  then transfer_done(true)), ``hold`` (nothing for ``ms``, then supply: a producer
  whose blocks are still being computed), ``decline`` (transfer_done(false): a miss);
- ``lookups`` (``how``): from now on answer lookups ``split`` (two lookup_resp
  frames, the second one pump later) or ``whole`` (one frame);
- ``wait`` (pump ``ms``); faults ``delay`` (hold our sends ``ms``) and ``pause`` (do
  nothing ``ms``).

The plan is drawn up front (the consumer's repeat count is fixed at its launch); each
answer is given only when our session's machines enable it for the fetch that
arrived (tried on a copy), else the step is skipped and marked so.

Online checks: every frame of the consumer accepted by our session where it arrived
(the oracle) and from one identity; at the end, the consumer exits, and its printed
results (one JSON object, with ``attempts`` when it fetched more than once) agree
with what we served: a supplied or held load reported loaded and verified, a declined
one reported failed, the exit status 0 exactly when every load was served.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any, Final

from p2pfsm.errors import ConfigError
from p2pfsm.session import FetchArrived, HostAnswerLookup, HostDecline, HostSupply, Input
from p2pfsm.tools.conform.consumer_cases import Consumer
from p2pfsm.tools.conform.registry import Context
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.tester import NUM_BLOCKS
from p2pfsm.tools.conform.verdict import CaseFailure, NotApplicable
from p2pfsm.tools.conform.walk_run import Outcome, WalkFailure, check_frames
from p2pfsm.tools.conform.walk_tester import WalkTester, step_seconds

__all__ = ["CONSUMER_FAULTS", "run_consumer_walk"]

CONSUMER_FAULTS: Final = frozenset({"delay", "pause"})
"""The faults a consumer walk draws (``reorder`` and ``restart`` are the producer
walk's: see docs/howto/conform.md)."""
DEFAULT_LAUNCH: Final[dict[str, Any]] = {"do": "consumer", "mode": "pd",
                                         "blocks": [0, 1, 2, 3]}
MAX_FETCHES: Final = 12
"""No walk has the consumer fetch more often than this."""
_WEIGHTS: Final = {"supply": 3.0, "hold": 1.5, "decline": 1.0, "lookups": 0.7,
                   "wait": 1.0, "delay": 0.5, "pause": 0.3}


def draw_plan(target: Target, count: int, seed: int, faults: Sequence[str]) -> list[
        dict[str, Any]]:
    """``count`` steps (the launch first) drawn with ``seed``."""
    rng = random.Random(seed)
    held = min(target.blocks, NUM_BLOCKS)
    n = rng.randint(1, min(6, held))
    mode = rng.choice(("pd", "sym"))
    steps: list[dict[str, Any]] = [{"do": "consumer", "mode": mode,
                                    "blocks": sorted(rng.sample(range(held), n))}]
    bound = int(min(target.deadline / 2, 1.5) * 1000)
    serves = 0
    while len(steps) < count:
        options: list[tuple[float, dict[str, Any]]] = []
        if serves < MAX_FETCHES:
            options += [(_WEIGHTS["supply"], {"do": "serve", "how": "supply"}),
                        (_WEIGHTS["hold"], {"do": "serve", "how": "hold",
                                            "ms": rng.randint(10, bound // 2)}),
                        *([(_WEIGHTS["decline"], {"do": "serve", "how": "decline"})]
                          if mode == "pd" else [])]
        if mode == "sym":
            options.append((_WEIGHTS["lookups"], {"do": "lookups",
                                                   "how": rng.choice(("split", "whole"))}))
        options.append((_WEIGHTS["wait"], {"do": "wait", "ms": rng.randint(0, 50)}))
        for fault in sorted(CONSUMER_FAULTS & set(faults)):
            ms = rng.randint(100, max(100, bound)) if fault == "pause" else rng.randint(10, 300)
            options.append((_WEIGHTS[fault], {"do": fault, "ms": ms}))
        step = rng.choices([s for _, s in options], [w for w, _ in options])[0]
        serves += step["do"] == "serve"
        steps.append(step)
    return steps


class _Run:
    """One run of a plan: the tester, the consumer process, what we served."""

    def __init__(self, target: Target, steps: Sequence[dict[str, Any]]) -> None:
        self.target = target
        launch = next((s for s in steps if s.get("do") == "consumer"), DEFAULT_LAUNCH)
        self.mode = str(launch.get("mode", "pd"))
        blocks = launch.get("blocks", DEFAULT_LAUNCH["blocks"])
        held = min(target.blocks, NUM_BLOCKS)
        if self.mode not in ("pd", "sym") or not isinstance(blocks, list) or not blocks \
                or not all(isinstance(b, int) and 0 <= b < held for b in blocks):
            raise ConfigError(f"a consumer step needs mode pd or sym and demo blocks in "
                              f"0..{held - 1}; got {launch!r}")
        self.blocks = list(blocks)
        self.repeat = max(1, sum(s.get("do") == "serve" for s in steps))
        self.ctx = Context(target)
        self.t = WalkTester(target, lookups_in_parts=True)
        self.ctx.testers.append(self.t)
        self.t.serve = "silent"  # every fetch waits for its serve step
        self.t.park_lookups = self.mode == "sym"  # sym: every lookup waits for its serve step
        self.split = False
        self.answered = 0
        self.served: list[bool] = []  # per fetch answered: whether with our blocks
        self.done: list[dict[str, Any]] = []
        self.consumer: Consumer | None = None

    def launch(self) -> None:
        keys = ",".join(str(b) for b in self.blocks)
        self.consumer = Consumer(self.ctx, self.t, keys, self.mode, repeat=self.repeat)

    def running(self) -> bool:
        return self.consumer is not None and self.consumer.running()

    def check(self) -> None:
        check_frames(self.t, "consumer")

    def fetches(self) -> list[FetchArrived]:
        return [a for a in self.t.arrived if a.keys]

    def run(self, step: dict[str, Any]) -> None:
        t = self.t
        t.step_no = len(self.done) + 1
        step = dict(step)
        self.done.append(step)
        skipped = self._do(step)
        if skipped:
            step["skipped"] = skipped
        t.pump(0)
        self.check()

    def _do(self, step: dict[str, Any]) -> str:
        t, do = self.t, step.get("do")
        if do == "consumer":
            return "" if len(self.done) == 1 else "the consumer runs already"
        if do == "serve":
            return self._serve(step)
        if do == "lookups":
            self.split = step.get("how") == "split"
        elif do == "wait":
            t.wait(lambda: False, step_seconds(step))
        elif do == "delay":
            t.hold_sends(step_seconds(step))
        elif do == "pause":
            t.pause(step_seconds(step))
        else:
            return f"unknown action {do!r}"
        return ""

    def _serve(self, step: dict[str, Any]) -> str:
        t = self.t
        k = self.answered
        sym = self.mode == "sym"

        def came() -> bool:
            return (len(t.asked) if sym else len(self.fetches())) > k or not self.running()

        t.wait(came, 2 * self.target.deadline)
        if not t.session.ready:
            return "our session is not ready"
        if not came() or (len(t.asked) if sym else len(self.fetches())) <= k:
            return "the consumer asked nothing more"
        how = step.get("how", "supply")
        if sym and how == "decline":
            return "a decline is a pd walk's answer (sym: the lookup pins what it answers)"
        if how == "hold":
            t.wait(lambda: False, step_seconds(step))
        if sym:
            return self._answer_lookup(k)
        fetch = self.fetches()[k]
        have = [key for key in fetch.missing if key in t.held]
        supply = how != "decline" and len(have) == len(fetch.missing)
        event: Input = (HostSupply(t.next_job(), fetch.kv_request_id, tuple(have),
                                   tuple(t.held[key] for key in have)) if supply
                        else HostDecline(fetch.kv_request_id, fetch.round_seq))
        if not self.t.enables(event):
            return "not enabled by our session now (its round ended)"
        self.answered += 1
        self.served.append(supply)
        t.feed(event)
        return ""

    def _answer_lookup(self, k: int) -> str:
        """Answer the consumer's ``k``-th lookup (whole or split): its hits pin our blocks,
        and its fetch of them is served by our session."""
        t = self.t
        token, keys = next((tok, ks) for tok, ks in t.parked_lookups
                           if tok == t.asked[k].token)
        t.parked_lookups.remove((token, keys))
        now, later = (keys[:len(keys) // 2], keys[len(keys) // 2:]) if self.split \
            else (keys, ())
        hits = {key: t.held[key] for key in now if key in t.held}
        event = HostAnswerLookup(token, hits, 0 if hits else None, frozenset(later))
        if not self.t.enables(event):
            return "not enabled by our session now"
        self.answered += 1
        self.served.append(all(key in t.held for key in keys))
        t.answer_lookup(token, now, frozenset(later))
        if later:
            t.pump(0)
            t.answer_lookup(token, later)
        return ""

    def answer_rest(self) -> None:
        """Lookups the walk does not answer (past its serve steps): answered at once."""
        t = self.t
        parked, t.parked_lookups = t.parked_lookups, []
        for token, keys in parked:
            t.answer_lookup(token, keys)

    def results(self) -> None:
        """The end: the consumer exits; its report agrees with what we served."""
        c = self.consumer
        assert c is not None
        t = self.t
        t.step_no = len(self.done) + 1
        limit = 4 * self.target.deadline
        def exited() -> bool:
            self.answer_rest()
            return not self.running()

        if not t.wait(exited, limit):
            raise WalkFailure("results", f"the consumer to exit once its {self.repeat} "
                              f"fetch(es) were answered ({self.answered} answered)",
                              f"it still runs after {limit:.0f} s; " + t.summary())
        self.check()
        rc = c.proc.returncode
        report = _report(c.output(last=1 << 20))
        if report is None:
            raise WalkFailure("results", "a JSON report of the consumer's loads",
                              f"exit status {rc}; its output: {c.output()!r}")
        attempts = report.get("attempts") or [report]
        want = self.served + [False] * (self.repeat - len(self.served))
        got = [bool(a.get("success")) and bool(a.get("verified", True)) for a in attempts]
        if got != want or (rc == 0) != all(want):
            raise WalkFailure(
                "results", "the consumer reports each load as we served it (supplied or "
                "held: loaded and verified; declined or never answered: failed): "
                f"{_loads(want)}, exit "
                f"status {'0' if all(want) else 'not 0'}",
                f"{_loads(got)}, exit status {rc}; " + t.summary(6))


def _loads(ok: Sequence[bool]) -> str:
    return "[" + ", ".join("loaded" if v else "failed" for v in ok) + "]"


def _report(text: str) -> dict[str, Any] | None:
    """The consumer's last printed JSON object (anything before its ``{`` dropped)."""
    for line in reversed(text.splitlines()):
        start = line.find("{")
        if start < 0:
            continue
        try:
            doc = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(doc, dict) and "success" in doc:
            return doc
    return None


def run_consumer_walk(target: Target, *, steps: Sequence[dict[str, Any]] | None = None,
                      count: int = 0, seed: int = 0, faults: Sequence[str] = ()) -> Outcome:
    """A walk of ``count`` steps drawn with ``seed`` (``steps`` None), or the replay of
    ``steps``, against the consumer ``target.consumer_cmd`` runs."""
    plan = list(steps) if steps is not None else draw_plan(target, count, seed, faults)
    failure: WalkFailure | None = None
    r = _Run(target, plan)
    try:
        r.launch()
        for step in plan:
            r.run(step)
        r.results()
    except WalkFailure as exc:
        failure = exc
    except NotApplicable as exc:
        failure = WalkFailure("tester-error", "a consumer command the walk can run",
                              str(exc))
    except CaseFailure as exc:
        failure = WalkFailure("results", exc.expected, exc.got)
    except Exception as exc:  # the target made the tester fail: a finding
        failure = WalkFailure("tester-error", "the tester to run on (the target broke it)",
                              f"tester error: {exc!r}")
    finally:
        calls = sorted(r.t.calls, key=lambda c: c.at)
        frames = [f"{f.at:.3f}s {'->' if f.sent else '<-'} {f.text}" for f in r.t.frames]
        r.ctx.close()
    return Outcome(r.done, calls, frames, failure, len(r.served), sum(r.served), 0,
                   (r.t.local_id,))
