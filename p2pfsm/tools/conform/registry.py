"""The directed cases' registry: an id, the role it tests, a description and the rule."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from p2pfsm.session import Timeouts
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.tester import Tester
from p2pfsm.tools.conform.walk_tester import WalkTester

__all__ = ["CASES", "Case", "Context", "case"]


class Context:
    """What a case runs with: the target, and the testers it opened (closed after it)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.testers: list[Tester] = []
        self.closers: list[Callable[[], None]] = []  # run after the testers close

    def tester(self, timeouts: Timeouts | None = None, bind: str = "127.0.0.1:0",
               incarnation: int | None = None, lookups_in_parts: bool = False) -> Tester:
        """A fresh tester (its own sockets, NIXL agent and session); ``bind`` the same
        ``host:port`` as an earlier one to come back under its identity."""
        t = WalkTester(self.target, timeouts=timeouts, bind=bind, incarnation=incarnation,
                       lookups_in_parts=lookups_in_parts)  # its calls: a failure's account
        self.testers.append(t)
        return t

    def close(self) -> None:
        try:
            for t in self.testers:
                t.close()
        finally:
            for close in self.closers:
                close()


CaseRun = Callable[[Context], str]
"""A case body: returns a note (may be empty); raises CaseFailure or NotApplicable."""


@dataclass(frozen=True, slots=True)
class Case:
    """One directed case."""

    id: str
    role: str
    description: str
    rule: str
    run: CaseRun = field(compare=False)


CASES: dict[str, Case] = {}
"""Every case by id, in the order they run."""


def case(case_id: str, role: str, description: str, rule: str) -> Callable[[CaseRun], CaseRun]:
    """Register a case body under ``case_id``."""
    def register(run: CaseRun) -> CaseRun:
        assert case_id not in CASES, case_id
        CASES[case_id] = Case(case_id, role, description, rule, run)
        return run
    return register
