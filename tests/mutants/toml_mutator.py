"""Mutants of the machine models (``models/*.toml``) and the run that tries to kill them.

Each mutant changes one thing in one transition of one machine, the slips a developer
editing a model might make:

* ``drop_guard``: one name of ``guards`` removed (the transition fires without it);
* ``drop_unless``: one name of ``unless`` removed;
* ``swap_dest``: the destination replaced by another state of the same machine (an
  internal transition, which has none, gets one: any state other than its only source);
* ``drop_action``: one name of ``actions`` removed.

A mutant is written as a whole models directory (the mutated machine, every other file
copied as it is) into a temporary directory. The product's own loader reads it: first
in this process (``load_spec`` and ``load_inputs``: a model the loader refuses, say with
a state no longer reachable, is killed by the loader), then in a pytest subprocess run
under :mod:`mutants.mutation_plugin`, which points ``p2pfsm.fsm.registry`` at that
directory before any session module compiles its machines. The kill suite fails on the
first failure (``-x``); a run past the time limit counts as killed (the suite hangs).
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from p2pfsm.errors import ModelError
from p2pfsm.fsm.inputs import INPUTS_FILE, load_inputs
from p2pfsm.fsm.spec import MachineSpec, load_spec, read_model_file

from . import launch

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
KILL_SUITE = ("tests/scenarios", "tests/stateful", "tests/unit")
"""What runs against each mutated model: the same fast suites as the source mutants,
the scenarios first (they fail soonest)."""
ENV = "P2PFSM_MODELS_DIR"
"""Read by :mod:`mutants.mutation_plugin`: the directory to load the machines from."""

KINDS = ("drop_guard", "drop_unless", "swap_dest", "drop_action")


@dataclass(frozen=True)
class TomlMutant:
    """In ``machine``'s transition ``index``: ``kind`` with ``detail`` (the name dropped,
    or the new destination)."""

    machine: str
    index: int
    kind: str
    detail: str

    @property
    def name(self) -> str:
        return f"{self.machine}.t{self.index}.{self.kind}.{self.detail}"

    def apply(self, data: dict[str, object]) -> dict[str, object]:
        """A copy of the machine's parsed TOML with this mutant applied."""
        mutated: dict[str, object] = json.loads(json.dumps(data))
        transitions = mutated["transitions"]
        assert isinstance(transitions, list)
        t = transitions[self.index]
        assert isinstance(t, dict)
        if self.kind == "swap_dest":
            t["dest"] = self.detail
            return mutated
        key = {"drop_guard": "guards", "drop_unless": "unless", "drop_action": "actions"}[
            self.kind]
        names = _names(t.get(key))
        names.remove(self.detail)
        if names:
            t[key] = names
        else:
            del t[key]
        return mutated


def _names(raw: object) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw]
    assert isinstance(raw, list)
    return [str(x) for x in raw]


def machine_files(models: Path = MODELS) -> list[Path]:
    return sorted(p for p in models.glob("*.toml") if p.stem != INPUTS_FILE)


def enumerate_mutants(models: Path = MODELS) -> list[TomlMutant]:
    """Every mutant of every machine, in a stable order."""
    found: list[TomlMutant] = []
    for path in machine_files(models):
        data = read_model_file(path, "model file")
        states = data["states"]
        transitions = data["transitions"]
        assert isinstance(states, dict) and isinstance(transitions, list)
        for i, t in enumerate(transitions):
            assert isinstance(t, dict)
            for kind, key in (("drop_guard", "guards"), ("drop_unless", "unless"),
                              ("drop_action", "actions")):
                found += [TomlMutant(path.stem, i, kind, n) for n in _names(t.get(key))]
            dest = t.get("dest")
            sources = _names(t.get("source"))
            for state in states:
                if state == dest or (dest is None and sources == [state]):
                    continue
                found.append(TomlMutant(path.stem, i, "swap_dest", str(state)))
    return found


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string (same escapes)


def _toml_value(value: object) -> str:
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return "[" + ", ".join(_toml_str(x) for x in value) + "]"
    raise TypeError(f"no TOML writer for {value!r}")


def to_toml(data: dict[str, object]) -> str:
    """A machine's model as TOML: top-level keys, ``[states]``, ``[[transitions]]``."""
    lines: list[str] = []
    tables: dict[str, dict[str, object]] = {}
    arrays: dict[str, list[dict[str, object]]] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            tables[key] = value
        elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            arrays[key] = value
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for key, table in tables.items():
        lines += ["", f"[{key}]"] + [f"{_toml_str(k)} = {_toml_value(v)}"
                                     for k, v in table.items()]
    for key, rows in arrays.items():
        for row in rows:
            lines += ["", f"[[{key}]]"] + [f"{k} = {_toml_value(v)}" for k, v in row.items()]
    return "\n".join(lines) + "\n"


def write_models(mutant: TomlMutant, target: Path, models: Path = MODELS) -> None:
    """``models`` copied into ``target`` with ``mutant`` applied to its machine."""
    for path in models.glob("*.toml"):
        shutil.copy2(path, target / path.name)
    if (models / "profiles").is_dir():  # the behaviour profiles, as they are
        shutil.copytree(models / "profiles", target / "profiles", dirs_exist_ok=True)
    data = read_model_file(models / f"{mutant.machine}.toml", "model file")
    (target / f"{mutant.machine}.toml").write_text(to_toml(mutant.apply(data)))


def load_all(directory: Path) -> dict[str, MachineSpec]:
    """The product's loader over ``directory``: every machine and the input table."""
    specs = {p.stem: load_spec(p.stem, directory) for p in machine_files(directory)}
    load_inputs(directory, specs)
    return specs


@dataclass(frozen=True)
class Verdict:
    mutant: TomlMutant
    status: str  # "killed", "rejected" (by the loader), "timeout", "survived"
    by: str  # the loader's message, the first failing test, or ""
    seconds: float

    @property
    def detected(self) -> bool:
        return self.status != "survived"


def run_suite(directory: Path | None, suite: tuple[str, ...] = KILL_SUITE,
              timeout: float = 300.0,
              env: dict[str, str] | None = None) -> tuple[int | None, str]:
    """Run ``suite`` with the machines of ``directory`` (None: the real models) and the
    variables ``env`` added: the exit code (None past ``timeout``) and the first failure
    it names (a test's id when a test failed)."""
    extra = {**({ENV: str(directory)} if directory is not None else {}), **(env or {})}
    run = launch.launch(launch.pytest_command(suite, "mutants.mutation_plugin"), ROOT,
                        launch.environment(ROOT, (ENV,), **extra), timeout)
    return run.code, run.first


def judge(mutant: TomlMutant, suite: tuple[str, ...] = KILL_SUITE,
          timeout: float = 300.0) -> Verdict:
    """Load the mutated models; if the loader takes them, run ``suite`` against them."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="p2pfsm-model-mutant-") as tmp:
        directory = Path(tmp)
        write_models(mutant, directory)
        try:
            load_all(directory)
        except ModelError as exc:
            return Verdict(mutant, "rejected", str(exc), time.monotonic() - start)
        code, first = run_suite(directory, suite, timeout)
    seconds = time.monotonic() - start
    if code is None:
        return Verdict(mutant, "timeout", first, seconds)
    return Verdict(mutant, "survived" if code == 0 else "killed", first if code else "",
                   seconds)


def sample(mutants: list[TomlMutant], size: int | None, seed: int) -> list[TomlMutant]:
    """``size`` mutants drawn uniformly without replacement (None or too many: all), in
    the order drawn, so that any first part of a run is a uniform sample too."""
    if size is None or size >= len(mutants):
        return list(mutants)
    return random.Random(seed).sample(mutants, size)


def run(mutants: list[TomlMutant], suite: tuple[str, ...] = KILL_SUITE,
        timeout: float = 300.0) -> Iterator[Verdict]:
    for mutant in mutants:
        yield judge(mutant, suite, timeout)
