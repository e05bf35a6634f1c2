"""The drop-in's probe cache (p2pfsm.vllm.probes): what register_lookup answers."""

from __future__ import annotations

from p2pfsm.session import FailReason, LookupResult
from p2pfsm.vllm.probes import Probes


def test_keys_are_queued_once_and_answered_by_the_sessions_result() -> None:
    p = Probes()
    assert p.register("r1", b"a") is None and p.register("r1", b"b") is None
    assert p.register("r1", b"a") is None  # asked again: not queued again
    assert p.take_unsent() == [("r1", (b"a", b"b"))] and p.take_unsent() == []
    assert p.unanswered() == ["r1"]
    p.answer(LookupResult("r1", (b"a", b"b"), (True, False), True))
    assert (p.register("r1", b"a"), p.register("r1", b"b")) == (True, False)
    assert p.unanswered() == [] and p.take_unsent() == []


def test_a_session_end_leaves_unanswered_keys_unresolved_and_keeps_the_hits() -> None:
    p = Probes()
    for k in (b"a", b"b"):
        p.register("r1", k)
    p.take_unsent()
    p.answer(LookupResult("r1", (b"a", b"b"), (True, False), False, FailReason.SESSION_ENDED))
    assert (p.register("r1", b"a"), p.register("r1", b"b")) == (True, None)
    assert p.unanswered() == ["r1"]  # close() fails the request, as vLLM's does


def test_a_deadline_makes_unanswered_keys_misses_and_a_drop_forgets_the_request() -> None:
    p = Probes()
    p.register("r1", b"a")
    p.register("r2", b"c")
    p.answer(LookupResult("r1", (b"a",), (False,), False, FailReason.TIMEOUT))
    assert p.register("r1", b"a") is False
    p.drop("r2")
    assert p.unanswered() == [] and p.take_unsent() == [("r1", (b"a",))]
    p.answer(LookupResult("r2", (b"c",), (True,), True))  # nobody asks any more
    assert p.register("r2", b"c") is None  # a new probe of a fresh request
