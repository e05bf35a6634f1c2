"""Build the ``transitions`` library's machine from the same spec.

The hot path uses :class:`~p2pfsm.fsm.compiled.CompiledMachine`; this builder
exists so that the declared tables are also real ``transitions`` machines, and a
test checks both choose the same destination for every (state, trigger, guard
values) combination.
"""

from __future__ import annotations

from typing import Any

from transitions import Machine

from p2pfsm.fsm.spec import MachineSpec


def build_transitions_machine(spec: MachineSpec, model: Any) -> Machine:
    """A ``transitions.Machine`` over ``model``; guards are looked up on the model by name."""
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
            }
            for t in spec.transitions
        ],
        auto_transitions=False,
        ignore_invalid_triggers=False,
        send_event=False,
        model_attribute="fsm_state",
    )
