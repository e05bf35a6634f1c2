"""quick_init: the same __init__ as the dataclass's, only cheaper; the class stays frozen."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field

import pytest

from p2pfsm.protocol import messages
from p2pfsm.protocol.frozen import quick_init
from p2pfsm.session import child, inputs, outputs


@dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: str = "x"
    c: list[int] = field(default_factory=list)
    d: bool = field(default=False, kw_only=True)


@quick_init
@dataclass(frozen=True, slots=True)
class _Quick:
    a: int
    b: str = "x"
    c: list[int] = field(default_factory=list)
    d: bool = field(default=False, kw_only=True)


def _shape(cls: type) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]


def test_same_parameters_as_the_dataclass_init() -> None:
    assert _shape(_Quick) == _shape(_Plain)


@pytest.mark.parametrize("args", [(1,), (1, "y"), (1, "y", [2])])
def test_same_fields_as_the_dataclass_builds(args: tuple[object, ...]) -> None:
    quick, plain = _Quick(*args, d=True), _Plain(*args, d=True)  # type: ignore[arg-type]
    assert dataclasses.astuple(quick) == dataclasses.astuple(plain)
    assert quick == _Quick(*args, d=True)  # type: ignore[arg-type]
    assert repr(quick) == repr(plain).replace("_Plain", "_Quick")


def test_a_factory_default_is_fresh_each_time() -> None:
    first, second = _Quick(1), _Quick(1)
    assert first.c == [] and first.c is not second.c


def test_still_frozen_and_still_refuses_bad_calls() -> None:
    q = _Quick(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.a = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        _Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Quick(1, "y", [], True)  # type: ignore[misc]  # d is keyword-only


def test_refuses_a_class_it_cannot_copy_faithfully() -> None:
    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(frozen=True, slots=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (NoSlots, Post):
        with pytest.raises(TypeError):
            quick_init(cls)


def test_the_hot_classes_have_it() -> None:
    """Every frozen dataclass of the messages, inputs, outputs and outbox items."""
    for module in (messages, inputs, outputs, child):
        for cls in vars(module).values():
            if (isinstance(cls, type) and dataclasses.is_dataclass(cls)
                    and cls.__module__ == module.__name__
                    and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
                code = cls.__init__.__code__  # type: ignore[misc]
                assert code.co_filename.startswith("<quick_init"), cls
