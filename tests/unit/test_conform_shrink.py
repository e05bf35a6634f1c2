"""Delta debugging of a failing walk (``p2pfsm.tools.conform.shrink``): it finds a 1-minimal
case within its budget, keeps only steps a failing run ran, and stops when spent."""

from __future__ import annotations

from typing import Any

from p2pfsm.tools.conform.shrink import clean, shrink

Steps = list[dict[str, Any]]


def _steps(n: int) -> Steps:
    return [{"do": "wait", "rid": f"w{i}", "ms": i, "note": "x"} for i in range(n)]


def _fails_with(*needed: str) -> Any:
    def still_fails(candidate: Steps) -> Steps | None:
        return candidate if set(needed) <= {s["rid"] for s in candidate} else None
    return still_fails


def test_the_shortest_case_keeps_exactly_the_steps_that_matter() -> None:
    result = shrink(_steps(20), _fails_with("w3", "w7", "w9"), max_runs=100)
    assert [s["rid"] for s in result.steps] == ["w3", "w7", "w9"]
    assert not result.exhausted
    assert all("note" not in s for s in result.steps)


def test_a_failing_run_that_stopped_early_cuts_the_rest() -> None:
    def stops_at_w5(candidate: Steps) -> Steps | None:
        rids = [s["rid"] for s in candidate]
        if "w5" not in rids:
            return None
        ran = candidate[:rids.index("w5") + 1]
        return [*ran, {"do": "wait", "skipped": "x"}]

    result = shrink(_steps(12), stops_at_w5, max_runs=50)
    assert [s["rid"] for s in result.steps] == ["w5"]


def test_the_budget_bounds_the_reruns() -> None:
    calls: list[int] = []

    def never(candidate: Steps) -> Steps | None:
        calls.append(len(candidate))
        return None

    result = shrink(_steps(30), never, max_runs=7)
    assert len(calls) == result.runs == 7
    assert result.exhausted and len(result.steps) == 30


def test_clean_drops_what_a_run_added() -> None:
    assert clean([{"do": "fetch", "rid": "w1", "blocks": [1], "slots": [2], "skipped": "y",
                   "note": "z"}]) == [{"do": "fetch", "rid": "w1", "blocks": [1], "slots": [2]}]
