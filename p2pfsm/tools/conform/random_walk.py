"""The randomized mode: a seeded walk with faults, its shortest failing case, replays.

:func:`run_random` draws a walk (:mod:`~p2pfsm.tools.conform.walk_run`) of the actions our
session enables, with the faults asked for. When it fails, its steps are replayed once
against the target: a failure the replay shows again (the same rule) is confirmed,
and then shrunk (:mod:`~p2pfsm.tools.conform.shrink`) within a budget of re-runs and
seconds. The result carries the shortest case as steps and as a counterexample in the
models' terms (:mod:`~p2pfsm.tools.conform.counterexample`). :func:`run_replay` runs a case
from its steps (``--replay FILE``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pfsm.tools.conform.counterexample import render
from p2pfsm.tools.conform.shrink import Steps, clean, shrink
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.verdict import CaseResult, Verdict
from p2pfsm.tools.conform.walk_run import Outcome, WalkFailure, run_walk

CONSUMER_HEADS = ("the consumer's launch, our session until its first step",
                  "end of the walk: the consumer exits; its printed results checked")


def _walk(target: Target, **kw: Any) -> Outcome:
    """The producer walk, or the consumer walk for a consumer target."""
    if target.consumer_cmd:
        from p2pfsm.tools.conform.consumer_walk import run_consumer_walk

        kw.pop("spec", None)
        return run_consumer_walk(target, **kw)
    return run_walk(target, **kw)


def _role(target: Target) -> str:
    return "consumer" if target.consumer_cmd else "producer"


def _render(target: Target, o: Outcome) -> str:
    if target.consumer_cmd:
        first, last = CONSUMER_HEADS
        return render(o.steps, o.calls, o.failure, first=first, last=last)
    return render(o.steps, o.calls, o.failure)

__all__ = ["Budget", "WalkReport", "run_random", "run_replay"]

RULE = ("every frame allowed by the models where it arrives; every load one result; "
        "bytes exact; nothing lands in a block no open load may write")


@dataclass(frozen=True, slots=True)
class Budget:
    """What shrinking may spend: re-runs and seconds."""

    runs: int = 24
    seconds: float = 120.0


@dataclass
class WalkReport:
    """A walk's case result, and for a failure: the shortest case found (its steps and
    the counterexample text), whether a replay confirmed it, and what shrinking took."""

    result: CaseResult
    outcome: Outcome
    rule: str = ""
    case: Steps = field(default_factory=list)
    counterexample: str = ""
    confirmed: bool = False
    original: int = 0
    replays: int = 0


def _result(case_id: str, desc: str, o: Outcome, seconds: float, note: str,
            role: str) -> CaseResult:
    f = o.failure
    verdict = Verdict.FAIL if f is not None else Verdict.PASS
    return CaseResult(case_id, role, desc, verdict, seconds,
                      f.expected if f is not None else "", f.got if f is not None else "",
                      note, tuple(o.frames))


def _note(o: Outcome) -> str:
    ran = len(o.ran)
    return (f"{len(o.steps)} steps ({len(o.steps) - ran} skipped), {o.loads} loads "
            f"({o.served} served), {o.restarts} restart(s)")


def _failing(target: Target, o: Outcome, budget: Budget) -> WalkReport:
    """Confirm a failure by a replay, shrink it, and print the shortest case."""
    assert o.failure is not None
    rule = o.failure.rule
    steps = clean(o.steps)
    again = _walk(target, steps=steps)
    replays = 1
    confirmed = again.failure is not None and again.failure.rule == rule
    best = o
    case = clean(o.ran)
    if confirmed:
        kept: dict[int, Outcome] = {}

        def still_fails(candidate: Steps) -> Steps | None:
            run = _walk(target, steps=candidate)
            if run.failure is None or run.failure.rule != rule:
                return None
            kept[len(candidate)] = run
            return run.steps

        shrunk = shrink(steps, still_fails, max_runs=budget.runs, time_limit=budget.seconds)
        replays += shrunk.runs
        case = shrunk.steps
        exact = [run for run in kept.values() if len(run.ran) == len(run.steps)
                 and clean(run.steps) == case]
        if exact:  # a shrinking run of exactly the shortest case: print that one
            best = exact[-1]
        elif len(case) < len(clean(o.ran)):
            # The printed counterexample is a run of exactly the shortest case.
            final = _walk(target, steps=case)
            replays += 1
            if final.failure is not None and final.failure.rule == rule:
                best = final
            else:
                best = min(kept.values(), key=lambda r: len(r.ran))
                case = clean(best.ran)
    text = _render(target, best)
    return WalkReport(CaseResult("", "", "", Verdict.FAIL, 0.0), best, rule, case, text,
                      confirmed, len(clean(o.ran)), replays)


def run_random(target: Target, steps: int, seed: int, faults: Sequence[str] = (),
               budget: Budget | None = None, spec_log: Path | None = None,
               spec_timeout: float = 300.0) -> WalkReport:
    """A seeded walk of ``steps`` steps with ``faults``, as the case ``random.seed-S``;
    ``spec_log`` (the target's trace log): a walk inside the spec's trace bounds, then
    checked by TLC (:mod:`~p2pfsm.tools.conform.spec_check`)."""
    started = time.monotonic()
    o = _walk(target, count=steps, seed=seed, faults=faults, spec=spec_log is not None)
    desc = (f"a seeded random walk of {steps} steps of what our session enables"
            + (f", faults {','.join(faults)}" if faults else "")
            + (" (the spec's trace bounds)" if spec_log is not None else ""))
    case_id = f"random.seed-{seed}"
    if o.failure is None and spec_log is not None:
        from p2pfsm.tools.conform.spec_check import check_walk

        verdict = check_walk(o.calls, o.identities[0], target.addr, spec_log,
                             timeout=spec_timeout)
        if not verdict.explained:
            o.failure = WalkFailure("spec", "some behaviour of the TLA+ spec (TraceP2P) "
                                    "explains every call of both sessions", verdict.detail)
            text = render(o.steps, o.calls, o.failure)
            result = _result(case_id, desc, o, time.monotonic() - started,
                             f"{verdict.lines} calls; not shrunk (each try is a TLC run)",
                             "producer")
            return WalkReport(result, o, "spec", clean(o.ran), text, False,
                              len(clean(o.ran)), 0)
        note = f"{_note(o)}; {verdict.detail}"
        return WalkReport(_result(case_id, desc, o, time.monotonic() - started, note,
                                  "producer"), o)
    if o.failure is None:
        return WalkReport(_result(case_id, desc, o, time.monotonic() - started, _note(o),
                                  _role(target)), o)
    report = _failing(target, o, budget or Budget())
    note = (f"shortest case {len(report.case)} of {report.original} steps, "
            f"{report.replays} replays; " + ("confirmed by replay" if report.confirmed
                                            else "NOT confirmed by replay (timing)"))
    report.result = _result(case_id, desc, o, time.monotonic() - started, note,
                            _role(target))
    return report


def run_replay(target: Target, steps: list[dict[str, Any]], name: str) -> WalkReport:
    """One run of the case ``steps`` (no shrinking), as the case ``replay.NAME``."""
    started = time.monotonic()
    o = _walk(target, steps=clean(steps))
    result = _result(f"replay.{name}", f"a replay of {len(steps)} steps", o,
                     time.monotonic() - started, _note(o), _role(target))
    report = WalkReport(result, o, o.failure.rule if o.failure else "", clean(o.ran))
    if o.failure is not None:
        report.counterexample = _render(target, o)
        report.confirmed = True
    return report
