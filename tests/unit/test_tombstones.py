"""Tombstones forget an entry exactly when its time is up, however it was written."""

from __future__ import annotations

from p2pfsm.session.tombstones import TombstoneBudget, Tombstones


def _keys(t: Tombstones) -> list[str]:
    return [key for key, _value, _until in t.entries()]


def test_an_entry_is_forgotten_at_its_expiry_and_not_before() -> None:
    t = Tombstones(10.0)
    t.put("a", 1, 0.0)
    t.put("b", 2, 4.0)
    t.purge(9.99)
    assert _keys(t) == ["a", "b"]
    t.purge(10.0)
    assert _keys(t) == ["b"] and t.get("a") is None and t.get("b") == 2
    t.purge(14.0)
    assert len(t) == 0


def test_a_rewritten_entry_lives_from_its_last_write() -> None:
    t = Tombstones(10.0)
    t.put("a", 1, 0.0)
    t.put("b", 2, 1.0)
    t.put("a", 3, 5.0)  # moves behind b
    t.purge(11.0)
    assert _keys(t) == ["a"] and t.get("a") == 3
    t.purge(15.0)
    assert len(t) == 0


def test_popping_the_oldest_entry_leaves_the_rest_on_their_own_expiry() -> None:
    t = Tombstones(10.0)
    t.put("a", 1, 0.0)
    t.put("b", 2, 3.0)
    t.pop("a")
    t.purge(10.0)  # a's old expiry: nothing of b's is due
    assert _keys(t) == ["b"]
    t.purge(13.0)
    assert len(t) == 0
    t.put("c", 4, 20.0)  # after emptying, a new entry expires on its own clock
    t.purge(29.0)
    assert _keys(t) == ["c"]
    t.purge(30.0)
    assert len(t) == 0


def test_a_full_table_drops_its_oldest_entry_and_counts_it() -> None:
    dropped: list[int] = []
    budget = TombstoneBudget(100, lambda: dropped.append(1))
    t = Tombstones(10.0, cap=2, budget=budget)
    for i, key in enumerate("abc"):
        t.put(key, i, float(i))
    assert _keys(t) == ["b", "c"] and budget.held == 2 and budget.early_drops == 1 == len(dropped)
    t.put("c", 9, 3.0)  # a rewrite takes no room
    assert _keys(t) == ["b", "c"] and budget.early_drops == 1


def test_the_node_budget_is_shared_and_each_table_gives_up_its_own_oldest() -> None:
    budget = TombstoneBudget(3)
    first, second = Tombstones(10.0, budget=budget), Tombstones(10.0, budget=budget)
    first.put("a", 0, 0.0)
    first.put("b", 0, 1.0)
    second.put("x", 0, 2.0)
    second.put("y", 0, 3.0)  # over the budget: second's own oldest goes
    assert _keys(first) == ["a", "b"] and _keys(second) == ["y"] and budget.held == 3
    first.purge(11.5)  # expiry, pop and clear give the budget back
    second.pop("y")
    assert budget.held == 0 and budget.early_drops == 1
    second.put("z", 0, 20.0)
    second.clear()
    assert len(second) == 0 and budget.held == 0
