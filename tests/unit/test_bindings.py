"""Bindings: a live session listens to one connection (p2pfsm.executor.node.bindings)."""

from __future__ import annotations

from p2pfsm.executor.node.bindings import Bindings


def test_an_unbound_peer_is_admitted_on_any_connection_then_only_on_its_own() -> None:
    b = Bindings()
    assert b.admits("p:1", 7)
    b.bind("p:1", 7)
    assert b.admits("p:1", 7) and not b.admits("p:1", 8)
    assert b.admits("q:2", 8)  # another peer's binding is its own


def test_a_connect_on_another_connection_rebinds_and_forget_unbinds() -> None:
    b = Bindings()
    b.bind("p:1", 7)
    b.bind("p:1", 9)  # a restart's connect came on connection 9
    assert b.admits("p:1", 9) and not b.admits("p:1", 7)
    b.forget("p:1")
    assert b.admits("p:1", 7) and len(b) == 0


def test_an_unknown_connection_binds_nothing_and_is_admitted() -> None:
    b = Bindings()
    b.bind("p:1", -1)
    assert len(b) == 0
    b.bind("p:1", 3)
    assert b.admits("p:1", -1)  # libzmq could not say: nothing to compare
