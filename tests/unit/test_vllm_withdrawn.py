"""The adapter's book of store jobs a cache reset withdrew (p2pfsm.vllm.withdrawn)."""

from __future__ import annotations

from helpers.world import ready_world

from p2pfsm.session import StartWrite
from p2pfsm.vllm.withdrawn import Withdrawn


def test_unfetched_supply_is_withdrawn_once_and_its_write_refused() -> None:
    w = ready_world()
    kept = w.supply("b", "r2", [9])
    store = w.supply("b", "r1", [8])
    assert store is not None and kept is not None
    book = Withdrawn()
    b = w.sessions["b"]
    assert book.withdraw(b, ["r1", "unknown"]) == [store]
    assert book.withdraw(b, ["r1"]) == []  # one result per job
    writes_before = len(w.out("b", StartWrite))
    w.load("a", "r1", [8])
    w.deliver("a")
    (write,) = w.out("b", StartWrite)[writes_before:]
    assert book.refuses(b, write.xfer)
    w.load("a", "r2", [9])
    w.deliver("a")
    (other,) = w.out("b", StartWrite)[writes_before + 1:]
    assert not book.refuses(b, other.xfer)  # a job not withdrawn is written
    assert book.settled(store) and not book.settled(store)
    assert not book.settled(kept)


def test_a_fetched_round_is_not_withdrawn() -> None:
    w = ready_world()
    w.load("a", "r1", [8])
    w.deliver("a")  # the fetch first: the round has demand
    store = w.supply("b", "r1", [8])
    assert store is not None
    assert Withdrawn().withdraw(w.sessions["b"], ["r1"]) == []
