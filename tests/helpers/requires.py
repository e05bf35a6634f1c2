"""Module-level requirements of the tests that move real bytes."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest


def needs_nixl_and_torch() -> ModuleType:
    """torch, once the calling test module is known to have torch and NIXL; otherwise
    the whole module is skipped, naming what is missing."""
    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None:
        pytest.skip("NIXL is not installed (.ci/install.sh installs it)", allow_module_level=True)
    return torch
