"""Machines as data: load ``models/``, compile them, dispatch, trace.

``models/*.toml`` is the single source of truth. :mod:`.spec` reads a file into a
:class:`MachineSpec`; :mod:`.compiled` turns it into a frozen ``(state, trigger) ->
candidates`` table, from which :mod:`.generate` writes the straight-line code the hot
path runs; :mod:`.build` builds the equivalent ``transitions.Machine`` (tests prove all
three agree on every edge); :mod:`.trace` records every fired transition; :mod:`.inputs`
reads the input table (which machine and trigger each input of a session reaches);
:mod:`.profiles` reads the behaviour profiles (``models/profiles/``).
"""

from p2pfsm.fsm.compiled import CompiledMachine, FsmObject, check_writes, writes
from p2pfsm.fsm.inputs import InputSpec, InputTable
from p2pfsm.fsm.profiles import (
    DEFAULT_PROFILE,
    AbortAckTimeout,
    Behaviour,
    LookupTimeout,
    Profile,
    ReportFailedLoad,
    UnsentFetch,
    profile,
    profiles,
)
from p2pfsm.fsm.registry import input_table, machine, machines
from p2pfsm.fsm.spec import MachineSpec, TransitionSpec, load_spec, models_dir
from p2pfsm.fsm.trace import TraceCursor, Tracer, TraceRecord

__all__ = [
    "DEFAULT_PROFILE",
    "AbortAckTimeout",
    "Behaviour",
    "CompiledMachine",
    "FsmObject",
    "InputSpec",
    "InputTable",
    "LookupTimeout",
    "MachineSpec",
    "Profile",
    "ReportFailedLoad",
    "TraceCursor",
    "TraceRecord",
    "Tracer",
    "TransitionSpec",
    "UnsentFetch",
    "check_writes",
    "input_table",
    "load_spec",
    "machine",
    "machines",
    "models_dir",
    "profile",
    "profiles",
    "writes",
]
