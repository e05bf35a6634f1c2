"""A node's books about its peers (p2pfsm/executor/node/peer_policy.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from p2pfsm.executor.node.peer_policy import EndedSessions, IdleInbound, ViolationBudget
from p2pfsm.executor.zmq.admission import eviction_victim


@dataclass
class _S:
    alive: bool = True
    has_pending_work: bool = False


def test_only_sessions_a_peer_opened_are_closed_when_idle() -> None:
    book = IdleInbound(10.0)
    sessions = {"in:1": _S(), "busy:1": _S(has_pending_work=True), "ours:1": _S(),
                "gone:1": _S(alive=False)}
    for peer in ("in:1", "busy:1", "ours:1", "gone:1"):
        book.opened_by_peer(peer)
        book.heard(peer, 100.0)
    book.ours("ours:1")
    book.heard("ours:1", 100.0)  # the host's own: not taken back into the book
    assert book.due(100.0)
    assert list(book.idle(105.0, sessions)) == []  # not idle yet; "gone" leaves
    assert not book.due(105.5) and book.due(106.0)  # looked at about once a second
    assert list(book.idle(111.0, sessions)) == [("in:1", 11.0)]
    assert list(book.idle(200.0, sessions)) == []  # busy has work; in:1 was named once
    assert list(IdleInbound(None).idle(1e9, sessions)) == []


def test_ended_sessions_beyond_history_are_dropped_oldest_first_when_quiet() -> None:
    book = EndedSessions(history=2)
    sessions = {p: _S(alive=False) for p in ("a:1", "b:1", "c:1", "d:1")}
    sessions["a:1"].has_pending_work = True
    for peer in ("a:1", "b:1", "c:1", "d:1"):
        book.ended(peer)
    assert list(book.to_drop(sessions)) == ["b:1", "c:1"]  # a:1 still has work
    sessions["a:1"].has_pending_work = False
    book.reopened("d:1")
    assert list(book.to_drop(sessions)) == []  # a:1 and nothing else: within history


def test_a_session_alive_again_or_gone_leaves_the_book_without_counting() -> None:
    book = EndedSessions(history=1)
    sessions = {p: _S(alive=False) for p in ("a:1", "b:1", "c:1", "d:1")}
    for peer in ("a:1", "b:1", "c:1", "d:1"):
        book.ended(peer)
    sessions["a:1"].alive = True
    del sessions["b:1"]
    assert book.to_drop(sessions) == ["c:1", "d:1"]  # three over: a:1, b:1 leave uncounted
    book.ended("e:1")
    sessions["e:1"] = _S(alive=False)
    assert book.to_drop(sessions) == []  # the book holds e:1 alone: within history


@pytest.mark.parametrize(("budget", "crossing"), [(3, 4), (1, 2)])
def test_the_budget_is_crossed_once(budget: int, crossing: int) -> None:
    book = ViolationBudget(budget)
    counts = [book.rejected("p:1") for _ in range(crossing + 2)]
    assert [c for c in counts if book.crossed(c)] == [crossing]
    book.new_session("p:1")
    assert book.rejected("p:1") == 1
    assert not any(ViolationBudget(0).crossed(c) for c in range(1, 100))


def test_rejected_frames_are_logged_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    book = ViolationBudget(0)
    log = logging.getLogger("p2pfsm.test_peer_policy")
    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(20):
            book.log("p:1", log, "bad frame")
    assert len([r for r in caplog.records if "frame rejected" in r.getMessage()]) == 5


@dataclass
class _Pending:
    name: str
    origin: str
    connected: bool = False
    done: bool = False


def test_eviction_takes_an_unproven_dial_back_before_any_whose_handshake_came_up() -> None:
    """Host A holds two dial-backs whose handshakes came up, host B one unproven; a
    newcomer from B: B's own unproven one goes, not A's progressing ones although A is
    the busier host. Only when every candidate came up does the busiest host's oldest go."""
    a1, a2 = _Pending("a1", "A", connected=True), _Pending("a2", "A", connected=True)
    b1 = _Pending("b1", "B")
    assert eviction_victim([a1, a2, b1], "B") is b1
    b1.connected = True
    assert eviction_victim([a1, a2, b1], "B") is a1
    flood = [_Pending(f"f{i}", f"10.0.0.{i}") for i in range(3)]
    legit = _Pending("legit", "10.0.1.1", connected=True)
    assert eviction_victim([legit, *flood], "10.0.0.9") is flood[0]
