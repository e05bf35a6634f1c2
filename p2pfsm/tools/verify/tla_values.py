"""TLA+ values as TLC prints them, read into Python and written back.

TLC prints states as text: strings, integers, booleans, sequences ``<<...>>``, sets
``{...}``, records ``[a |-> 1]`` and functions ``(k1 :> v1 @@ k2 :> v2)``.
:func:`parse_value` reads one such value (a function or record becomes a hashable
:class:`Fn`, a sequence a tuple, a set a frozenset, a model value its name) and
:func:`show` prints a parsed value as TLA+ text on one line. The counterexample
explainer and the spec->code replay both read states through it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Union

__all__ = ["Fn", "Value", "is_ident", "parse_value", "show"]




class Fn(dict[object, object]):
    """A TLA+ function or record (``[a |-> 1]``, ``(<<"r1", 0>> :> x @@ ...)``), hashable."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))


Value = Union[str, int, bool, tuple[object, ...], frozenset[object], Fn]  # noqa: UP007
"""A parsed value: string, integer, boolean, sequence (tuple), set, function."""

_TOKEN = re.compile(r'\s*(<<|>>|\|->|:>|@@|[\[\](){},]|"(?:[^"\\]|\\.)*"|-?\d+|[A-Za-z_]\w*)')


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot read the TLA+ value at {text[pos:pos + 30]!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


class _Reader:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> str:
        return self.toks[self.i] if self.i < len(self.toks) else ""

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if not tok or (want is not None and tok != want):
            raise ValueError(f"expected {want or 'a value'}, found {tok or 'the end'!r}")
        self.i += 1
        return tok

    def items(self, close: str) -> Iterator[None]:
        """Yield once per comma-separated item until ``close``."""
        if self.peek() == close:
            self.take()
            return
        while True:
            yield None
            if self.take() == close:
                return
            if self.toks[self.i - 1] != ",":
                raise ValueError(f"expected , or {close}")

    def value(self) -> object:
        tok = self.take()
        if tok == "<<":
            seq: list[object] = []
            for _ in self.items(">>"):
                seq.append(self.value())
            return tuple(seq)
        if tok == "{":
            members: list[object] = []
            for _ in self.items("}"):
                members.append(self.value())
            return frozenset(members)
        if tok == "[":
            rec = Fn()
            for _ in self.items("]"):
                name = self.take()
                self.take("|->")
                rec[name] = self.value()
            return rec
        if tok == "(":
            fn = Fn()
            while True:
                key = self.value()
                self.take(":>")
                fn[key] = self.value()
                sep = self.take()
                if sep == ")":
                    return fn
                if sep != "@@":
                    raise ValueError("expected @@ or )")
        if tok.startswith('"'):
            return re.sub(r"\\(.)", r"\1", tok[1:-1])
        if tok in ("TRUE", "FALSE"):
            return tok == "TRUE"
        if re.fullmatch(r"-?\d+", tok):
            return int(tok)
        return tok  # a model value


def parse_value(text: str) -> object:
    """One TLA+ value as TLC prints it -> Python (see :data:`Value`).

    Raises:
        ValueError: the text is no value TLC prints.
    """
    reader = _Reader(text)
    value = reader.value()
    if reader.peek():
        raise ValueError(f"trailing text after the value: {reader.peek()!r}")
    return value


def is_ident(key: object) -> bool:
    """``key`` is a string TLA+ can write as a record field name."""
    return isinstance(key, str) and re.fullmatch(r"[A-Za-z_]\w*", key) is not None


def show(value: object) -> str:
    """A parsed value as TLA+ text on one line."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, tuple):
        return "<<" + ", ".join(show(v) for v in value) + ">>"
    if isinstance(value, frozenset):
        return "{" + ", ".join(sorted(show(v) for v in value)) + "}"
    if isinstance(value, Fn):
        if not value:
            return "<<>>"
        if all(is_ident(k) for k in value):
            return "[" + ", ".join(f"{k} |-> {show(v)}" for k, v in value.items()) + "]"
        return "(" + " @@ ".join(f"{show(k)} :> {show(v)}" for k, v in value.items()) + ")"
    return str(value)
