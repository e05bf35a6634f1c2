"""Campaign settings, the slow switch and the "p2pfsm fault campaigns" summary.

Environment (see docs/explanation/reliability.md):

* ``P2PFSM_CAMPAIGN_TRIALS``: trials per fault kind (default 10; 100 for ``-m slow``).
* ``P2PFSM_CAMPAIGN_CHURN``: fetches / clients of the churn campaign (default 200;
  1000 for ``-m slow``).
* ``P2PFSM_CAMPAIGN_SEED``: the seed every random choice derives from (default 11).

Tests marked ``slow`` are skipped unless the run selects them (``-m slow``).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

_LINES = pytest.StashKey[list[str]]()


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = int(raw)
    if value < 1:
        raise pytest.UsageError(f"{name} must be >= 1, got {raw!r}")
    return value


def trials(slow: bool) -> int:
    return env_int("P2PFSM_CAMPAIGN_TRIALS", 100 if slow else 10)


def churn(slow: bool) -> int:
    return env_int("P2PFSM_CAMPAIGN_CHURN", 1000 if slow else 200)


def seed() -> int:
    return env_int("P2PFSM_CAMPAIGN_SEED", 11)


@pytest.fixture
def campaign_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Append one line to the end-of-run summary (prefixed with the test's name)."""
    lines = request.config.stash.setdefault(_LINES, [])

    def add(line: str) -> None:
        lines.append(f"{request.node.name}: {line}")

    return add


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    lines = config.stash.get(_LINES, [])
    if lines:
        terminalreporter.section("p2pfsm fault campaigns")
        for line in lines:
            terminalreporter.write_line(line)
