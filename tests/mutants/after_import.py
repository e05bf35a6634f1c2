"""An import hook that lets one module run as usual, then hands it to a function (the
mutation plugins plant a mutant or redirect the models there, before anything uses it)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
from collections.abc import Callable, Sequence
from types import ModuleType


class AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``name`` as usual, runs it, then calls ``then`` with the module."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.then = then
        self.inner: importlib.abc.Loader | None = None

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        self.inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        assert self.inner is not None
        self.inner.exec_module(module)
        self.then(module)
