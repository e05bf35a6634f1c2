"""Build the ``transitions`` library's machine from the same spec.

The hot path uses :class:`~p2pfsm.fsm.compiled.CompiledMachine`; this builder
exists so that the declared tables are also real ``transitions`` machines, and a
test checks both choose the same destination and run the same actions, in order,
for every (state, trigger, guard values) combination. Actions are the model's
methods, named in each transition's ``after`` list.
"""

from __future__ import annotations

from typing import Any

from transitions import Machine

from p2pfsm.fsm.spec import MachineSpec


def build_transitions_machine(spec: MachineSpec, model: Any, *, actions: bool = False) -> Machine:
    """A ``transitions.Machine`` over ``model``; guards (and, with ``actions``, the
    actions, as ``after`` callbacks) are looked up on the model by name."""
    return Machine(
        model=model,
        states=list(spec.states),
        initial=spec.initial,
        transitions=[
            {
                "trigger": t.trigger,
                "source": list(t.sources),
                "dest": t.dest,
                "conditions": list(t.guards),
                "unless": list(t.unless),
                "after": list(t.actions) if actions else [],
            }
            for t in spec.transitions
        ],
        auto_transitions=False,
        ignore_invalid_triggers=False,
        send_event=False,
        model_attribute="fsm_state",
    )
