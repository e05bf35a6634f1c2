"""Typed payloads per trigger: every guard and action admits (by its annotation) each
payload its triggers carry (p2pfsm.session.payloads), and the input table's rows carry
what that table declares."""

from __future__ import annotations

import inspect
import types
import typing

import pytest

from p2pfsm import protocol
from p2pfsm.fsm import CompiledMachine, input_table, machines
from p2pfsm.session import inputs
from p2pfsm.session.client import CLIENT_LOOKUP, CLIENT_ROUND, LookupPart
from p2pfsm.session.core import SESSION
from p2pfsm.session.payloads import PAYLOADS
from p2pfsm.session.server import SERVER_LOOKUP, SERVER_ROUND, LookupAnswer

BOUND: dict[str, CompiledMachine] = {
    m.name: m for m in (SESSION, CLIENT_ROUND, CLIENT_LOOKUP, SERVER_ROUND, SERVER_LOOKUP)}
IMPLS = {"session": "Session", "client_round": "ClientRound", "client_lookup": "ClientLookup",
         "server_round": "ServerRound", "server_lookup": "ServerLookup"}


def _impl(name: str) -> type:
    module = {"session": "core", "client_round": "client", "client_lookup": "client",
              "server_round": "server", "server_lookup": "server"}[name]
    mod = __import__(f"p2pfsm.session.{module}", fromlist=[IMPLS[name]])
    cls: type = getattr(mod, IMPLS[name])
    return cls


def _admits(annotation: object, payload: type | None) -> bool:
    if annotation is object:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return any(_admits(a, payload) for a in typing.get_args(annotation))
    if payload is None:
        return annotation is type(None)
    return isinstance(annotation, type) and issubclass(payload, annotation)


def _payload_annotation(impl: type, name: str) -> object:
    method = getattr(impl, name)
    params = list(inspect.signature(method).parameters)
    assert len(params) == 2, f"{impl.__name__}.{name} takes (self, payload)"
    return typing.get_type_hints(method)[params[1]]


def test_every_trigger_of_every_machine_declares_its_payload() -> None:
    assert {m: set(t) for m, t in PAYLOADS.items()} == \
        {m: set(spec.triggers) for m, spec in machines().items()}


@pytest.mark.parametrize("name", sorted(IMPLS))
def test_every_guard_and_action_admits_the_payloads_of_its_triggers(name: str) -> None:
    impl = _impl(name)
    wrong = []
    for t in BOUND[name].spec.transitions:
        for fn in (*t.guards, *t.unless, *t.actions):
            annotation = _payload_annotation(impl, fn)
            wrong += [f"{name}.{t.trigger}: {fn}({annotation}) given {p}"
                      for p in PAYLOADS[name][t.trigger] if not _admits(annotation, p)]
    assert not wrong


def test_no_guard_or_action_asks_the_type_of_its_payload() -> None:
    for name in IMPLS:
        impl = _impl(name)
        names = {fn for t in BOUND[name].spec.transitions
                 for fn in (*t.guards, *t.unless, *t.actions)}
        for fn in names:
            assert "isinstance(" not in inspect.getsource(getattr(impl, fn)), fn


def _message(frame: str) -> type:
    (cls,) = [c for c in vars(protocol).values()
              if isinstance(c, type) and getattr(c, "TYPE", None) == frame]
    return cls


HANDED: dict[tuple[str, str], type] = {
    ("client_lookup", "recv_lookup_resp"): LookupPart,
    ("server_lookup", "host_answer"): LookupAnswer,
}
"""Inputs whose part hands the machine what it made of them: one lookup's pairs of a
lookup_resp; the host's answer with the hits its round refuses taken out."""


def test_the_input_tables_rows_carry_the_declared_payloads() -> None:
    for row in input_table().inputs:
        carried = _message(row.name) if row.kind == "frame" else getattr(inputs, row.event)
        if row.gate is not None:
            assert carried in PAYLOADS["session"][row.gate], row.name
        for trigger in row.triggers:
            handed = HANDED.get((row.machine, trigger), carried)
            assert PAYLOADS[row.machine][trigger] == (handed,) or \
                (handed is carried and carried in PAYLOADS[row.machine][trigger]), row.name
