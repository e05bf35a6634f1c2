"""Shared pytest setup: hypothesis profiles (``ci`` by default; ``long`` documented in README;
``mutation``: ``ci`` without shrinking, for the mutation score's runs),
the ``slow``, ``tlc``, ``mutation`` and ``compiled`` markers (skipped unless the run selects
them, e.g. ``-m slow``), ``pure_only`` (skipped while p2pfsm's compiled modules are active)
and ``--rewrite`` (the scenario transcripts' expected blocks). Every machine step taken in
the test process verifies its actions' declared writes (``p2pfsm.fsm.check_writes``)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

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
settings.register_profile(  # CI's examples, no shrinking: a mutant run stops at a find
    "mutation", settings.get_profile("ci"), print_blob=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    from p2pfsm.fsm import check_writes

    check_writes(True)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--rewrite", action="store_true", default=False,
                     help="rewrite the expected blocks of tests/scenarios/testdata/*.txt "
                          "with what the code now renders (as P2PFSM_REWRITE=1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow``, ``tlc``, ``mutation``, ``compiled`` or ``interop`` run only when
    the marker expression names them (.ci/run runs ``-m tlc``, ``-m mutation`` and
    ``-m interop`` as steps of their own: the default suite never reaches for a vLLM venv,
    even one being built beside it); tests marked ``pure_only`` are skipped when p2pfsm
    runs its compiled modules."""
    expr = config.option.markexpr or ""
    pure_only = [item for item in items if item.get_closest_marker("pure_only") is not None]
    if pure_only:
        from p2pfsm.native import compiled_modules

        active = compiled_modules()
        if active:
            skip = pytest.mark.skip(reason="pure_only: patches Python code that the compiled "
                                           f"modules bind early ({', '.join(active)})")
            for item in pure_only:
                item.add_marker(skip)
    for marker in ("slow", "tlc", "mutation", "compiled", "interop"):
        if marker in expr:
            continue
        skip = pytest.mark.skip(reason=f"{marker}: run with -m {marker}")
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)
