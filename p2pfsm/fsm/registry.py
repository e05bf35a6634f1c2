"""Cached access to every machine declared in ``models/`` and to its input table."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from p2pfsm.fsm.inputs import INPUTS_FILE, InputTable, load_inputs
from p2pfsm.fsm.spec import MachineSpec, load_spec, models_dir


def models_directory() -> Path:
    """Where the machines are read from: the copy inside an installed wheel
    (``p2pfsm/_models``) when there is one, else the source checkout's ``models/``.

    The wheel's copy goes first so that an unrelated top-level ``models`` directory in
    site-packages (next to the installed package) is never taken for ours.
    """
    packaged = Path(__file__).resolve().parent.parent / "_models"
    if (packaged / "session.toml").is_file():
        return packaged
    return models_dir()


@cache
def machine(name: str) -> MachineSpec:
    """The spec of one machine, loaded once."""
    return load_spec(name, models_directory())


def machines() -> dict[str, MachineSpec]:
    """Every machine in ``models/``, by name, sorted."""
    names = sorted(p.stem for p in models_directory().glob("*.toml") if p.stem != INPUTS_FILE)
    return {n: machine(n) for n in names}


@cache
def input_table() -> InputTable:
    """``models/inputs.toml``, checked against every machine, loaded once."""
    return load_inputs(models_directory(), machines())
