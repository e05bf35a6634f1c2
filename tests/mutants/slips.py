"""Planted slips: one line of the product code changed, in memory, while a mutant is on.

A :class:`Slip` names a function of the package and one line of its source, and the
line a developer might have written instead. :func:`apply` recompiles the function with
that line swapped (same file name and line numbers, so a traceback points at the real
line) and puts the new code object into the existing function object, so every
reference to it (methods, names imported elsewhere) runs the slip; the undo puts the
original code back. Nothing is written to disk: the product code never holds a slip.

The wrappers of :mod:`mutants.catalogue` reproduce vLLM's races at the Session
boundary; these are the other kind, bugs planted inside the code (issue 24's table),
which only a search that reaches their window can see.
"""

from __future__ import annotations
import __future__

import importlib
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType, FunctionType


@dataclass(frozen=True)
class Slip:
    """In ``module``'s function ``qualname``, the line holding ``old`` holds ``new``."""

    module: str
    qualname: str
    old: str
    new: str

    @property
    def where(self) -> str:
        return f"{self.module}.{self.qualname}"


def target(slip: Slip) -> FunctionType:
    """The function object the slip changes (looked up in class dicts, undecorated)."""
    obj: object = importlib.import_module(slip.module)
    for part in slip.qualname.split("."):
        found = vars(obj).get(part) if isinstance(obj, type) else getattr(obj, part, None)
        if found is None:
            raise LookupError(f"{slip.where}: no {part!r}")
        obj = found
    if not isinstance(obj, FunctionType):
        raise LookupError(f"{slip.where} is not a plain function")
    return obj


def compiled(slip: Slip) -> tuple[FunctionType, CodeType]:
    """The function and its code with the slip in (raises if ``old`` is not there once)."""
    func = target(slip)
    lines, first = inspect.getsourcelines(func)
    source = "".join(lines)
    if source.count(slip.old) != 1:
        raise LookupError(f"{slip.where}: {slip.old!r} occurs {source.count(slip.old)} times "
                          "(the code changed: update the slip)")
    text = "\n" * (first - 1) + textwrap.dedent(source.replace(slip.old, slip.new))
    module = compile(text, inspect.getsourcefile(func) or "<slip>", "exec",
                     flags=__future__.annotations.compiler_flag, dont_inherit=True)
    code = next(c for c in module.co_consts
                if isinstance(c, CodeType) and c.co_name == func.__name__)
    if code.co_freevars != func.__code__.co_freevars:
        raise LookupError(f"{slip.where}: closures (super(), nested scopes) are not supported")
    return func, code.replace(co_qualname=func.__code__.co_qualname)


def apply(slip: Slip) -> Callable[[], None]:
    """Plant the slip; returns the function that takes it out again."""
    func, code = compiled(slip)
    original = func.__code__
    func.__code__ = code

    def undo() -> None:
        func.__code__ = original

    return undo
