"""Replies and results no child machine owns are still actions of declared transitions.

An abort_fetch for a round we do not hold, a fetch for a lookup round whose pins
expired, the terminal fetch that closes a lookup round no fetch took when the host
finishes its request, and a host fetch, lookup or supply on a session that is over are answered by
the session machine (``models/session.toml``): its table lists each, and the session
takes that transition (the tracer records it) when it sends the reply or reports the
result. Hits for a round that takes no more pins are refused by the served lookup's
own ``host_answer`` (``models/server_lookup.toml``).
"""

from __future__ import annotations

import pytest
from helpers.world import (
    PEER_ID,
    Driver,
    World,
    key,
    keys,
    peer_connect,
    ready_driver,
    ready_world,
)

from p2pfsm.fsm import Tracer, TraceRecord, machine
from p2pfsm.protocol import (
    AbortAck,
    AbortFetch,
    ConnectAck,
    Disconnect,
    Fetch,
    Lookup,
    Message,
    TransferDone,
)
from p2pfsm.session import (
    FailReason,
    HostClose,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    Input,
    LoadResult,
    LookupResult,
    Output,
    RegistrationFinished,
    SendFrame,
    StoreResult,
    TransportLost,
)

OVER = ("dead", "ended", "closed")
LIVE = ("connecting", "registering", "registering_acked", "awaiting_ack", "ready")

ANSWERS = {
    "recv_unknown_abort": (("ready",), ("ack_unknown_abort",)),
    "recv_expired_fetch": (("ready",), ("fail_expired_fetch",)),
    "finish_lookup_round": (LIVE, ("send_terminal_fetch",)),
    "host_fetch_over": (OVER, ("fail_fetch_over",)),
    "host_lookup_over": (OVER, ("fail_lookup_over",)),
    "host_supply_over": (OVER, ("fail_supply_over",)),
}
"""Trigger -> (source states, actions) of each answer the session machine declares."""


def test_the_session_table_declares_each_answer() -> None:
    spec = machine("session")
    for trigger, (sources, actions) in ANSWERS.items():
        rows = [t for t in spec.transitions if t.trigger == trigger]
        assert len(rows) == 1, trigger
        assert set(rows[0].sources) == set(sources), trigger
        assert rows[0].actions == actions and rows[0].dest is None, trigger


def test_the_served_lookup_declares_refused_pins() -> None:
    rows = [t for t in machine("server_lookup").transitions if t.trigger == "host_answer"]
    refused = [t for t in rows if "is_pinning_refused" in t.guards]
    assert [t.actions for t in refused] == [("refuse_pins", "record_answers")]
    assert all("is_pinning_refused" in t.unless for t in rows if t not in refused)


def test_hits_for_a_round_that_takes_no_pins_are_refused_by_the_lookup() -> None:
    tracer = Tracer()
    w = World(auto_answer=False, tracer=tracer)
    w.handshake()
    w.lookup("a", "r1", [8])
    w.deliver("a")
    (request,) = w.held["b"]
    w.load("a", "r1", [8])
    w.deliver("a")  # the round serves its fetch now: it takes no pins
    mark = len(tracer.records)
    job = w.answer("b", request.token, hit_ids=[8])
    assert job is not None
    assert w.hosts["b"].store_results[job] == StoreResult(job, False, FailReason.NOT_SERVED)
    first = tracer.records[mark]
    assert (first.machine, first.trigger, first.source, first.dest) == (
        "server_lookup", "host_answer", "resolving", "resolving")


def _session_steps(tracer: Tracer, mark: int) -> list[tuple[str, str, str]]:
    records: list[TraceRecord] = tracer.records[mark:]
    return [(r.trigger, r.source, r.dest) for r in records if r.machine == "session"]


def test_an_abort_for_no_round_of_ours_is_acked_by_the_session_machine() -> None:
    d = ready_driver()
    d.s.tracer = tracer = Tracer()
    out = d.recv(AbortFetch("r9", 3))
    assert out == [SendFrame(AbortAck("r9", 3))]
    assert _session_steps(tracer, 0) == [("recv_request", "ready", "ready"),
                                         ("recv_unknown_abort", "ready", "ready")]


def test_a_fetch_for_expired_lookup_pins_fails_by_the_session_machine() -> None:
    tracer = Tracer()
    w: World = ready_world(tracer=tracer)
    w.lookup("a", "r1", [8])
    w.stabilize()
    w.fire_next("b", "store")  # the pins of round 0 expire before its fetch
    w.load("a", "r1", [8])
    mark = len(tracer.records)
    w.deliver("a")
    assert w.wire("b") == [TransferDone("r1", False, 0)]
    steps = [(r.machine, r.trigger) for r in tracer.records[mark:]]
    assert steps == [("session", "recv_request"), ("session", "recv_expired_fetch")]


def test_a_finish_closes_an_unfetched_lookup_round_by_the_session_machine() -> None:
    tracer = Tracer()
    w = ready_world(tracer=tracer)
    w.lookup("a", "r1", [8])
    w.deliver("a")
    mark = len(tracer.records)
    w.finish("a", "r1")
    assert w.wire("a") == [Fetch("r1", (), (), 0)]
    assert ("session", "finish_lookup_round", "ready", "ready") in {
        (r.machine, r.trigger, r.source, r.dest) for r in tracer.records[mark:]}


HANDSHAKE: list[Input | Message] = [peer_connect(), RegistrationFinished(True),
                                     ConnectAck(PEER_ID)]
BEFORE_READY = {  # each state before ready, and the handshake steps that lead there
    "connecting": [],
    "registering": [peer_connect()],
    "registering_acked": [peer_connect(), ConnectAck(PEER_ID)],
    "awaiting_ack": [peer_connect(), RegistrationFinished(True)],
}


def _step(d: Driver, step: Input | Message) -> list[Output]:
    return d(step) if isinstance(step, RegistrationFinished) else d.recv(step)


@pytest.mark.parametrize("state", BEFORE_READY)
def test_a_finish_before_ready_queues_that_terminal_fetch(state: str) -> None:
    """BEYOND_GATE (p2pfsm/tools/verify/unreachable.py): the gate finishes no request before
    the handshake completes."""
    d = Driver()
    d(HostStart())
    d(HostLookup("r1", keys([8])))
    for step in BEFORE_READY[state]:
        _step(d, step)
    assert d.s.state == state
    d.s.tracer = tracer = Tracer()
    out = d(HostFinish("r1"))
    assert not [o for o in out if isinstance(o, SendFrame)]  # queued until ready
    assert _session_steps(tracer, 0) == [("finish_lookup_round", state, state)]
    for step in HANDSHAKE:
        if not d.s.ready:
            out = _step(d, step) if step not in BEFORE_READY[state] else []
    assert d.s.ready
    assert [o.message for o in out if isinstance(o, SendFrame)][-2:] == [
        Lookup("r1", keys([8]), 0), Fetch("r1", (), (), 0)]


def _over(how: str) -> tuple[Driver, Tracer]:
    d = ready_driver()
    if how == "dead":
        d(TransportLost("cut"))
    elif how == "ended":
        d.recv(Disconnect())
    else:
        d(HostClose())
    assert d.s.state == how
    d.s.tracer = tracer = Tracer()
    return d, tracer


CALLS: list[tuple[str, Input, Output]] = [
    ("host_fetch_over", HostFetch(1, "r1", keys([8]), (3,)),
     LoadResult(1, "r1", False, True, FailReason.SESSION_ENDED)),
    ("host_lookup_over", HostLookup("r1", keys([8, 9])),
     LookupResult("r1", keys([8, 9]), (False, False), False, FailReason.SESSION_ENDED)),
    ("host_supply_over", HostSupply(2, "r1", (key(8),), (4,)),
     StoreResult(2, False, FailReason.SESSION_ENDED)),
]


@pytest.mark.parametrize("how", OVER)
@pytest.mark.parametrize(("trigger", "call", "result"), CALLS, ids=[c[0] for c in CALLS])
def test_a_host_call_on_a_session_that_is_over_fails_by_the_session_machine(
        how: str, trigger: str, call: Input, result: Output) -> None:
    d, tracer = _over(how)
    out = d(call)
    assert out == [result]
    assert getattr(out[0], "reason", None) is FailReason.SESSION_ENDED
    assert _session_steps(tracer, 0) == [(trigger, how, how)]
