"""Cached access to every machine declared in ``models/``."""

from __future__ import annotations

from functools import cache

from p2pfsm.fsm.spec import MachineSpec, load_spec, models_dir


@cache
def machine(name: str) -> MachineSpec:
    """The spec of one machine, loaded once."""
    return load_spec(name)


def machines() -> dict[str, MachineSpec]:
    """Every machine in ``models/``, by name, sorted."""
    names = sorted(p.stem for p in models_dir().glob("*.toml"))
    return {n: machine(n) for n in names}
