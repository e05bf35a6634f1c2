"""A call hook's view of a tracer: each call's records, once."""

from __future__ import annotations

from p2pfsm.fsm import TraceCursor, Tracer


def test_each_take_returns_the_records_since_the_last_and_skip_passes_over_them() -> None:
    tracer = Tracer()
    tracer.record("m", "i", "before", "a", "a")
    cursor = TraceCursor(tracer)  # what was recorded before it is not a call's
    assert cursor.take() == []
    tracer.record("m", "i", "t1", "a", "b")
    tracer.record("m", "i", "t2", "b", "c")
    assert [r.trigger for r in cursor.take()] == ["t1", "t2"]
    tracer.record("m", "i", "raised", "c", "c")
    cursor.skip()
    tracer.record("m", "i", "t3", "c", "d")
    assert [r.trigger for r in cursor.take()] == ["t3"] and cursor.take() == []
