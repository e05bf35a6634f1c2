"""Every must-fail mutant is caught by the stateful test alone, in the CI profile.

One test per mutant (tests/mutants/catalogue.py): the mutant is switched on, the
two-session state machine runs with the CI profile's settings (no shrinking: finding
the failure is the point) from a fixed hypothesis seed, so the outcome is the same on
every run, and it must fail a named check (an AssertionError; a hypothesis error is not
a catch). ``python -m tests.mutants --seeds 10`` gives the catch rate over seeds 0-9
(docs/explanation/verification.md, "Mutants"); ``python -m tests.mutants`` the other suites.
"""

from __future__ import annotations

import pytest
from stateful.machine import TwoSessions

from p2pfsm.native import SOURCES, module_name

from .catalogue import MUTANTS
from .install import active
from .runner import check_of, stateful

SEED = 0
"""The hypothesis seed of this test (one of the seeds the table's rate is taken over)."""


_COMPILABLE = {module_name(s) for s in SOURCES}


def _mutant(name: str) -> object:
    """A slip into a module the compiled build compiles is ``pure_only``: it swaps a
    Python function's code, which an extension module does not have."""
    slip = MUTANTS[name].slip
    if slip is not None and slip.module in _COMPILABLE:
        return pytest.param(name, marks=pytest.mark.pure_only)
    return name


@pytest.mark.parametrize("name", [_mutant(n) for n in sorted(MUTANTS)])
def test_the_stateful_test_catches(name: str) -> None:
    outcome = stateful(name, TwoSessions, seed_=SEED)
    assert active() is None, "the mutant was not switched off"
    assert outcome.caught, (f"{name} ({MUTANTS[name].what}) passed {outcome.examples} "
                            f"examples: {outcome.detail}")
    print(f"{name}: caught after {outcome.examples} examples, {outcome.seconds:.1f} s by "
          f"{check_of(outcome)}: {outcome.detail}")
