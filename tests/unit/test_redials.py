"""The redial book (p2pfsm/executor/node/redials.py): backoff, parked calls and their deadlines."""

from __future__ import annotations

import random

from p2pfsm.executor.node.redials import Redials
from p2pfsm.session import HostFetch, HostLookup, SessionDead


class _Full(random.Random):
    """Jitter that draws each wait whole (the top of its range)."""

    def random(self) -> float:
        return 1.0


FULL = _Full()


def _dead(reason: str = "disconnected") -> SessionDead:
    return SessionDead(reason)


def _fetch(req: str, job: int = 1) -> HostFetch:
    return HostFetch(job, req, (b"k",), (0,))


def test_only_sessions_the_host_dialled_are_redialled() -> None:
    book = Redials((0.1, 1.0), rng=FULL)
    assert not book.may_redial("p:1", _dead(), closing=False)
    book.host_dialled("p:1")
    assert book.may_redial("p:1", _dead(), closing=False)
    assert not book.may_redial("p:1", _dead("closed"), closing=False)
    assert not book.may_redial("p:1", _dead(), closing=True)
    assert not Redials(None).may_redial("p:1", _dead(), closing=False)


def test_backoff_is_none_after_ready_then_doubles_to_its_most() -> None:
    book = Redials((0.1, 0.5), rng=FULL)
    book.host_dialled("p:1")
    waits = [book.schedule("p:1", 100.0) for _ in range(5)]
    assert waits == [0.0, 0.1, 0.2, 0.4, 0.5]
    book.ready("p:1")
    assert book.schedule("p:1", 100.0) == 0.0


def test_due_redials_and_expires_parked_calls_of_peers_not_due() -> None:
    book = Redials((1.0, 8.0), rng=FULL)
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
    book = Redials((1.0, 8.0), rng=FULL)
    book.host_dialled("a:1")
    book.schedule("a:1", 0.0)
    one, other = _fetch("r1", 1), _fetch("r2", 2)
    book.park("a:1", 9.0, one)
    book.park("a:1", 9.0, other)
    assert book.take_request("a:1", "r1") == [one]
    assert book.take_request("a:1", "r1") == []
    assert book.end() == [("a:1", other)]
    assert not book and book.next_due() is None and book.end() == []


def test_waits_are_drawn_between_half_and_all_of_the_backoff() -> None:
    book = Redials((1.0, 8.0), rng=random.Random(7))
    book.host_dialled("p:1")
    assert book.schedule("p:1", 0.0) == 0.0  # after a ready session: at once
    nominal = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    drawn = [book.schedule("p:1", 0.0) for _ in nominal]
    assert all(w / 2 <= d <= w for d, w in zip(drawn, nominal, strict=True)), drawn
    assert len(set(drawn)) == len(drawn)  # drawn, not fixed


def test_max_attempts_gives_a_peer_up_and_ready_resets_the_count() -> None:
    book = Redials((0.1, 1.0), max_attempts=2, rng=FULL)
    book.host_dialled("p:1")
    for _ in range(2):
        assert book.may_redial("p:1", _dead(), closing=False)
        book.schedule("p:1", 0.0)
    assert book.attempts("p:1") == 2 and book.exhausted("p:1")
    assert not book.may_redial("p:1", _dead(), closing=False)
    book.ready("p:1")
    assert book.attempts("p:1") == 0 and book.may_redial("p:1", _dead(), closing=False)


def test_forget_stops_redials_and_hands_back_the_parked_calls() -> None:
    book = Redials((1.0, 8.0), rng=FULL)
    book.host_dialled("p:1")
    book.schedule("p:1", 0.0)
    book.schedule("p:1", 0.0)  # due at 1.0
    call = _fetch("r1")
    book.park("p:1", 9.0, call)
    assert book.now("p:1", 0.5) and book.due(0.5)[0] == ["p:1"]  # redial now
    assert not book.now("p:1", 0.5)  # none due any more
    book.schedule("p:1", 0.0)
    assert book.forget("p:1") == [call]
    assert not book.waiting("p:1") and not book.dialled("p:1")
    assert not book.may_redial("p:1", _dead(), closing=False)
