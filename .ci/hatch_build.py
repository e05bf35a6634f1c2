"""hatchling build hook: the opt-in compiled wheel.

``P2PFSM_COMPILE=1 pip wheel --no-deps .`` builds a wheel whose ``p2pfsm/fsm`` and
``p2pfsm/protocol`` modules are mypyc extension modules (``p2pfsm/native.py`` says which
and does the build; the ``.py`` files ship too). Without the variable this hook does
nothing: the wheel stays pure Python, as CI's ``.ci/check-wheel.sh`` builds it. An
editable install is never compiled (``python -m p2pfsm.native build`` compiles a checkout
in place).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ENV = "P2PFSM_COMPILE"


def _native(root: Path) -> ModuleType:
    """``p2pfsm/native.py`` loaded by path: the package's dependencies are not installed
    in the build environment, and that module needs none of them."""
    spec = importlib.util.spec_from_file_location("_p2pfsm_native_build",
                                                  root / "p2pfsm" / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CustomBuildHook(BuildHookInterface):
    """Adds the compiled modules to a wheel when ``P2PFSM_COMPILE=1``."""

    _out: Path | None = None

    def _wanted(self) -> bool:
        return self.target_name == "wheel" and os.environ.get(ENV) == "1"

    def dependencies(self) -> list[str]:
        return ["mypy>=1.10", "setuptools"] if self._wanted() else []

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if not self._wanted() or version == "editable":
            return
        self._out = Path(tempfile.mkdtemp(prefix="p2pfsm-mypyc-wheel-"))
        for path in _native(Path(self.root)).build(Path(self.root), self._out):
            build_data["force_include"][str(path)] = path.relative_to(self._out).as_posix()
        build_data["pure_python"] = False
        build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._out is not None:
            shutil.rmtree(self._out, ignore_errors=True)
            self._out = None
