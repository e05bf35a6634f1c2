"""A cheaper ``__init__`` for the frozen, slotted dataclasses built on every event.

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__(self, name, value)``: a call through a slot wrapper that packs its
arguments and looks the name up on the type again, for every field of every message,
input and output. :func:`quick_init` gives the class an ``__init__`` with the same
parameters (names, order, defaults, factories, keyword-only fields) that sets each slot
through its member descriptor's ``__set__``, bound once. The class stays what it was:
a frozen dataclass whose instances refuse assignment from outside, with the same
equality, hash, repr and fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["quick_init"]

T = TypeVar("T", bound=type)

_FACTORY: Any = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", object())
"""The default of a parameter whose field has a ``default_factory``: not given."""


def quick_init(cls: T) -> T:
    """Replace the ``__init__`` of ``cls``, a frozen dataclass with slots whose fields
    are all ``init`` fields and which has no ``__post_init__`` (else TypeError)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen dataclass with slots")
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or not all(f.init for f in fields):
        raise TypeError(f"{cls.__name__} has a __post_init__ or a field outside __init__")
    ns: dict[str, Any] = {"_FACTORY": _FACTORY}
    plain: list[str] = []
    kw_only: list[str] = []
    body: list[str] = []
    for f in fields:
        name = f.name
        param = name
        if f.default is not dataclasses.MISSING:
            ns[f"_d_{name}"] = f.default
            param = f"{name}=_d_{name}"
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"_f_{name}"] = f.default_factory
            param = f"{name}=_FACTORY"
            body.append(f"    if {name} is _FACTORY:\n        {name} = _f_{name}()")
        (kw_only if f.kw_only else plain).append(param)
        ns[f"_s_{name}"] = getattr(cls, name).__set__  # the slot's member descriptor
        body.append(f"    _s_{name}(self, {name})")
    args = ", ".join(["self", *plain, *(["*", *kw_only] if kw_only else [])])
    source = f"def __init__({args}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(compile(source, f"<quick_init {cls.__qualname__}>", "exec"), ns)  # our own text
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[misc]
    return cls
