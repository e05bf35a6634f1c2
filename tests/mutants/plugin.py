"""pytest plugin: run any suite under the mutant ``P2PFSM_MUTANT`` names.

    P2PFSM_MUTANT=p5_producer PYTHONPATH=.:tests .venv/bin/python -m pytest \\
        -p mutants.plugin tests/scenarios

A suite that passes under a mutant did not catch it. The header line says which mutant
ran, so a log cannot be mistaken for a run of the real code.
"""

from __future__ import annotations

import pytest

from .install import active, from_env, uninstall


def pytest_configure(config: pytest.Config) -> None:
    from_env()


def pytest_unconfigure(config: pytest.Config) -> None:
    uninstall()


def pytest_report_header(config: pytest.Config) -> str:
    return f"p2pfsm mutant: {active() or 'none (the real code)'}"
