"""The executor core both the Node and the SimWorld run on: output dispatch."""

from __future__ import annotations

import typing

import pytest

from p2pfsm.executor.runtime.effects import _HANDLERS, Executor, bound_handlers, check_handlers
from p2pfsm.protocol import Disconnect
from p2pfsm.session import LookupClosed, Output, SendFrame
from p2pfsm.sim.world import SimWorld


def test_every_output_type_has_exactly_one_executor_method() -> None:
    check_handlers()
    assert set(_HANDLERS) == set(typing.get_args(Output))
    assert len(set(_HANDLERS.values())) == len(_HANDLERS)


def test_an_output_without_a_method_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check run at import names the output type that has no Executor method."""
    monkeypatch.delitem(_HANDLERS, LookupClosed)
    with pytest.raises(TypeError) as err:
        check_handlers()
    assert str(err.value) == "outputs without an Executor method: ['LookupClosed']"


def test_an_executor_missing_a_method_fails_loudly_not_silently() -> None:
    class Partial(Executor):
        pass

    with pytest.raises(NotImplementedError):
        Partial().apply("p", SendFrame(Disconnect()))
    Partial().apply("p", LookupClosed(1))  # optional: no action


def test_node_and_simworld_implement_every_required_method() -> None:
    from p2pfsm.executor.node.effects import NodeEffects

    required = {name for name in _HANDLERS.values()
                if getattr(Executor, name).__doc__ is None}
    missing = {n for n in required if getattr(SimWorld, n) is getattr(Executor, n)}
    assert not missing, ("SimWorld", missing)
    # The node's are its effects' (its public namespace is the host API's).
    missing = {n for n in required if getattr(NodeEffects, n) is getattr(Executor, n)}
    assert not missing, ("NodeEffects", missing)


def test_the_driver_looks_handlers_up_once_unless_apply_is_overridden() -> None:
    class Own(Executor):
        def apply(self, peer: str, out: Output) -> None:
            raise AssertionError("not reached")

    assert bound_handlers(Own()) is None
    table = bound_handlers(SimWorld(0))
    assert table is not None and set(table) == set(_HANDLERS)
    assert all(getattr(m, "__name__", None) == _HANDLERS[t] for t, m in table.items())
