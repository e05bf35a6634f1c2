"""The session drives its children in steps: fire, apply the outbox, retire, cascade."""

from __future__ import annotations

import pytest
from helpers.world import Driver, key, keys, local_config, ready_driver

from p2pfsm.fsm import Tracer
from p2pfsm.protocol import Fetch, Lookup, encode
from p2pfsm.session import (
    FrameReceived,
    HostAnswerLookup,
    HostFetch,
    HostSupply,
    LookupRequest,
    Session,
    StartWrite,
    WriteFinished,
)
from p2pfsm.session.server import ServerRound
from p2pfsm.session.server_part import ServerPart
from p2pfsm.session.steps import CascadeDiverged


def frame(msg: object) -> FrameReceived:
    return FrameReceived(encode(msg))  # type: ignore[arg-type]


def test_a_child_is_retired_exactly_when_its_machine_is_terminal() -> None:
    d = ready_driver()
    d(HostSupply(1, "r1", keys([3]), (3,)))
    assert d.s.open_counts()["server_round"] == 1
    out = d(frame(Fetch("r1", keys([3]), (7,), 0)))
    write = next(o for o in out if isinstance(o, StartWrite))
    assert d.s.open_counts()["server_round"] == 1  # serving: not terminal
    d(WriteFinished(write.xfer, True))
    assert d.s.open_counts()["server_round"] == 0  # settle took it to done: retired
    assert d.s.view.outbox == () and d.s.view.unsettled == ()


def test_a_nested_step_is_recorded_before_the_step_that_caused_it() -> None:
    """Lookup hits pinned into their round: the round's lookup_pin is applied from the
    lookup's outbox while its host_answer commits, so it is recorded first (as before)."""
    tracer = Tracer()
    d = Driver()
    d.s = Session(local_config(), tracer)
    d.handshake()
    req = next(o for o in d(frame(Lookup("r1", keys([2]), 1))) if isinstance(o, LookupRequest))
    before = len(tracer.records)
    d(HostAnswerLookup(req.token, {key(2): 2}, 5))
    steps = [(r.machine, r.trigger) for r in tracer.records[before:]]
    assert steps[:2] == [("server_round", "lookup_pin"), ("server_lookup", "host_answer")]
    assert ("server_lookup", "settle") in steps[2:]


def test_a_cascade_that_never_settles_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    d = ready_driver()
    d(HostSupply(1, "r1", keys([3]), (3,)))

    def again(self: ServerPart, item: ServerRound | str) -> None:  # keeps itself due
        self.unsettled.append(item)

    monkeypatch.setattr(ServerPart, "settle_one", again)
    monkeypatch.setattr("p2pfsm.session.steps.CASCADE_LIMIT", 50)
    with pytest.raises(CascadeDiverged, match="no fixed point after 50"):
        d(HostSupply(2, "r1", keys([4]), (4,)))


def test_a_child_holds_no_reference_to_the_session() -> None:
    d = ready_driver()
    d(HostFetch(9, "r2", keys([1]), (1,)))
    rnd = d.s.view.loads["r2"][0]
    assert all(getattr(rnd, n) is not d.s for n in type(rnd).__slots__)
    assert d.s.view.is_child_env(rnd.env)
