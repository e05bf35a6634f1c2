"""Switch a mutant on for every Session in this process (and off again).

:func:`installed` replaces ``Session.handle`` on the class, so every session any suite
builds (SimWorld, the scenario helpers, the conformance replay) runs through the mutant;
each session gets its own :class:`~mutants.catalogue.Mutant` instance. A slip
(:mod:`mutants.slips`) swaps one line of a product function's code instead. The switch
(the name and how to undo it) is kept on the Session class itself, so it holds however
this package was imported.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from p2pfsm.session import Input, Output, Session

from .catalogue import EXECUTOR, MUTANTS, Mutant
from .slips import apply

ENV = "P2PFSM_MUTANT"
_MARK = "_p2pfsm_mutant"  # (name, undo) while installed


def active() -> str | None:
    """The name of the mutant switched on now, if any."""
    state = Session.__dict__.get(_MARK)
    return None if state is None else str(state[0])


def install(name: str) -> None:
    """Switch on mutant ``name`` (a Session wrapper or a slip, session or executor)."""
    known = {**MUTANTS, **EXECUTOR}
    if name not in known:
        raise SystemExit(f"{ENV}={name!r}: unknown mutant; known: {', '.join(known)}")
    if active() is not None:
        raise RuntimeError(f"mutant {active()} is already installed")
    entry = known[name]
    if entry.slip is not None:
        setattr(Session, _MARK, (name, apply(entry.slip)))
        return
    cls = entry.cls
    assert cls is not None
    original = Session.__dict__.get("handle")
    inner_handle = Session.handle
    weak: weakref.WeakKeyDictionary[Session, Mutant] = weakref.WeakKeyDictionary()
    strong: dict[int, tuple[Session, Mutant]] = {}  # for sessions without __weakref__

    def mutant_of(session: Session) -> Mutant:
        try:
            found = weak.get(session)
            if found is None:
                found = weak[session] = cls(session)
            return found
        except TypeError:
            entry = strong.get(id(session))
            if entry is None or entry[0] is not session:
                entry = strong[id(session)] = (session, cls(session))
            return entry[1]

    def handle(self: Session, event: Input, now: float) -> list[Output]:
        return mutant_of(self).handle(lambda ev, t: inner_handle(self, ev, t), event, now)

    def undo() -> None:
        if original is None:
            del Session.handle
        else:
            Session.handle = original  # type: ignore[method-assign]

    setattr(Session, _MARK, (name, undo))
    Session.handle = handle  # type: ignore[method-assign]


def uninstall() -> None:
    state: Any = Session.__dict__.get(_MARK)
    if state is None:
        return
    state[1]()
    delattr(Session, _MARK)


@contextmanager
def installed(name: str) -> Iterator[None]:
    install(name)
    try:
        yield
    finally:
        uninstall()


def from_env() -> str | None:
    """Install the mutant ``P2PFSM_MUTANT`` names (if set); returns its name."""
    name = os.environ.get(ENV, "").strip()
    if not name:
        return None
    install(name)
    return name
