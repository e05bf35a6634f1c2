"""pytest plugin: one of mutmut's mutants planted in the real package, in memory.

    P2PFSM_MUTMUT=p2pfsm.session.core.xǁSessionǁanswer__mutmut_2 \\
        PYTHONPATH=.:tests python -m pytest -p mutants.mutmut_plugin tests/stateful

mutmut's copy of the package (``mutants/``) runs every mutated function through a
trampoline, which makes a suite several times slower. Here the one mutated function's
body is taken from mutmut's file (``mutants/<module>.py``: the ``def`` of the mutant's
name), compiled under the original function's name, and put into the original function
object (``__code__``), the way :mod:`mutants.slips` plants a slip: every reference to
the function runs the mutant, nothing else changes, nothing is written to disk.

The module is patched as soon as it has been imported (an import hook installed when
pytest loads this plugin, before any test module or conftest), so a function that
other modules call while they import (the models' loader) runs mutated too.
"""

from __future__ import annotations
import __future__

import ast
import os
import sys
import textwrap
from pathlib import Path
from types import CodeType, FunctionType, ModuleType

from .after_import import AfterImport

ENV = "P2PFSM_MUTMUT"
MUTANTS_DIR = Path(__file__).resolve().parents[2] / "mutants"


def split(key: str) -> tuple[str, str | None, str]:
    """(module, class or None, function) of a mutant key such as
    ``pkg.mod.xǁClassǁname__mutmut_3`` or ``pkg.mod.x_name__mutmut_3``."""
    module, _, mangled = key.partition("__mutmut_")[0].rpartition(".")
    if mangled.startswith("xǁ"):
        _, cls, func = mangled.split("ǁ")
        return module, cls, func
    return module, None, mangled.removeprefix("x_")


def original(module: ModuleType, cls: str | None, func: str) -> FunctionType:
    owner: object = module if cls is None else getattr(module, cls)
    found = vars(owner).get(func) if cls is not None else getattr(owner, func, None)
    found = getattr(found, "fget", None) or getattr(found, "__func__", None) or found
    if not isinstance(found, FunctionType):
        raise LookupError(f"{module.__name__}.{cls}.{func} is not a plain function")
    return found


def mutated_code(key: str, target: FunctionType, mutants_dir: Path = MUTANTS_DIR) -> CodeType:
    """The mutant's body, compiled as ``target`` (its name, its free variables)."""
    module, _, func = split(key)
    path = mutants_dir / Path(*module.split(".")).with_suffix(".py")
    if not path.exists():
        path = mutants_dir / Path(*module.split(".")) / "__init__.py"
    source = path.read_text()
    name = key.rpartition(".")[2]
    node = next((n for n in ast.walk(ast.parse(source))
                 if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name),
                None)
    if node is None:
        raise LookupError(f"{key}: no such function in {path}")
    node.decorator_list = []
    node.name = func
    text = ast.unparse(node)
    if target.__code__.co_freevars:  # super(): compiled inside a class for its __class__ cell
        text = "class _Owner:\n" + textwrap.indent(text, "    ")
    compiled = compile(text, str(path), "exec", flags=__future__.annotations.compiler_flag,
                       dont_inherit=True)
    consts = [c for c in compiled.co_consts if isinstance(c, CodeType)]
    if target.__code__.co_freevars:
        consts = [c for c in consts[0].co_consts if isinstance(c, CodeType)]
    code = next(c for c in consts if c.co_name == func)
    if code.co_freevars != target.__code__.co_freevars:
        raise LookupError(f"{key}: free variables {code.co_freevars} differ from "
                          f"{target.__code__.co_freevars}")
    return code.replace(co_qualname=target.__code__.co_qualname)


def plant(key: str, module: ModuleType) -> None:
    _, cls, func = split(key)
    target = original(module, cls, func)
    target.__code__ = mutated_code(key, target)


_KEY = os.environ.get(ENV, "").strip()
if _KEY:
    if split(_KEY)[0] in sys.modules:
        plant(_KEY, sys.modules[split(_KEY)[0]])
    else:
        sys.meta_path.insert(0, AfterImport(split(_KEY)[0], lambda m: plant(_KEY, m)))
