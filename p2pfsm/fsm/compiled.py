"""The hot-path dispatcher: a frozen ``(state, trigger) -> candidates`` table, and the
straight-line code generated from it (:mod:`p2pfsm.fsm.generate`) that fires it.

Firing a trigger is all-or-nothing. It plans: looks up the candidates for the
object's current state and takes the first whose guards hold (and whose ``unless``
guards do not); guards are pure predicates. No candidate means the machine declares
no such step: :class:`InvalidTransition` is raised and nothing has changed. Then it
commits: sets the new state and runs the actions in order. Should an action raise,
the object's state, its declared extended state (``fsm_data``: the attributes its
actions write) and its output list (``fsm_outputs``) are put back as they were
before the step, and the exception propagates. Once every action has returned, the
owner's ``then`` hook runs (it applies what the actions asked for, so any step that
causes is nested in this one) and the step is recorded with the tracer.

An action may declare which of ``fsm_data`` it writes (:func:`writes`); a step whose
actions all declare saves only those attributes before it runs them, not the whole of
``fsm_data`` (a round's supply and demand are copied only by the steps that change
them). :func:`check_writes` makes every step verify the declarations: an attribute of
``fsm_data`` that changed although no action of the step declared it is a
:class:`ModelError`, and the step is undone.

Each machine's table is turned into Python source at import (one function per trigger
that branches on the state and calls its guards and actions directly, saving only what
they write), compiled in memory and run by :meth:`CompiledMachine.fire` and
:meth:`~CompiledMachine.can_fire`; its text is :attr:`CompiledMachine.code`. While
:func:`check_writes` is on, steps run a second generated variant that also verifies
the declarations. :meth:`CompiledMachine.fire_by_table` fires through the table
itself, the reference: a test proves the generated code and the table each equal to
the ``transitions`` machine on every edge.

This module (and the code it generates) is the only place that assigns
``fsm_state``; a test walks the AST of the package to keep it that way.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from p2pfsm.errors import InvalidTransition, ModelError
from p2pfsm.fsm.generate import Fires, emit
from p2pfsm.fsm.spec import MachineSpec, TransitionSpec
from p2pfsm.fsm.trace import Tracer


class FsmObject(Protocol):
    """What a machine instance must carry.

    ``fsm_data`` (optional, a class attribute) names the attributes its actions write;
    ``fsm_outputs`` (optional) is the list its actions append outputs to. Both are
    restored when an action raises.
    """

    fsm_state: str

    @property
    def fsm_label(self) -> str: ...

    @property
    def fsm_tracer(self) -> Tracer | None: ...


Guard = Callable[[Any, Any], bool]
Action = Callable[[Any, Any], None]
Then = Callable[["CompiledMachine", Any, str, str], None]
"""An owner's hook after a committed step: (machine, object, trigger, new state)."""

_A = TypeVar("_A", bound=Callable[..., Any])

_WRITES = "fsm_writes"
"""The attribute :func:`writes` sets on an action: the names it declares."""


def writes(*names: str) -> Callable[[_A], _A]:
    """Declare the attributes of ``fsm_data`` an action writes (none: it only emits).

    A step whose actions all declare saves only those attributes for its undo; a step
    with an undeclared action saves the whole of ``fsm_data``. Each name must be in the
    class's ``fsm_data`` (else :class:`ModelError` when the machine is built)."""
    def mark(action: _A) -> _A:
        setattr(action, _WRITES, names)
        return action
    return mark


_checking = False


def check_writes(on: bool) -> bool:
    """Verify every step's declared writes from now on (tests); returns the old setting.

    While on, each step with actions also saves all of ``fsm_data`` and, after its
    actions, compares the attributes no action declared: one that changed undoes the
    step and raises :class:`ModelError` naming the transition and the attribute."""
    global _checking
    old = _checking
    _checking = on
    for m in _MACHINES:
        m.fires = m._checked() if on else m._fire
    return old


@dataclass(frozen=True, slots=True)
class _Candidate:
    spec: TransitionSpec
    dest: str
    guards: tuple[Guard, ...]
    unless: tuple[Guard, ...]
    actions: tuple[Action, ...]
    saves: tuple[str, ...] | None
    """The attributes to save before the actions run: what they declare they write, in
    ``fsm_data`` order; None when one of them declares nothing (save all of ``fsm_data``)."""


def _saves(machine: str, impl: type, actions: tuple[Action, ...],
           names: tuple[str, ...]) -> tuple[str, ...] | None:
    """The declared writes of ``actions`` (see :class:`_Candidate`); a name outside
    ``fsm_data`` is a :class:`ModelError`."""
    data: tuple[str, ...] = getattr(impl, "fsm_data", ())
    declared: set[str] = set()
    for action, name in zip(actions, names, strict=True):
        written: tuple[str, ...] | None = getattr(action, _WRITES, None)
        if written is None:
            return None
        stray = sorted(set(written) - set(data))
        if stray:
            raise ModelError(f"{impl.__name__}.{name} of {machine} declares it writes "
                             f"{stray}, which are not in its fsm_data {list(data)}")
        declared.update(written)
    return tuple(n for n in data if n in declared)


class CompiledMachine:
    """A machine spec bound to the class implementing its guards and actions.

    Args:
        spec: the machine as loaded from ``models/``.
        impl: the class whose methods are named by the spec's guards and actions;
            every name must resolve, else :class:`ModelError`.
        then: the hook :meth:`fire` calls after a committed step when it is given none.
    """

    def __init__(self, spec: MachineSpec, impl: type, then: Then | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.then = then
        missing = sorted(
            n for n in spec.guard_names | spec.action_names if not callable(getattr(impl, n, None))
        )
        if missing:
            raise ModelError(f"{impl.__name__} lacks guards/actions of {spec.name}: {missing}")
        table: dict[tuple[str, str], list[_Candidate]] = {}
        for t in spec.transitions:
            guards = tuple(getattr(impl, g) for g in t.guards)
            unless = tuple(getattr(impl, g) for g in t.unless)
            actions = tuple(getattr(impl, a) for a in t.actions)
            saves = _saves(spec.name, impl, actions, t.actions)
            for source in t.sources:
                table.setdefault((source, t.trigger), []).append(
                    _Candidate(t, t.dest_from(source), guards, unless, actions, saves)
                )
        self._table: dict[tuple[str, str], tuple[_Candidate, ...]] = {
            k: tuple(v) for k, v in table.items()
        }
        self._impl = impl
        self.code = emit(self._table, getattr(impl, "fsm_data", ()), hasattr(impl, "fsm_outputs"))
        """The generated source that fires this machine."""
        self._fire, self._can = self._load(self.code, "")
        self._fire_checked: Fires | None = None
        """The verifying variant, generated the first time :func:`check_writes` is on."""
        self.fires: Fires = self._checked() if _checking else self._fire
        """The fire function of each trigger, ``fires[trigger](obj, event, then)``: the
        variant :func:`check_writes` selects (an owner may call it without :meth:`fire`)."""
        _MACHINES.append(self)

    def _checked(self) -> Fires:
        """The verifying variant's fire functions (generated on first use)."""
        if self._fire_checked is None:
            impl = self._impl
            code = emit(self._table, getattr(impl, "fsm_data", ()), hasattr(impl, "fsm_outputs"),
                        check=True)
            self._fire_checked = self._load(code, " (checking writes)")[0]
        return self._fire_checked

    def _load(self, code: str, variant: str
              ) -> tuple[Fires, dict[str, Callable[..., bool]]]:
        """Compile generated ``code`` in memory (its lines kept for tracebacks): its fire
        and can functions by trigger."""
        ns: dict[str, Any] = {"_m": self, "_NAME": self.name, "_Invalid": InvalidTransition,
                              "_PLAIN": _PLAIN, "_BOX": (dict, list, set), "_restore": _restore,
                              "_snapshot": _snapshot, "_verify": _verify}
        impl = self._impl
        ns.update({f"g_{n}": getattr(impl, n) for n in self.spec.guard_names})
        ns.update({f"a_{n}": getattr(impl, n) for n in self.spec.action_names})
        where = f"<p2pfsm machine {self.name} of {impl.__name__}{variant}>"
        exec(compile(code, where, "exec"), ns)  # our own text, made from models/
        linecache.cache[where] = (len(code), None, code.splitlines(True), where)
        pairs: dict[str, tuple[Callable[..., str], Callable[..., bool]]] = ns["TRIGGERS"]
        return (Fires(self.name, {trigger: pair[0] for trigger, pair in pairs.items()}),
                {trigger: pair[1] for trigger, pair in pairs.items()})

    def state_set(self, name: str) -> frozenset[str]:
        """The model's named set of states ``name`` (its ``[sets]``); the code asks these,
        never a state name. An undeclared set is a :class:`ModelError`."""
        return self.spec.state_set(name)

    def can_fire(self, obj: FsmObject, trigger: str, event: object = None) -> bool:
        """True when ``trigger`` has an enabled transition from the current state."""
        can = self._can.get(trigger)
        return can is not None and can(obj, event)

    def sources(self, trigger: str) -> frozenset[str]:
        """The states from which the model declares ``trigger`` (guarded or not)."""
        return frozenset(state for state, trig in self._table if trig == trigger)

    def declares(self, state: str, trigger: str) -> bool:
        """True when the model has a transition for ``trigger`` from ``state`` (guarded or not)."""
        return (state, trigger) in self._table

    def fire(self, obj: FsmObject, trigger: str, event: object = None,
             then: Then | None = None) -> str:
        """Take the enabled transition for ``trigger``; return the new state.

        ``then(machine, obj, trigger, dest)`` (else the machine's own hook) runs once the
        step has committed, before the tracer records it; what it raises propagates and
        the step stays taken.

        Raises:
            InvalidTransition: no declared transition is enabled; ``obj`` is unchanged.
        """
        return self.fires[trigger](obj, event, then)

    def fire_by_table(self, obj: FsmObject, trigger: str, event: object = None,
                      then: Then | None = None) -> str:
        """:meth:`fire` through the table rather than the generated code: the reference
        the generated code is held to."""
        source = obj.fsm_state
        cand = self._select(obj, trigger, event)
        if cand is None:
            raise InvalidTransition(self.name, source, trigger)
        if cand.actions:
            outputs: list[Any] | None = getattr(obj, "fsm_outputs", None)
            mark = 0 if outputs is None else len(outputs)
            names: tuple[str, ...] = getattr(obj, "fsm_data", ())
            saved = _snapshot(obj, names if cand.saves is None else cand.saves)
            # Checking a declaring step: the whole as well (else it saves the whole).
            declared = cand.saves if _checking else None
            whole = None if declared is None else _snapshot(obj, names)
            obj.fsm_state = cand.dest
            try:
                for action in cand.actions:
                    action(obj, event)
                if declared is not None and whole is not None:
                    _verify(self.name, trigger, cand.dest, cand.spec.actions, obj, whole,
                            declared)
            except BaseException:
                _restore(obj, saved if whole is None else whole)
                obj.fsm_state = source
                if outputs is not None:
                    del outputs[mark:]
                raise
        else:
            obj.fsm_state = cand.dest
        hook = then or self.then
        if hook is not None:
            hook(self, obj, trigger, cand.dest)
        tracer = obj.fsm_tracer
        if tracer is not None:
            tracer.record(self.name, obj.fsm_label, trigger, source, cand.dest)
        return cand.dest

    def _select(self, obj: FsmObject, trigger: str, event: object) -> _Candidate | None:
        # Plain loops, not all()/any() over generators: the same guards in the same
        # order, short-circuited alike, without a generator per candidate (most have no
        # guards at all).
        for cand in self._table.get((obj.fsm_state, trigger), ()):
            for guard in cand.guards:
                if not guard(obj, event):
                    break
            else:
                for guard in cand.unless:
                    if guard(obj, event):
                        break
                else:
                    return cand
        return None


_MACHINES: list[CompiledMachine] = []
"""Every machine built (a few: one per model and class, some more in tests):
:func:`check_writes` switches their :attr:`~CompiledMachine.fires`."""

_PLAIN = frozenset({int, bool, float, str, bytes, tuple, frozenset, type(None)})
"""Types that are never containers to copy: one set lookup settles most attributes."""


def _snapshot(obj: object, names: tuple[str, ...]) -> list[tuple[str, object]]:
    """Copies of the attributes ``names`` of ``obj`` (containers copied one level)."""
    saved: list[tuple[str, object]] = []
    for name in names:
        value: object = getattr(obj, name)
        # Each exact container type apart (``type(v) is dict`` narrows ``v``: compiled,
        # the copy is that type's own C call, not a generic method lookup); a subclass
        # of one is copied by its own ``copy``, as before.
        if type(value) in _PLAIN:
            pass
        elif type(value) is dict:  # noqa: SIM114 (apart on purpose: each narrows)
            value = value.copy()
        elif type(value) is set:  # noqa: SIM114
            value = value.copy()
        elif type(value) is list:  # noqa: SIM114
            value = value.copy()
        elif isinstance(value, dict | list | set):
            value = value.copy()
        saved.append((name, value))
    return saved


def _restore(obj: object, saved: list[tuple[str, object]]) -> None:
    for name, value in saved:
        current = getattr(obj, name)
        if isinstance(current, dict | list | set) and type(current) is type(value):
            current.clear()  # in place: others may hold the same container
            if isinstance(current, dict):
                current.update(value)
            elif isinstance(current, list):
                current.extend(value)
            else:
                current.update(value)
        else:
            setattr(obj, name, value)


def _verify(machine: str, trigger: str, dest: str, actions: tuple[str, ...], obj: object,
            whole: list[tuple[str, object]], declared: tuple[str, ...]) -> None:
    """Raise ModelError when an attribute that none of ``actions`` declared changed."""
    for name, before in whole:
        if name not in declared and getattr(obj, name) != before:
            raise ModelError(
                f"{machine} {trigger} ({dest}): its actions {list(actions)} changed "
                f".{name}, which none of them declares (p2pfsm.fsm.writes)")
