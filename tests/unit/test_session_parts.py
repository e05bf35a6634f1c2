"""The session's shape: two parts each owning its tables, an owner interface between
them and the session, and a read-only view for everything outside the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers.world import keys, ready_driver

from p2pfsm.protocol import Fetch, Lookup
from p2pfsm.session import HostFetch, HostLookup, HostSupply, Session
from p2pfsm.session.client_part import ClientPart
from p2pfsm.session.owner import Owner
from p2pfsm.session.server_part import ServerPart

SESSION_DIR = Path(__file__).resolve().parents[2] / "p2pfsm" / "session"


def _imports(module: str) -> set[str]:
    tree = ast.parse((SESSION_DIR / f"{module}.py").read_text())
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_a_part_reaches_neither_the_session_class_nor_the_other_part() -> None:
    for module, other in (("client_part", "server_part"), ("server_part", "client_part")):
        imported = _imports(module)
        assert f"p2pfsm.session.{other}" not in imported, module
        assert "p2pfsm.session.core" not in imported, module
        assert "p2pfsm.session.owner" in imported, module


def test_the_session_is_one_class_that_holds_its_parts() -> None:
    assert Session.__mro__ == (Session, object)
    d = ready_driver()
    assert isinstance(d.s.client, ClientPart) and isinstance(d.s.server, ServerPart)
    assert d.s.client.owner is d.s and d.s.server.owner is d.s


def test_the_owner_interface_is_small_and_the_session_implements_it() -> None:
    members = {n for n in (*vars(Owner), *Owner.__annotations__) if not n.startswith("_")}
    # Three ways to fire (an input's step, a step inside one, the settling), one machine.
    assert members == {"now", "alive", "ready", "peer", "send", "arm", "disarm", "emit",
                       "machine", "step", "step_nested", "settle"}
    assert all(hasattr(Session, n) or n in ("now", "peer") for n in members)
    d = ready_driver()
    assert all(hasattr(d.s, n) for n in members)


def test_the_view_shows_each_parts_tables_as_they_change() -> None:
    d = ready_driver()
    view = d.s.view
    assert view.state == "ready" and view.loads == {} and view.rounds == {}
    d(HostFetch(1, "r1", keys([1]), (1,)))
    d(HostLookup("r2", keys([2])))
    d.recv(Lookup("s1", keys([3]), 0))
    d(HostSupply(7, "s2", keys([4]), (4,)))
    d.recv(Fetch("s2", keys([4]), (5,), 0))
    assert view.loads["r1"][0].fsm_state == "loading"
    assert view.load("r1", 0) is view.loads["r1"][0] and view.load("r1", 1) is None
    assert view.load_jobs == {1}
    assert [lk.kv_request_id for lk in view.lookups["r2"]] == ["r2"]
    assert view.lookup_rounds == {"r2": 0}
    assert [s.kv_request_id for s in view.served.values()] == ["s1"]
    assert set(view.rounds) == {"s2"} and view.serve_rounds == (view.rounds["s2"][0],)
    assert view.store_jobs == {7: view.rounds["s2"][0]}
    assert set(view.writes.values()) == {view.rounds["s2"][0]}
    assert any(t.kind == "load" for t in view.timers)
    assert view.queued == () and view.pending_outputs == () and view.outbox == ()
    assert view.unsettled == ()


def test_the_view_cannot_write_the_session() -> None:
    d = ready_driver()
    d(HostFetch(1, "r1", keys([1]), (1,)))
    view = d.s.view
    with pytest.raises(TypeError):
        view.loads["r9"] = {}  # type: ignore[index]
    with pytest.raises(TypeError):
        del view.timers[next(iter(view.timers))]  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        view.state = "dead"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        view.other = 1  # type: ignore[attr-defined]
    assert d.s.state == "ready" and "r1" in view.loads
