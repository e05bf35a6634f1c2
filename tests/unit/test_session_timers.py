"""A session owns its timers: the table, its order, and what executors ask of it."""

from __future__ import annotations

import pytest
from helpers.world import Driver

from p2pfsm.session import HostStart, TimerId
from p2pfsm.session.timers import TimerTable
from p2pfsm.sim.world import SimWorld


def test_timer_table_orders_by_deadline_then_name_and_forgets_rearmed_entries() -> None:
    timers: TimerTable[tuple[str, int]] = TimerTable()
    timers.arm(("load", 2), 5.0)
    timers.arm(("abort", 1), 5.0)
    timers.arm(("load", 3), 1.0)
    timers.arm(("load", 3), 7.0)  # re-armed: the 1.0 entry is stale
    assert timers.earliest() == (5.0, ("abort", 1))
    assert dict(timers) == {("load", 2): 5.0, ("abort", 1): 5.0, ("load", 3): 7.0}
    assert timers.due(6.0) == [("abort", 1), ("load", 2)]  # due() disarms nothing
    assert timers.disarm(("abort", 1)) == 5.0 and timers.disarm(("abort", 1)) is None
    assert timers.due(6.0) == [("load", 2)] and timers.pop(("load", 2)) == 5.0
    assert timers == {("load", 3): 7.0} and timers.due(6.9) == []
    assert timers.pop(("load", 3)) == 7.0
    with pytest.raises(KeyError):
        timers.pop(("load", 3))
    assert timers.earliest() is None and len(timers) == 0


def test_timer_table_ties_go_by_name_whatever_the_arming_order() -> None:
    names = [("t", 9), ("t", 10), ("a", 1), ("t", 1)]
    for order in (names, names[::-1]):
        timers: TimerTable[tuple[str, int]] = TimerTable()
        for key in order:
            timers.arm(key, 3.0)
        timers.arm(("t", 9), 3.0)  # the same deadline again: two live entries, one timer
        assert timers.due(3.0) == sorted(names, key=str)
        popped = []
        for _ in names:  # earliest first, each popped: the same order
            nxt = timers.earliest()
            assert nxt is not None and timers.pop(nxt[1]) == 3.0
            popped.append(nxt[1])
        assert popped == sorted(names, key=str) and timers.earliest() is None


def test_timer_table_heap_stays_bounded_by_the_armed_timers() -> None:
    timers: TimerTable[str] = TimerTable()
    for i in range(10_000):  # one timer re-armed over and over (a keep-alive)
        timers.arm("idle", float(i))
    assert len(timers) == 1 and len(timers._heap) <= 2 * 1 + 17
    assert timers.earliest() == (9999.0, "idle")


def test_a_session_says_when_it_next_needs_the_clock_and_which_timers_are_due() -> None:
    d = Driver()
    assert d.s.next_deadline() is None and d.s.due_timers(1e9) == []
    out = d(HostStart())
    assert not [o for o in out if "Timer" in type(o).__name__]  # timers are not outputs
    (timer, deadline), = d.timers.items()
    assert timer == TimerId("handshake")
    assert d.s.next_deadline() == deadline == d.s.next_timer()[0]  # type: ignore[index]
    assert d.s.due_timers(deadline - 0.001) == [] and d.s.due_timers(deadline) == [timer]
    d.fire(timer)
    assert timer not in d.timers


def test_the_simulated_world_reads_the_sessions_own_timers() -> None:
    w = SimWorld(0)
    w.start()
    for n in w.NODES:
        assert w.timers[n] == w.sessions[n].view.timers
        assert w.timers[n] and all(t[0] == "handshake" for t in w.timers[n])
    with pytest.raises(TypeError):
        w.timers["a"][TimerId("handshake")] = 0.0  # type: ignore[index]
