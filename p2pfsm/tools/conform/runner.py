"""Run the chosen cases against one target, each with fresh testers, timing each."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from p2pfsm.errors import ConfigError
from p2pfsm.tools.conform import (  # noqa: F401  (register cases)
    consumer_cases,
    consumer_session_cases,
    producer_cases,
    producer_lookup_cases,
)
from p2pfsm.tools.conform.preflight import cannot_test
from p2pfsm.tools.conform.profiles import expected as profile_expects
from p2pfsm.tools.conform.registry import CASES, Case, Context
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.verdict import CaseFailure, CaseResult, NotApplicable, Verdict
from p2pfsm.tools.conform.walk_tester import WalkTester

__all__ = ["cases_for", "run_case", "run_cases"]

log = logging.getLogger("p2pfsm.tools.conform")


def cases_for(role: str, ids: Sequence[str] | None = None) -> list[Case]:
    """The cases of ``role`` (all of them, or those named, in registry order); a
    ConfigError names an unknown id or one of another role."""
    if ids:
        unknown = [i for i in ids if i not in CASES]
        if unknown:
            raise ConfigError(f"--cases: unknown case(s) {', '.join(unknown)}; known: "
                              f"{', '.join(CASES)}")
        other = [i for i in ids if CASES[i].role != role]
        if other:
            raise ConfigError(f"--cases: {', '.join(other)} test(s) another role than "
                              f"{role}")
    return [c for c in CASES.values() if c.role == role and (not ids or c.id in ids)]


def run_case(target: Target, c: Case, profile: str = "native") -> CaseResult:
    """One case with fresh testers; every exception of the tester is its verdict. A
    failure whose cause is a handshake the tester cannot pass says so
    (``cannot_test``)."""
    ctx = Context(target)
    started = time.monotonic()
    expected = got = note = blocked = ""
    try:
        note = c.run(ctx)
        verdict = Verdict.PASS
    except CaseFailure as exc:
        verdict, expected, got = Verdict.FAIL, exc.expected, exc.got
    except NotApplicable as exc:
        verdict, note = Verdict.NOT_APPLICABLE, str(exc)
    except Exception as exc:  # the target made the tester itself fail: a finding
        log.debug("case %s: tester error", c.id, exc_info=True)
        verdict, expected, got = Verdict.FAIL, c.rule, f"tester error: {exc!r}"
    finally:
        trace = tuple(f"{f.at:7.3f}s {'->' if f.sent else '<-'} {f.text}"
                      for t in ctx.testers for f in t.frames)
        calls = sorted((call for t in ctx.testers if isinstance(t, WalkTester)
                        for call in t.calls), key=lambda call: call.at)
        if verdict is Verdict.FAIL:
            blocked = cannot_test(target, [f for t in ctx.testers for f in t.frames])
        ctx.close()
    if verdict is Verdict.FAIL and not expected:
        expected = c.rule
    account = ""
    if verdict is Verdict.FAIL:
        from p2pfsm.tools.conform.counterexample import render_case

        account = render_case(c.id, calls)
    return CaseResult(c.id, c.role, c.description, verdict, time.monotonic() - started,
                      expected, got, note, trace, account, profile_expects(c.id, profile),
                      blocked)


def run_cases(target: Target, cases: Sequence[Case],
              progress: Callable[[CaseResult], None] | None = None,
              profile: str = "native") -> list[CaseResult]:
    """Every case in order; ``progress`` hears each result as it comes. A case that
    finds the target's handshake cannot be passed is the last: the rest would fail the
    same way."""
    results = []
    for c in cases:
        result = run_case(target, c, profile)
        if result.cannot_test:
            results.append(result)
            break
        if progress is not None:
            progress(result)
        results.append(result)
    return results
