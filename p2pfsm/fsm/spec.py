"""Read one ``models/<name>.toml`` file into an immutable :class:`MachineSpec`.

A model file holds data only: a name, a doc line, its states (name -> doc), the
initial state, the terminal states, named sets of states (``[sets]``: the state
groups code asks about, e.g. ``live``, so no state name is retyped in code) and a
flat list of transitions, each with a
trigger, its source states, a destination (absent = internal: the state stays,
the actions run), guards that must hold, ``unless`` guards that must not, and
actions run in order. Guards and actions are names; :func:`bind` checks them
against the class that implements them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from p2pfsm.errors import ModelError


@dataclass(frozen=True, slots=True)
class TransitionSpec:
    """One declared edge (or internal transition when ``dest`` is None)."""

    trigger: str
    sources: tuple[str, ...]
    dest: str | None
    guards: tuple[str, ...]
    unless: tuple[str, ...]
    actions: tuple[str, ...]
    doc: str

    def dest_from(self, source: str) -> str:
        """The state after firing from ``source``."""
        return source if self.dest is None else self.dest


@dataclass(frozen=True, slots=True)
class MachineSpec:
    """A whole machine as declared in its model file."""

    name: str
    doc: str
    states: dict[str, str]
    initial: str
    terminal: frozenset[str]
    transitions: tuple[TransitionSpec, ...]
    sets: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Named sets of states (``[sets]`` of the model file)."""

    def state_set(self, name: str) -> frozenset[str]:
        """The states of set ``name``; an undeclared set is a :class:`ModelError`."""
        try:
            return self.sets[name]
        except KeyError:
            raise ModelError(f"machine {self.name!r} declares no state set {name!r} "
                             f"(its sets: {sorted(self.sets)})") from None

    @property
    def triggers(self) -> frozenset[str]:
        return frozenset(t.trigger for t in self.transitions)

    @property
    def guard_names(self) -> frozenset[str]:
        return frozenset(g for t in self.transitions for g in (*t.guards, *t.unless))

    @property
    def action_names(self) -> frozenset[str]:
        return frozenset(a for t in self.transitions for a in t.actions)

    def edges(self) -> set[tuple[str, str, str]]:
        """Every (source, trigger, dest) the machine can take, internal ones included."""
        return {(s, t.trigger, t.dest_from(s)) for t in self.transitions for s in t.sources}


def models_dir() -> Path:
    """The directory holding the model files (source tree first, then the wheel copy)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "models", here / "_models"):
        if candidate.is_dir():
            return candidate
    raise ModelError(f"no models directory next to {here}")


_TRANSITION_KEYS = frozenset({"trigger", "source", "dest", "guards", "unless", "actions", "doc"})


def _names(raw: object, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        return tuple(raw)
    raise ModelError(f"{where}: expected a name or a list of names, got {raw!r}")


def _parse_sets(raw: object, states: Mapping[str, str],
                origin: str) -> dict[str, frozenset[str]]:
    """``[sets]``: set name -> a non-empty list of declared states."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ModelError(f"{origin}: 'sets' must map set names to lists of states")
    sets: dict[str, frozenset[str]] = {}
    for name, members in raw.items():
        where = f"{origin}: sets.{name}"
        if name in states:
            raise ModelError(f"{where}: a set cannot share the name of a state")
        if not isinstance(members, list) or not members or not all(
                isinstance(m, str) for m in members):
            raise ModelError(f"{where}: expected a non-empty list of state names")
        unknown = sorted(set(members) - states.keys())
        if unknown:
            raise ModelError(f"{where}: unknown states {unknown}")
        sets[name] = frozenset(members)
    return sets


def parse_spec(data: dict[str, object], origin: str) -> MachineSpec:
    """Build and check a spec from parsed TOML data."""
    name = data.get("name")
    states = data.get("states")
    initial = data.get("initial")
    raw_transitions = data.get("transitions")
    if not isinstance(name, str) or not name:
        raise ModelError(f"{origin}: 'name' must be a non-empty string")
    if not isinstance(states, dict) or not all(isinstance(v, str) for v in states.values()):
        raise ModelError(f"{origin}: 'states' must map state names to doc strings")
    if not isinstance(initial, str) or initial not in states:
        raise ModelError(f"{origin}: 'initial' must name a declared state, got {initial!r}")
    terminal = frozenset(_names(data.get("terminal"), f"{origin}: terminal"))
    if not terminal <= states.keys():
        raise ModelError(f"{origin}: unknown terminal states {sorted(terminal - states.keys())}")
    if not isinstance(raw_transitions, list) or not raw_transitions:
        raise ModelError(f"{origin}: 'transitions' must be a non-empty list")
    transitions: list[TransitionSpec] = []
    for i, raw in enumerate(raw_transitions):
        where = f"{origin}: transitions[{i}]"
        if not isinstance(raw, dict):
            raise ModelError(f"{where}: expected a table")
        unknown_keys = raw.keys() - _TRANSITION_KEYS
        if unknown_keys:
            raise ModelError(f"{where}: unknown keys {sorted(unknown_keys)}")
        trigger = raw.get("trigger")
        dest = raw.get("dest")
        doc = raw.get("doc", "")
        if not isinstance(trigger, str) or not trigger:
            raise ModelError(f"{where}: 'trigger' must be a non-empty string")
        if dest is not None and (not isinstance(dest, str) or dest not in states):
            raise ModelError(f"{where}: 'dest' must name a declared state, got {dest!r}")
        if not isinstance(doc, str):
            raise ModelError(f"{where}: 'doc' must be a string")
        sources = _names(raw.get("source"), f"{where}: source")
        if not sources or not set(sources) <= states.keys():
            raise ModelError(f"{where}: 'source' must name declared states, got {sources!r}")
        if set(sources) & terminal and dest is not None:
            # A terminal state is never left; an internal transition (no dest) may still
            # answer a call there (a host call on a closed session gets its result).
            raise ModelError(f"{where}: terminal states {sorted(set(sources) & terminal)} "
                             "cannot have outgoing transitions (only internal ones, no dest)")
        transitions.append(TransitionSpec(
            trigger=trigger,
            sources=sources,
            dest=dest,
            guards=_names(raw.get("guards"), f"{where}: guards"),
            unless=_names(raw.get("unless"), f"{where}: unless"),
            actions=_names(raw.get("actions"), f"{where}: actions"),
            doc=doc,
        ))
    spec = MachineSpec(
        name=name,
        doc=str(data.get("doc", "")),
        states=dict(states),
        initial=initial,
        terminal=terminal,
        transitions=tuple(transitions),
        sets=_parse_sets(data.get("sets"), states, origin),
    )
    _check_unreachable(spec, origin)
    return spec


def _check_unreachable(spec: MachineSpec, origin: str) -> None:
    reached = {spec.initial}
    frontier = [spec.initial]
    while frontier:
        state = frontier.pop()
        for _src, _trigger, dest in (e for e in spec.edges() if e[0] == state):
            if dest not in reached:
                reached.add(dest)
                frontier.append(dest)
    missing = spec.states.keys() - reached
    if missing:
        raise ModelError(f"{origin}: states unreachable from {spec.initial!r}: {sorted(missing)}")


def read_model_file(path: Path, what: str) -> dict[str, object]:
    """The TOML table of ``path``; a missing or malformed file is a :class:`ModelError`
    (``what`` names it: "model file", "input table")."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ModelError(f"no {what} {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ModelError(f"{path}: {exc}") from exc


def load_spec(name: str, directory: Path | None = None) -> MachineSpec:
    """Load ``<directory>/<name>.toml`` (default: :func:`models_dir`)."""
    path = (directory or models_dir()) / f"{name}.toml"
    data = read_model_file(path, "model file")
    spec = parse_spec(data, str(path.name))
    if spec.name != name:
        raise ModelError(f"{path}: declares name {spec.name!r}, expected {name!r}")
    return spec
