"""TLA+ action names derived from the models, never mapped by hand.

An action of ``tla/P2P.tla`` that starts a machine step is named
PascalCase(machine) + PascalCase(trigger): ``client_round`` + ``recv_transfer_done``
gives ``ClientRoundRecvTransferDone``. :func:`action_name` (defined in
:mod:`p2pfsm.spec_calls`, which the executor imports without TLC) computes that name and
:func:`action_map` inverts it over every (machine, trigger) of ``models/``. Actions
of the environment (the network losing, duplicating or cutting frames, a frame
reaching a session that is gone) start no machine step; they are the ``Network*``
names in :data:`ENVIRONMENT_ACTIONS`.

:func:`spec_actions` reads the action operators of the spec: the names listed in
the ``Next*`` disjunctions of ``P2P.tla``.
"""

from __future__ import annotations

import re
from pathlib import Path

from p2pfsm.fsm import MachineSpec, machines
from p2pfsm.fsm import profile as load_profile
from p2pfsm.spec_calls import action_name as action_name
from p2pfsm.spec_calls import pascal as pascal
from p2pfsm.tools.verify.tables import behaviour_of

ENVIRONMENT_ACTIONS: frozenset[str] = frozenset(
    {"NetworkCut", "NetworkDrop", "NetworkDuplicate", "NetworkDiscard", "NetworkFrameLifetime",
     "NetworkRestart", "NetworkHalfCut", "NetworkCorrupt"}
)
"""Spec actions that start no machine step."""

PROFILE_ACTIONS: dict[str, int] = {"ClientRoundTimerHold": 2}
"""Spec actions only some behaviour profiles enable: action -> the index of the flag of
:func:`p2pfsm.tools.verify.tables.behaviour_of` (atSend, ackEnds, hold, lookupEnds) that
enables it."""


def enabled_actions(actions: list[str], profile: str) -> list[str]:
    """``actions`` less those ``profile`` never enables (its ProfileBehaviour)."""
    flags = behaviour_of(load_profile(profile))
    return [a for a in actions if a not in PROFILE_ACTIONS or flags[PROFILE_ACTIONS[a]]]


def action_map(specs: dict[str, MachineSpec] | None = None) -> dict[str, tuple[str, str]]:
    """Every derivable action name -> (machine, trigger), over all models.

    Raises:
        ValueError: two (machine, trigger) pairs derive the same name.
    """
    specs = machines() if specs is None else specs
    out: dict[str, tuple[str, str]] = {}
    for name, spec in specs.items():
        for trigger in sorted(spec.triggers):
            action = action_name(name, trigger)
            if action in out and out[action] != (name, trigger):
                raise ValueError(f"{action} derives from {out[action]} and {(name, trigger)}")
            out[action] = (name, trigger)
    return out


def trigger_of(action: str, specs: dict[str, MachineSpec] | None = None) -> tuple[str, str] | None:
    """(machine, trigger) an action starts; None for an environment action.

    Raises:
        KeyError: the name is neither derived from a model nor an environment action.
    """
    if action in ENVIRONMENT_ACTIONS:
        return None
    return action_map(specs)[action]


_NEXT_BLOCK = re.compile(r"^Next\w*(?:\([^)]*\))?\s*==\s*\n((?:[ \t]+.*\n)+)", re.MULTILINE)
_DISJUNCT = re.compile(r"^\s*\\/\s*(?:\\E [^:]+:\s*)?([A-Z]\w*)(?:\(|\s*$)", re.MULTILINE)


def spec_actions(spec_file: Path) -> list[str]:
    """The action operators named by the ``Next*`` definitions of a spec, in order.

    ``NextHost(p) == \\/ SessionHostStart(p) \\/ ...`` contributes ``SessionHostStart``;
    names of other ``Next*`` groups (``NextHost``) are not actions themselves.
    """
    text = spec_file.read_text()
    found: list[str] = []
    for block in _NEXT_BLOCK.finditer(text):
        for name in _DISJUNCT.findall(block.group(1)):
            if not name.startswith("Next") and name not in found:
                found.append(name)
    return found
