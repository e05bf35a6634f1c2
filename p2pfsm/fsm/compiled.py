"""The hot-path dispatcher: a frozen ``(state, trigger) -> candidates`` table.

Firing a trigger looks up the candidates for the object's current state, takes
the first whose guards hold (and whose ``unless`` guards do not), sets the new
state, records the step with the tracer, then runs the actions in order. No
candidate means the machine declares no such step: :class:`InvalidTransition`
is raised and nothing has changed, because guards are pure predicates.

This module is the only place that assigns ``fsm_state``; a test walks the AST
of the package to keep it that way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from p2pfsm.errors import InvalidTransition, ModelError
from p2pfsm.fsm.spec import MachineSpec, TransitionSpec
from p2pfsm.fsm.trace import Tracer


class FsmObject(Protocol):
    """What a machine instance must carry."""

    fsm_state: str

    @property
    def fsm_label(self) -> str: ...

    @property
    def fsm_tracer(self) -> Tracer | None: ...


Guard = Callable[[Any, Any], bool]
Action = Callable[[Any, Any], None]


@dataclass(frozen=True, slots=True)
class _Candidate:
    spec: TransitionSpec
    dest: str
    guards: tuple[Guard, ...]
    unless: tuple[Guard, ...]
    actions: tuple[Action, ...]


class CompiledMachine:
    """A machine spec bound to the class implementing its guards and actions.

    Args:
        spec: the machine as loaded from ``models/``.
        impl: the class whose methods are named by the spec's guards and actions;
            every name must resolve, else :class:`ModelError`.
    """

    def __init__(self, spec: MachineSpec, impl: type) -> None:
        self.spec = spec
        self.name = spec.name
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
            for source in t.sources:
                table.setdefault((source, t.trigger), []).append(
                    _Candidate(t, t.dest_from(source), guards, unless, actions)
                )
        self._table: dict[tuple[str, str], tuple[_Candidate, ...]] = {
            k: tuple(v) for k, v in table.items()
        }

    def can_fire(self, obj: FsmObject, trigger: str, event: object = None) -> bool:
        """True when ``trigger`` has an enabled transition from the current state."""
        return self._select(obj, trigger, event) is not None

    def fire(self, obj: FsmObject, trigger: str, event: object = None) -> str:
        """Take the enabled transition for ``trigger``; return the new state.

        Raises:
            InvalidTransition: no declared transition is enabled; ``obj`` is unchanged.
        """
        source = obj.fsm_state
        cand = self._select(obj, trigger, event)
        if cand is None:
            raise InvalidTransition(self.name, source, trigger)
        obj.fsm_state = cand.dest
        tracer = obj.fsm_tracer
        if tracer is not None:
            tracer.record(self.name, obj.fsm_label, trigger, source, cand.dest)
        for action in cand.actions:
            action(obj, event)
        return cand.dest

    def _select(self, obj: FsmObject, trigger: str, event: object) -> _Candidate | None:
        for cand in self._table.get((obj.fsm_state, trigger), ()):
            if all(g(obj, event) for g in cand.guards) and not any(
                g(obj, event) for g in cand.unless
            ):
                return cand
        return None
