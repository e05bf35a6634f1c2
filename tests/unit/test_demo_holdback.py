"""The demo server's late blocks (``p2pfsm serve --hold-back``): which keys of a request
are late, and the calls that wait for them."""

from __future__ import annotations

from p2pfsm.demo_blocks import demo_key
from p2pfsm.tools.demo.holdback import MAX_REQUESTS, HoldBack

KEYS = [demo_key(b) for b in range(6)]


def test_held_back_keys_are_late_until_due() -> None:
    hold = HoldBack([4, 5], late_after=3600.0)
    assert hold.late("p", "r", KEYS) == KEYS[4:]
    assert hold.late("p", "r", KEYS[:4]) == []
    ran: list[str] = []
    hold.later("p", "r", lambda: ran.append("r"))
    hold.run_due()
    assert ran == []
    assert hold.next_due() == hold.due("p", "r")


def test_due_calls_run_once_in_order() -> None:
    hold = HoldBack([4], late_after=0.0)  # stored as soon as the request is seen
    assert hold.late("p", "r", KEYS) == []
    ran: list[str] = []
    hold.later("p", "a", lambda: ran.append("a"))
    hold.later("p", "b", lambda: ran.append("b"))
    hold.run_due()
    hold.run_due()
    assert ran == ["a", "b"]
    assert hold.next_due() is None


def test_remembered_requests_are_bounded() -> None:
    hold = HoldBack([1], late_after=3600.0)
    for i in range(MAX_REQUESTS + 5):
        hold.due("p", f"r{i}")
    assert len(hold._due) == MAX_REQUESTS
