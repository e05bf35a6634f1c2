"""What one case concludes: pass, fail (expected vs got, in the models' terms) or n/a."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Verdict(enum.StrEnum):
    """A case's outcome."""

    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "n/a"


class CaseFailure(Exception):
    """The target broke a rule: ``expected`` says what the models allow, ``got`` what came."""

    def __init__(self, expected: str, got: str) -> None:
        self.expected = expected
        self.got = got
        super().__init__(f"expected: {expected}; got: {got}")


class NotApplicable(Exception):
    """The case cannot be run against this target (the reason is the message)."""


@dataclass(frozen=True, slots=True)
class CaseResult:
    """One case's verdict, with its timing and, for a failure, what was expected and got."""

    case: str
    role: str
    description: str
    verdict: Verdict
    seconds: float
    expected: str = ""
    got: str = ""
    note: str = ""
    trace: tuple[str, ...] = field(default=())
    counterexample: str = ""
    """A failed directed case: our session's calls in the models' terms (the walk's
    counterexample style)."""
    profile_expects: str = ""
    """Where the case's expected outcome differs by profile: the chosen profile's."""
    cannot_test: str = ""
    """The tester could not pass the target's handshake: why, and the fix (one line)."""

    def as_dict(self) -> dict[str, object]:
        """The JSON form of the result."""
        return {"case": self.case, "role": self.role, "description": self.description,
                "verdict": str(self.verdict), "seconds": round(self.seconds, 3),
                "expected": self.expected, "got": self.got, "note": self.note,
                "trace": list(self.trace),
                **({"counterexample": self.counterexample} if self.counterexample else {}),
                **({"profile_expects": self.profile_expects} if self.profile_expects else {}),
                **({"cannot_test": self.cannot_test} if self.cannot_test else {})}
