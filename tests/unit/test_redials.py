"""The redial book (p2pfsm/executor/redial.py): backoff, parked calls and their deadlines."""

from __future__ import annotations

from p2pfsm.executor.redial import Redials
from p2pfsm.session import HostFetch, HostLookup, SessionDead


def _dead(reason: str = "disconnected") -> SessionDead:
    return SessionDead(reason)


def _fetch(req: str, job: int = 1) -> HostFetch:
    return HostFetch(job, req, (b"k",), (0,))


def test_only_sessions_the_host_dialled_are_redialled() -> None:
    book = Redials((0.1, 1.0))
    assert not book.may_redial("p:1", _dead(), closing=False)
    book.host_dialled("p:1")
    assert book.may_redial("p:1", _dead(), closing=False)
    assert not book.may_redial("p:1", _dead("closed"), closing=False)
    assert not book.may_redial("p:1", _dead(), closing=True)
    assert not Redials(None).may_redial("p:1", _dead(), closing=False)


def test_backoff_is_none_after_ready_then_doubles_to_its_most() -> None:
    book = Redials((0.1, 0.5))
    book.host_dialled("p:1")
    waits = [book.schedule("p:1", 100.0) for _ in range(5)]
    assert waits == [0.0, 0.1, 0.2, 0.4, 0.5]
    book.ready("p:1")
    assert book.schedule("p:1", 100.0) == 0.0


def test_due_redials_and_expires_parked_calls_of_peers_not_due() -> None:
    book = Redials((1.0, 8.0))
    for peer in ("a:1", "b:1"):
        book.host_dialled(peer)
        book.schedule(peer, 0.0)
        book.schedule(peer, 0.0)  # second failure: due at 1.0
    book.schedule("a:1", -10.0)  # due at -8.0: now
    early, late = _fetch("r1"), HostLookup("r2", (b"k",))
    book.park("b:1", 0.5, early)
    book.park("b:1", 5.0, late)
    assert book and book.waiting("a:1") and book.next_due() == -8.0
    peers, expired = book.due(0.6)
    assert peers == ["a:1"] and expired == [("b:1", early)]
    assert not book.waiting("a:1") and book.waiting("b:1")
    assert book.next_due() == 1.0
    assert book.take("b:1") == [late] and book.take("b:1") == []


def test_a_cancelled_request_leaves_the_book_and_end_empties_it() -> None:
    book = Redials((1.0, 8.0))
    book.host_dialled("a:1")
    book.schedule("a:1", 0.0)
    one, other = _fetch("r1", 1), _fetch("r2", 2)
    book.park("a:1", 9.0, one)
    book.park("a:1", 9.0, other)
    assert book.take_request("a:1", "r1") == [one]
    assert book.take_request("a:1", "r1") == []
    assert book.end() == [("a:1", other)]
    assert not book and book.next_due() is None and book.end() == []
