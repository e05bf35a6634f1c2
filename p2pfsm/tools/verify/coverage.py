"""Action coverage of a TLC run, and the vacuity check: every ``Next`` disjunct fires.

Two sources give the same table, one row per action operator of ``Next``
(:func:`p2pfsm.tools.verify.names.spec_actions`, read from the spec, never listed by hand):

- :func:`from_tlc`: TLC's own ``-coverage`` statistics. TLC 2.15 reports each action
  as a message 2772, ``<Name line L, col C to line L2, col C2 of module M>: distinct:total``
  (``distinct`` new states it found, ``total`` successor states it generated), and
  repeats the whole report at every interval and at the end; the last one counts.
  Collecting it instruments every expression and makes the gate about seven times
  slower, so it is asked for only with ``p2pfsm check --coverage tlc``.
- :func:`from_dot`: the reachable graph TLC dumps with ``-dump dot,actionlabels`` (the
  gate's conformance tests dump it anyway): ``total`` is the number of edges labelled
  with the action that change the state, ``distinct`` the number of states they enter.

:func:`never_fired` is the vacuity check: an action of ``Next`` with no step is an
action the spec can never take under this config, so whatever property mentions it
holds vacuously.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CODE_ACTION = 2772
CODE_INIT = 2773
CODE_COVERAGE_START = 2201

_ACTION = re.compile(r"^<(\w+) line (\d+), col \d+ to line \d+, col \d+ of module (\w+)"
                     r"(?: \([\d ]+\))?>: (\d+):(\d+)\s*$")
_EDGE = re.compile(r'^(-?\d+) -> (-?\d+) \[label="(\w+)"')


@dataclass(frozen=True, slots=True)
class ActionCount:
    """How often one action fired.

    Attributes:
        action: the operator's name (``ClientRoundRecvTransferDone``).
        distinct: states first reached by it.
        total: steps it took (successor states generated, or graph edges).
        where: ``module:line`` of its definition, when TLC reported it.
    """

    action: str
    distinct: int
    total: int
    where: str = ""


def from_tlc(messages: Iterable[tuple[int, int, str]]) -> dict[str, ActionCount]:
    """TLC's last ``-coverage`` report: action name -> counts (several operators of one
    name, e.g. in two modules, are summed)."""
    reports: list[dict[str, ActionCount]] = []
    for code, _severity, body in messages:
        if code == CODE_COVERAGE_START:
            reports.append({})
        elif code == CODE_ACTION and (m := _ACTION.match(body.strip())) is not None:
            if not reports:
                reports.append({})
            name, line, module, distinct, total = m[1], m[2], m[3], int(m[4]), int(m[5])
            old = reports[-1].get(name)
            if old is not None:
                distinct, total = distinct + old.distinct, total + old.total
            reports[-1][name] = ActionCount(name, distinct, total, f"{module}:{line}")
    return reports[-1] if reports else {}


def from_dot(path: Path) -> dict[str, ActionCount]:
    """Counts from a ``-dump dot,actionlabels`` graph (stuttering self-loops left out)."""
    total: dict[str, int] = {}
    entered: dict[str, set[str]] = {}
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            m = _EDGE.match(line)
            if m is None or m[1] == m[2]:
                continue
            total[m[3]] = total.get(m[3], 0) + 1
            entered.setdefault(m[3], set()).add(m[2])
    return {a: ActionCount(a, len(entered[a]), n) for a, n in total.items()}


def never_fired(counts: dict[str, ActionCount], actions: Sequence[str]) -> list[str]:
    """The actions of ``Next`` (in spec order) that took no step."""
    return [a for a in actions if a not in counts or counts[a].total == 0]


def table(counts: dict[str, ActionCount], actions: Sequence[str], *,
          source: str) -> list[str]:
    """A heading, one line per action of ``Next`` (spec order), then :func:`summary`."""
    width = max((len(a) for a in actions), default=6)
    lines = [f"action coverage ({source}):",
             f"  {'action':<{width}}  {'distinct':>9}  {'steps':>9}"]
    for a in actions:
        c = counts.get(a, ActionCount(a, 0, 0))
        mark = "  NEVER FIRES" if c.total == 0 else ""
        lines.append(f"  {a:<{width}}  {c.distinct:>9,}  {c.total:>9,}{mark}")
    lines.append(summary(counts, actions))
    return lines


def summary(counts: dict[str, ActionCount], actions: Sequence[str]) -> str:
    """``N/M Next disjuncts fire`` and, when some do not, their names."""
    zero = never_fired(counts, actions)
    fired = len(actions) - len(zero)
    line = f"action coverage: {fired}/{len(actions)} Next disjuncts fire"
    if zero:
        return line + "; never fires (vacuous): " + ", ".join(zero)
    fewest = min(actions, key=lambda a: counts[a].total) if actions else ""
    return line + (f" (fewest steps: {fewest} {counts[fewest].total:,})" if fewest else "")


def as_json(counts: dict[str, ActionCount], actions: Sequence[str],
            source: str) -> dict[str, object]:
    """The table as data: source, actions [{action, distinct, steps}], never_fired."""
    return {
        "source": source,
        "actions": [{"action": a, "distinct": counts[a].distinct if a in counts else 0,
                     "steps": counts[a].total if a in counts else 0} for a in actions],
        "never_fired": never_fired(counts, actions),
    }
