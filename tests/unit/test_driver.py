"""The one driver: inputs an output causes are queued, not recursed into; outputs are
carried out in order with the right session applying; deferred calls run from the
outermost drain only; the call hook hears every call; post drains unless one runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from p2pfsm.errors import LocalProtocolError
from p2pfsm.executor.runtime.driver import Driver
from p2pfsm.executor.runtime.effects import Executor
from p2pfsm.protocol import Disconnect
from p2pfsm.session import (
    FrameIgnored,
    HostClose,
    HostStart,
    Input,
    Output,
    SendFrame,
    TimerFired,
    TimerId,
    TransportLost,
)

STALE = FrameIgnored("fetch", "stale")


class FakeSession:
    """Answers each input with the outputs a script gives it; records what it got."""

    def __init__(self, name: str, script: dict[type, list[Any]]) -> None:
        self.name = name
        self.script = script
        self.got: list[tuple[Input, float]] = []
        self.ready = False
        self.alive = True
        self.state = "idle"

    def next_deadline(self) -> float | None:
        return None

    def handle(self, event: Input, now: float) -> list[Output]:
        if isinstance(event, HostClose) and "refuse" in self.script.get(HostClose, []):
            raise LocalProtocolError("refused")
        self.got.append((event, now))
        if isinstance(event, HostStart):
            self.ready = True
        if isinstance(event, TransportLost):
            self.alive = False
        return list(self.script.get(type(event), []))


class Effects(Executor):
    """Records each effect with the session applying it; a send queues a loss."""

    def __init__(self) -> None:
        self.driver: Driver
        self.log: list[tuple[str, str, Any]] = []

    def send_frame(self, peer: str, out: SendFrame) -> None:
        applying = self.driver.applying
        self.log.append(("send", peer, getattr(applying, "name", None)))
        self.driver.queue(peer, TransportLost("send failed"), applying)

    def frame_ignored(self, peer: str, out: FrameIgnored) -> None:
        self.log.append(("ignored", peer, getattr(self.driver.applying, "name", None)))
        self.driver.defer(lambda: self.log.append(("deferred", peer, self.driver.draining)))

    def session_ready(self, peer: str, session: Any) -> None:
        self.log.append(("ready", peer, session.name))

    def session_over(self, peer: str, session: Any) -> None:
        self.log.append(("over", peer, session.name))


class Hook:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.outputs: list[list[Output]] = []
        self.discarded = 0

    def record(self, peer_id: str, state_before: str, event: Input, started_ns: int,
               outputs: Sequence[Output]) -> None:
        self.calls.append((peer_id, state_before, type(event).__name__))
        self.outputs.append(list(outputs))

    def discard(self) -> None:
        self.discarded += 1


def _driver(hook: Hook | None = None) -> tuple[Driver, Effects]:
    effects = Effects()
    effects.driver = Driver(effects, lambda: 7.0, hook)
    return effects.driver, effects


def test_an_input_an_output_causes_is_queued_and_handled_after_the_call() -> None:
    driver, effects = _driver()
    s: Any = FakeSession("s", {HostStart: [SendFrame(Disconnect()), STALE]})
    driver.feed("p", HostStart(), s)
    # Both outputs of the call first (applying: s), then ready; the loss waits in the queue.
    assert effects.log == [("send", "p", "s"), ("ignored", "p", "s"), ("ready", "p", "s")]
    assert [type(e) for e, _ in s.got] == [HostStart] and driver.busy
    assert driver.applying is None
    driver.drain()
    assert [type(e) for e, _ in s.got] == [HostStart, TransportLost]
    assert effects.log[3:] == [("over", "p", "s"), ("deferred", "p", True)]
    assert s.got[0][1] == 7.0 and not driver.busy


def test_deferred_calls_run_only_from_the_outermost_drain() -> None:
    driver, effects = _driver()
    s: Any = FakeSession("s", {TimerFired: [STALE]})
    inner: list[bool] = []

    def nested() -> None:
        driver.queue("p", TimerFired(TimerId("load", 1)), s)
        driver.drain()  # nested: handles the input, leaves the deferred call queued
        inner.append(driver.busy)

    driver.defer(nested)
    driver.drain()
    assert inner == [True]
    assert [x[0] for x in effects.log] == ["ignored", "deferred"]


def test_an_input_for_no_session_is_dropped() -> None:
    driver, effects = _driver()
    driver.queue("p", TimerFired(TimerId("load", 1)), None)
    driver.drain()
    assert effects.log == [] and not driver.busy


def test_the_hook_hears_each_call_and_forgets_one_that_raised() -> None:
    hook = Hook()
    driver, _ = _driver(hook)
    s: Any = FakeSession("s", {HostClose: ["refuse"], HostStart: [STALE]})
    driver.feed("p", HostStart(), s)
    with pytest.raises(LocalProtocolError):
        driver.feed("p", HostClose(), s)
    assert hook.calls == [("p", "idle", "HostStart")] and hook.discarded == 1
    assert hook.outputs == [[STALE]]  # the call's outputs, as the session returned them


def test_post_drains_unless_a_drain_runs_and_drops_the_queue_when_a_call_raises() -> None:
    driver, _ = _driver()
    s: Any = FakeSession("s", {HostClose: ["refuse"]})
    seen: list[int] = []

    def during() -> None:
        driver.post("p", HostStart(), s)  # a drain runs: only queued
        seen.append(len(s.got))

    driver.defer(during)
    driver.drain()
    assert seen == [0] and [type(e) for e, _ in s.got] == [HostStart]
    driver.queue("p", HostStart(), s)
    with pytest.raises(LocalProtocolError):
        driver.post("p", HostClose(), s)  # the queued HostStart goes first, then raises
    assert not driver.busy and [type(e) for e, _ in s.got] == [HostStart, HostStart]


# ------------------------------------------------------------- deadlines
class Quiet(Executor):
    """Carries out nothing (the sessions' outputs do not matter here)."""

    def apply(self, peer: str, out: Output) -> None:
        pass


def _real_driver() -> tuple[Driver, list[float]]:
    clock = [0.0]
    return Driver(Quiet(), lambda: clock[0]), clock


def test_the_driver_knows_each_sessions_next_deadline_from_the_session_itself() -> None:
    from helpers.world import local_config

    from p2pfsm.session import Session, Timeouts

    driver, clock = _real_driver()
    a = Session(local_config(timeouts=Timeouts(handshake=5.0)))
    b = Session(local_config(timeouts=Timeouts(handshake=3.0)))
    assert driver.next_deadline() is None
    driver.feed("a", HostStart(), a)
    assert driver.next_deadline() == 5.0 == a.next_deadline()
    clock[0] = 1.0
    driver.feed("b", HostStart(), b)
    assert driver.next_deadline() == 4.0  # b's, the earlier
    assert driver.queue_due(3.9) == 0 and not driver.busy
    assert driver.queue_due(4.0) == 1
    clock[0] = 4.0
    driver.drain()
    assert not b.alive and b.next_deadline() is None  # its handshake timed out
    assert driver.next_deadline() == 5.0  # a's is still armed
    driver.feed("a", HostClose(), a)  # the deadline went away: the entry is stale
    assert a.next_deadline() is None and driver.next_deadline() is None
    assert driver.queue_due(10.0) == 0


def test_a_timer_disarmed_before_its_turn_is_fed_but_fires_nothing() -> None:
    from helpers.world import local_config

    from p2pfsm.session import Session, Timeouts

    driver, clock = _real_driver()
    s = Session(local_config(timeouts=Timeouts(handshake=2.0)))
    driver.feed("a", HostStart(), s)
    clock[0] = 2.0
    assert driver.queue_due(2.0) == 1
    driver.feed("a", HostClose(), s)  # the handshake timer goes before its input is fed
    state = s.state
    driver.drain()  # TimerFired(handshake) is stale now
    assert s.state == state and s.next_deadline() is None
