"""Read ``models/inputs.toml``: which machine instance each input reaches, and its trigger.

The file is data only (see its header). :func:`parse_inputs` checks it against the
machines: every machine, trigger, gate and state it names must be declared there, else
:class:`~p2pfsm.errors.ModelError` at load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from p2pfsm.errors import ModelError
from p2pfsm.fsm.spec import MachineSpec, read_model_file

INPUTS_FILE = "inputs"
"""The stem of the input table in ``models/`` (it is not a machine)."""
KINDS = frozenset({"frame", "timer", "host", "result", "transport"})
NEW = "new"
"""The ``key`` of an input that creates the instance it fires on."""

Step = tuple[str, str]
"""(machine, trigger)."""

_INPUT_KEYS = frozenset({"kind", "name", "event", "machine", "key", "trigger", "variants",
                         "gate", "fanout", "doc"})


@dataclass(frozen=True, slots=True)
class Variant:
    """Fire ``trigger`` instead when the event's ``field`` is ``expect``."""

    field: str
    expect: bool
    trigger: str


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One input: what it is and the machine step it starts."""

    kind: str
    name: str
    event: str
    machine: str
    key: tuple[str, ...]
    creates: bool
    trigger: str
    variants: tuple[Variant, ...]
    gate: str | None
    fanout: tuple[Step, ...]
    doc: str

    @property
    def triggers(self) -> tuple[str, ...]:
        """The default trigger, then each variant's."""
        return (self.trigger, *(v.trigger for v in self.variants))

    def trigger_for(self, event: object) -> str:
        """The trigger ``event`` (the input, or a decoded frame) fires."""
        for v in self.variants:
            if bool(getattr(event, v.field)) is v.expect:
                return v.trigger
        return self.trigger

    def steps(self) -> frozenset[Step]:
        """Every (machine, trigger) this input may start, its fan-out and gate included."""
        own = {(self.machine, t) for t in self.triggers}
        gate = {("session", self.gate)} if self.gate else set()
        return frozenset(own | set(self.fanout) | gate)


@dataclass(frozen=True, slots=True)
class InputTable:
    """The whole table: the inputs, the live session states (the session machine's set
    ``live``) and the cascade triggers."""

    inputs: tuple[InputSpec, ...]
    live_states: frozenset[str]
    stale: str
    cascade: Mapping[Step, str]

    def of_kind(self, kind: str) -> dict[str, InputSpec]:
        """The inputs of one kind, by name."""
        return {i.name: i for i in self.inputs if i.kind == kind}

    def by_event(self, event: str) -> InputSpec:
        """The one non-frame, non-timer input of event class ``event``."""
        rows = [i for i in self.inputs if i.event == event and i.kind not in ("frame", "timer")]
        if len(rows) != 1:
            raise KeyError(event)
        return rows[0]

    def reached(self) -> frozenset[Step]:
        """Every (machine, trigger) an input starts, the stale answer included."""
        steps = {s for i in self.inputs for s in i.steps()}
        return frozenset(steps | {("session", self.stale)})


def _strs(raw: object, where: str) -> tuple[str, ...]:
    if isinstance(raw, list) and all(isinstance(x, str) and x for x in raw):
        return tuple(raw)
    raise ModelError(f"{where}: expected a list of names, got {raw!r}")


def _step(text: object, where: str, specs: Mapping[str, MachineSpec]) -> Step:
    if not isinstance(text, str) or text.count(".") != 1:
        raise ModelError(f"{where}: expected 'machine.trigger', got {text!r}")
    machine, trigger = text.split(".")
    _check_trigger(machine, trigger, where, specs)
    return machine, trigger


def _check_trigger(machine: str, trigger: object, where: str,
                   specs: Mapping[str, MachineSpec]) -> str:
    spec = specs.get(machine)
    if spec is None:
        raise ModelError(f"{where}: unknown machine {machine!r} (known: {sorted(specs)})")
    if not isinstance(trigger, str) or trigger not in spec.triggers:
        raise ModelError(f"{where}: machine {machine!r} has no trigger {trigger!r}")
    return trigger


def _variant(raw: object, machine: str, where: str,
             specs: Mapping[str, MachineSpec]) -> Variant:
    if not isinstance(raw, dict) or len(raw) != 2 or "trigger" not in raw:
        raise ModelError(f"{where}: a variant is {{when|unless = field, trigger = name}}")
    sel = "when" if "when" in raw else "unless"
    field = raw.get(sel)
    if not isinstance(field, str) or not field:
        raise ModelError(f"{where}: a variant needs 'when' or 'unless' naming a field")
    return Variant(field, sel == "when", _check_trigger(machine, raw["trigger"], where, specs))


def _parse_input(raw: object, where: str, specs: Mapping[str, MachineSpec]) -> InputSpec:
    if not isinstance(raw, dict):
        raise ModelError(f"{where}: expected a table")
    unknown = raw.keys() - _INPUT_KEYS
    if unknown:
        raise ModelError(f"{where}: unknown keys {sorted(unknown)}")
    kind, name, event = raw.get("kind"), raw.get("name"), raw.get("event")
    machine, doc = raw.get("machine"), raw.get("doc", "")
    if kind not in KINDS:
        raise ModelError(f"{where}: 'kind' must be one of {sorted(KINDS)}, got {kind!r}")
    for field, value in (("name", name), ("event", event), ("machine", machine)):
        if not isinstance(value, str) or not value:
            raise ModelError(f"{where}: {field!r} must be a non-empty string")
    assert isinstance(kind, str) and isinstance(name, str) and isinstance(event, str)
    assert isinstance(machine, str)
    if not isinstance(doc, str):
        raise ModelError(f"{where}: 'doc' must be a string")
    where = f"{where} ({kind} {name})"
    trigger = _check_trigger(machine, raw.get("trigger"), where, specs)
    raw_key = raw.get("key", [])
    creates = raw_key == NEW
    key = () if creates or raw_key == [] else _strs(raw_key, f"{where}: key")
    raw_variants = raw.get("variants", [])
    if not isinstance(raw_variants, list):
        raise ModelError(f"{where}: 'variants' must be a list")
    variants = tuple(_variant(v, machine, where, specs) for v in raw_variants)
    gate = raw.get("gate")
    if gate is not None:
        if kind != "frame":
            raise ModelError(f"{where}: only frames pass the session's gate")
        _check_trigger("session", gate, where, specs)
    raw_fanout = raw.get("fanout", [])
    fanout = tuple(_step(s, f"{where}: fanout", specs)
                   for s in (_strs(raw_fanout, f"{where}: fanout") if raw_fanout else ()))
    return InputSpec(kind, name, event, machine, key, creates, trigger, variants,
                     gate if isinstance(gate, str) else None, fanout, doc)


def parse_inputs(data: dict[str, object], origin: str,
                 specs: Mapping[str, MachineSpec]) -> InputTable:
    """Build and check the input table from parsed TOML against the machines ``specs``."""
    if "session" not in specs:
        raise ModelError(f"{origin}: the machines include no 'session'")
    session = specs["session"]
    if "live_states" in data:
        raise ModelError(f"{origin}: 'live_states' moved to the session's [sets] (live)")
    live = session.state_set("live")
    stale = _check_trigger("session", data.get("stale"), f"{origin}: stale", specs)
    raw_inputs = data.get("input")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ModelError(f"{origin}: '[[input]]' must be a non-empty list of tables")
    rows = tuple(_parse_input(r, f"{origin}: input[{i}]", specs)
                 for i, r in enumerate(raw_inputs))
    seen: set[tuple[str, str]] = set()
    for row in rows:
        if (row.kind, row.name) in seen:
            raise ModelError(f"{origin}: {row.kind} {row.name!r} is declared twice")
        seen.add((row.kind, row.name))
    raw_cascade = data.get("cascade", {})
    if not isinstance(raw_cascade, dict) or not all(
            isinstance(v, str) for v in raw_cascade.values()):
        raise ModelError(f"{origin}: '[cascade]' must map 'machine.trigger' to a doc string")
    cascade = {_step(k, f"{origin}: cascade", specs): v for k, v in raw_cascade.items()}
    return InputTable(rows, live, stale, cascade)


def load_inputs(directory: Path, specs: Mapping[str, MachineSpec]) -> InputTable:
    """Load ``<directory>/inputs.toml`` and check it against ``specs``."""
    path = directory / f"{INPUTS_FILE}.toml"
    return parse_inputs(read_model_file(path, "input table"), path.name, specs)
