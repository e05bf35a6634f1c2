"""Shared pytest setup: hypothesis profiles (``ci`` by default; ``long`` documented in README),
the ``slow``, ``tlc`` and ``mutation`` markers (skipped unless the run selects them, e.g.
``-m slow``) and ``--rewrite`` (the scenario transcripts' expected blocks)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "long",
    max_examples=3000,
    stateful_step_count=80,
    deadline=None,
    derandomize=False,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rewrite", action="store_true", default=False,
                     help="rewrite the expected blocks of tests/scenarios/testdata/*.txt "
                          "with what the code now renders (as P2PFSM_REWRITE=1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow``, ``tlc`` or ``mutation`` run only when the marker expression
    names them (.ci/run runs ``-m tlc`` and ``-m mutation`` as steps of their own)."""
    expr = config.option.markexpr or ""
    for marker in ("slow", "tlc", "mutation"):
        if marker in expr:
            continue
        skip = pytest.mark.skip(reason=f"{marker}: run with -m {marker}")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
