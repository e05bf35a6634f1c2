"""pytest plugin: run a suite against a mutated model or a planted source mutant.

    P2PFSM_MODELS_DIR=/tmp/mutated PYTHONPATH=.:tests .venv/bin/python -m pytest \\
        -p mutants.mutation_plugin tests/scenarios

``P2PFSM_MODELS_DIR`` names a directory to load the machines from instead of
``models/``; ``P2PFSM_SLIP`` a :class:`~mutants.slips.Slip` as a JSON list (module,
qualname, old line, new line) planted at configure time (the CI sample of source
mutants, ``test_mutation_sample.py``).

Used by :mod:`mutants.toml_mutator` to run the suites against a mutated model. Importing
``p2pfsm`` compiles every machine at once, so the directory cannot be set afterwards:
this plugin (imported by pytest before any test module or conftest) installs an import
hook that sets ``p2pfsm.fsm.registry.models_directory`` as soon as that module has run,
before any session module compiles its machines. Without the variable it does nothing.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from .after_import import AfterImport

REGISTRY = "p2pfsm.fsm.registry"


def _redirect(directory: Path) -> Callable[[ModuleType], None]:
    def point(module: ModuleType) -> None:
        # read by machine() and machines() at each call
        module.__dict__["models_directory"] = lambda: directory
    return point


_DIR = os.environ.get("P2PFSM_MODELS_DIR")
if _DIR:
    if REGISTRY in sys.modules:
        raise RuntimeError(f"{REGISTRY} was imported before the models could be redirected")
    sys.meta_path.insert(0, AfterImport(REGISTRY, _redirect(Path(_DIR))))


def pytest_configure(config: pytest.Config) -> None:
    raw = os.environ.get("P2PFSM_SLIP")
    if raw:
        from .slips import Slip, apply

        module, qualname, old, new = json.loads(raw)
        apply(Slip(module, qualname, old, new))


def pytest_report_header(config: pytest.Config) -> str:
    from p2pfsm.fsm import registry

    return (f"p2pfsm models: {registry.models_directory()}; "
            f"slip: {os.environ.get('P2PFSM_SLIP') or 'none'}")
