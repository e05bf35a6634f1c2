"""Machines as generated code: the source of straight-line Python for one machine.

:func:`emit` writes, from a machine's ``(state, trigger) -> candidates`` table (built by
:class:`~p2pfsm.fsm.compiled.CompiledMachine` from ``models/``), two functions per
trigger: ``fire_<trigger>(obj, event, then)`` takes the step and returns the new state,
and ``can_<trigger>(obj, event)`` says whether one is enabled (a profile names them).
Each branches on the current state, calls the guards and actions by name (bound in the
namespace the code runs in: ``g_<name>``, ``a_<name>``), saves only the attributes its
actions write (one local per attribute, no snapshot list) and puts them back, with the
state and the outputs, when an action raises. :data:`TRIGGERS` in the emitted module
maps each trigger to its pair.

With ``check``, a step whose actions all declare their writes also saves the whole of
``fsm_data`` and, after the actions, verifies that nothing undeclared changed
(``_verify``): the variant :func:`~p2pfsm.fsm.compiled.check_writes` runs, so every
test of the package exercises the generated code, verifying it as it goes.

The emitted code runs in a namespace that also provides ``_m`` (the machine),
``_NAME``, ``_Invalid`` (:class:`~p2pfsm.errors.InvalidTransition`), ``_PLAIN``,
``_BOX`` (the container types :mod:`~p2pfsm.fsm.compiled` copies one level),
``_restore``, ``_snapshot`` and ``_verify``. Nothing is written to disk: the text is
built and compiled at import.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from p2pfsm.errors import InvalidTransition
from p2pfsm.fsm.spec import TransitionSpec

__all__ = ["Candidate", "Fires", "emit"]


class Fires(dict[str, Callable[..., str]]):
    """A machine's fire function of each trigger; a trigger it lacks gets one that
    raises :class:`InvalidTransition` (no declared step), so a caller indexes it
    without a test."""

    def __init__(self, machine: str, fires: dict[str, Callable[..., str]]) -> None:
        super().__init__(fires)
        self.machine = machine

    def __missing__(self, trigger: str) -> Callable[..., str]:
        machine = self.machine

        def undeclared(obj: Any, _event: object, _then: object) -> str:
            raise InvalidTransition(machine, obj.fsm_state, trigger)
        return undeclared


class Candidate(Protocol):
    """What :func:`emit` reads of one candidate transition."""

    @property
    def spec(self) -> TransitionSpec: ...

    @property
    def dest(self) -> str: ...

    @property
    def saves(self) -> tuple[str, ...] | None: ...


def emit(table: Mapping[tuple[str, str], Sequence[Candidate]], data: tuple[str, ...],
         outputs: bool, check: bool = False) -> str:
    """The module source for ``table``; ``data`` is the class's ``fsm_data`` (saved
    whole by a step whose candidate declares no ``saves``), ``outputs`` whether the
    class has ``fsm_outputs`` (truncated on undo; else looked for on the object);
    ``check``: the verifying variant (see the module docstring)."""
    triggers = sorted({trigger for _state, trigger in table})
    names = {t: t if t.isidentifier() else str(k) for k, t in enumerate(triggers)}
    lines: list[str] = []
    for trigger in triggers:
        groups = _groups(table, trigger)
        lines += [*_fire(names[trigger], trigger, groups, data, outputs, check), ""]
        lines += [*_can(names[trigger], groups), ""]
    pairs = ", ".join(f"{t!r}: (fire_{names[t]}, can_{names[t]})" for t in triggers)
    lines.append(f"TRIGGERS = {{{pairs}}}")
    return "\n".join(lines) + "\n"


_Group = tuple[tuple[str, ...], Sequence[Candidate]]


def _groups(table: Mapping[tuple[str, str], Sequence[Candidate]], trigger: str) -> list[_Group]:
    """The source states of ``trigger``, those with the same candidates (and the same
    destinations) together, in the table's order."""
    out: dict[tuple[object, ...], tuple[list[str], Sequence[Candidate]]] = {}
    for (state, trig), cands in table.items():
        if trig != trigger:
            continue
        key = tuple((id(c.spec), c.dest if c.spec.dest is not None else None) for c in cands)
        out.setdefault(key, ([], cands))[0].append(state)
    return [(tuple(states), cands) for states, cands in out.values()]


def _test(states: tuple[str, ...]) -> str:
    if len(states) == 1:
        return f"source == {states[0]!r}"
    # A set display after ``in`` compiles to one frozenset constant.
    return f"source in {{{', '.join(repr(s) for s in sorted(states))}}}"


def _condition(t: TransitionSpec) -> str | None:
    return " and ".join(_terms(t)) or None


def _terms(t: TransitionSpec) -> list[str]:
    return ([f"g_{g}(obj, event)" for g in t.guards]
            + [f"not g_{g}(obj, event)" for g in t.unless])


def _simplified(terms: list[str], false: set[str]) -> list[str] | None:
    """``terms`` less those an earlier candidate of the state proved true; None when one
    of them it proved false (the candidate cannot be taken). Guards are pure, so a
    guard asked once need not be asked again in the same step."""
    kept = []
    for term in terms:
        if term in false:
            return None
        if (term[4:] if term.startswith("not ") else f"not {term}") not in false:
            kept.append(term)
    return kept


def _fire(k: str, trigger: str, groups: list[_Group], data: tuple[str, ...],
          outputs: bool, check: bool) -> list[str]:
    out = [f"def fire_{k}(obj, event, then):",
           f"    # {trigger}",
           "    source = obj.fsm_state"]
    for n, (states, cands) in enumerate(groups):
        out.append(f"    {'if' if n == 0 else 'elif'} {_test(states)}:")
        false: set[str] = set()  # single conditions of earlier candidates: they failed
        for cand in cands:
            terms = _simplified(_terms(cand.spec), false)
            if terms is None:
                continue
            pad = "        "
            if terms:
                out.append(f"        if {' and '.join(terms)}:")
                pad += "    "
            out += [pad + line for line in _commit(trigger, cand, data, outputs, check)]
            if not terms:
                break  # an unguarded candidate is always taken: the rest cannot be
            if len(terms) == 1:
                false.add(terms[0])
    out.append(f"    raise _Invalid(_NAME, source, {trigger!r})")
    return out


def _commit(trigger: str, cand: Candidate, data: tuple[str, ...], outputs: bool,
            check: bool) -> list[str]:
    """The lines that take ``cand``: save, set the state, run the actions (undone on a
    raise), the owner's hook, the trace; return the new state."""
    dest = "source" if cand.spec.dest is None else repr(cand.dest)
    lines: list[str] = []
    actions = cand.spec.actions
    if actions:
        saves = data if cand.saves is None else cand.saves
        if outputs:  # the class declares it
            lines += ["outputs = obj.fsm_outputs", "mark = len(outputs)"]
        else:  # an instance may still carry one
            lines += ["outputs = getattr(obj, 'fsm_outputs', None)",
                      "mark = 0 if outputs is None else len(outputs)"]
        for i, name in enumerate(saves):
            lines += [f"b{i} = obj.{name}",
                      f"k = type(b{i})",
                      f"if k is dict or k is list or k is set or (k not in _PLAIN and "
                      f"isinstance(b{i}, _BOX)):",
                      f"    b{i} = b{i}.copy()"]
        verify = check and cand.saves is not None
        if verify:  # what no action declares must not change: keep all of it
            lines.append(f"whole = _snapshot(obj, {data!r})")
        lines += [f"obj.fsm_state = {dest}", "try:"]
        lines += [f"    a_{a}(obj, event)" for a in actions]
        if verify:
            lines.append(f"    _verify(_NAME, {trigger!r}, {dest}, {actions!r}, obj, whole, "
                         f"{saves!r})")
        saved = "".join(f"({name!r}, b{i}), " for i, name in enumerate(saves))
        lines += ["except BaseException:",
                  "    _restore(obj, whole)" if verify else f"    _restore(obj, ({saved}))",
                  "    obj.fsm_state = source"]
        lines += (["    del outputs[mark:]"] if outputs else
                  ["    if outputs is not None:", "        del outputs[mark:]"])
        lines.append("    raise")
    else:
        lines.append(f"obj.fsm_state = {dest}")
    lines += ["if then is None:",
              "    then = _m.then",
              "if then is not None:",
              f"    then(_m, obj, {trigger!r}, {dest})",
              "tracer = obj.fsm_tracer",
              "if tracer is not None:",
              f"    tracer.record(_NAME, obj.fsm_label, {trigger!r}, source, {dest})",
              f"return {dest}"]
    return lines


def _can(k: str, groups: list[_Group]) -> list[str]:
    out = [f"def can_{k}(obj, event):", "    source = obj.fsm_state"]
    for n, (states, cands) in enumerate(groups):
        out.append(f"    {'if' if n == 0 else 'elif'} {_test(states)}:")
        conds = [_condition(c.spec) or "True" for c in cands]
        if "True" in conds:  # an unguarded candidate: those after it are never asked
            conds = conds[:conds.index("True") + 1]
        if conds == ["True"]:
            out.append("        return True")
        else:
            out.append(f"        return bool({' or '.join(f'({c})' for c in conds)})")
    out.append("    return False")
    return out
