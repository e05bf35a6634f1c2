"""Every must-fail mutant is caught by the stateful test alone, in the CI profile.

One test per mutant (tests/mutants/catalogue.py): the mutant is switched on, the
two-session state machine runs with the CI profile's settings (no shrinking: finding
the failure is the point), and it must fail. ``python -m tests.mutants`` prints the
whole table, with the scenario suite and the conformance replay.
"""

from __future__ import annotations

import pytest
from stateful.machine import TwoSessions

from .catalogue import MUTANTS
from .install import active
from .runner import stateful


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_the_stateful_test_catches(name: str) -> None:
    outcome = stateful(name, TwoSessions)
    assert active() is None, "the mutant was not switched off"
    assert outcome.caught, f"{name} ({MUTANTS[name].what}) passed {outcome.examples} examples"
    print(f"{name}: caught after {outcome.examples} examples, {outcome.seconds:.1f} s: "
          f"{outcome.detail}")
