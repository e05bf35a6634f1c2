"""The block indexes of a host call, as the node checks them before a session sees them."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

from p2pfsm.errors import LocalProtocolError


def as_int(value: Any) -> Any:
    """A block index as a plain int: numpy and torch integers (anything with
    ``__index__`` but bool) become ints; anything else is left for the session to refuse
    with the index named."""
    if type(value) is int or isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def as_ints(values: Iterable[Any]) -> tuple[Any, ...]:
    """Block indexes as plain ints (:func:`as_int` each), with one C-level type check
    for the common case of a sequence of ints (256 indexes: ~3 us instead of ~25)."""
    t = tuple(values)
    if set(map(type, t)) == _JUST_INT:
        return t
    return tuple(map(as_int, t))


_JUST_INT = {int}


def check_local_indexes(what: str, indexes: Iterable[object], num_blocks: int) -> None:
    """Refuse (LocalProtocolError) an index that is not an int in ``[0, num_blocks)``."""
    outside = [i for i in indexes if type(i) is not int or not 0 <= i < num_blocks]
    if outside:
        raise LocalProtocolError(f"{what}: index {outside[0]!r} outside our region")
