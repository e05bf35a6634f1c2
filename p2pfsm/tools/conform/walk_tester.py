"""The walk's tester: a :class:`~p2pfsm.tools.conform.tester.Tester` that records every call of
its session (for the counterexample and the spec trace) and injects the walk's faults on
its own side of the wire.

Faults, each bounded in time by its caller:

- **delay** (:meth:`WalkTester.hold_sends`): our frames are held back, in order, while
  we keep reading; the target's frames and ours cross in flight (the one reordering
  ZeroMQ allows: each direction keeps its order, the two directions do not wait for
  each other).
- **reorder** (:attr:`~p2pfsm.tools.conform.tester.Tester.nixl_stalled_until`): we keep
  reading control frames but do not progress our NIXL agent, the passive side of the
  target's WRITEs; a target that sends ``transfer_done`` before its WRITE completed
  shows it as bytes missing at a successful load.
- **pause** (:meth:`WalkTester.pause`): we do nothing at all (no reading, no NIXL
  progress, no timers) for a while, as a peer whose process stalls; the target's
  deadlines fire meanwhile.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from p2pfsm.errors import LocalProtocolError, MalformedFrame
from p2pfsm.fsm import TraceCursor, Tracer, TraceRecord
from p2pfsm.protocol import Message, decode
from p2pfsm.session import FrameReceived, Input, Output, SendFrame, Timeouts, TimerFired
from p2pfsm.spec_calls import Step, call_action, steps_of
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.tester import Tester, describe

__all__ = ["Call", "WalkTester", "describe_input", "step_seconds"]

PAUSE_LIMIT_S = 5.0
"""No pause lasts longer, whatever a step asks."""


@dataclass(frozen=True, slots=True)
class Call:
    """One call of our session during walk step ``step``: the input, the session state
    before and after, the machine steps it fired, the frames it sent, and the spec
    action it is (None: the spec takes no step)."""

    step: int
    at: float
    input: str
    before: str
    after: str
    records: tuple[TraceRecord, ...]
    sent: tuple[str, ...]
    action: str | None
    steps: frozenset[Step]


def describe_input(event: Input) -> str:
    """An input of our session in one line: a frame in the protocol's words, a timer by
    its kind, a host call by its name and short fields."""
    if isinstance(event, FrameReceived):
        try:
            msg: Message | None = decode(event.frame)
        except MalformedFrame as exc:
            return f"received <malformed: {exc}>"
        return f"received {describe(msg)}" if msg is not None else "received <unknown type>"
    if isinstance(event, TimerFired):
        return f"timer {event.timer.kind} fired"
    parts = []
    if is_dataclass(event):
        for f in fields(event):
            value = getattr(event, f.name)
            if isinstance(value, bool | int | str) and f.name != "now":
                parts.append(f"{f.name}={value!r}")
            elif isinstance(value, tuple) and f.name in ("keys", "block_indexes"):
                parts.append(f"{len(value)} {f.name}")
    return f"host {type(event).__name__}({', '.join(parts)})"


def step_seconds(step: dict[str, Any]) -> float:
    """A walk step's ``ms``, in seconds, bounded to 0..5 s."""
    return max(0, min(int(step.get("ms", 0)), 5000)) / 1000


class WalkTester(Tester):
    """A tester whose session calls are recorded and whose side of the wire can fault."""

    def __init__(self, target: Target, *, bind: str = "127.0.0.1:0",
                 incarnation: int | None = None, timeouts: Timeouts | None = None,
                 lookups_in_parts: bool = False) -> None:
        super().__init__(target, bind=bind, incarnation=incarnation, timeouts=timeouts,
                         lookups_in_parts=lookups_in_parts)
        self.tracer = Tracer()
        self.session.tracer = self.tracer
        self._records = TraceCursor(self.tracer)  # each call's records
        self._driver.hook = self
        self.calls: list[Call] = []
        self.step_no = 0
        self.hold_until = 0.0
        self._outbox: list[tuple[Message | None, bytes, str, bool]] = []
        self.park_lookups = False
        """Keep the target's lookups unanswered (in :attr:`parked_lookups`) until the
        walk answers them with :meth:`answer_lookup` (the consumer walk)."""
        self.parked_lookups: list[tuple[int, tuple[bytes, ...]]] = []

    def record(self, peer_id: str, state_before: str, event: Input, started_ns: int,
               outputs: Sequence[Output]) -> None:
        """The driver's call hook: every call of our session, as the walk's log."""
        records = tuple(self._records.take())
        sent = tuple(describe(o.message) for o in outputs if isinstance(o, SendFrame))
        self.calls.append(Call(self.step_no, self.session.now, describe_input(event),
                               state_before, self.session.state, records, sent,
                               call_action(state_before, event, records), steps_of(records)))

    def discard(self) -> None:
        """A call raised (it changed nothing): its records are not the next call's."""
        self._records.skip()

    def enables(self, event: Input) -> bool:
        """Whether our session's machines take ``event`` now (tried on a copy)."""
        s = self.session
        tracer, s.tracer = s.tracer, None
        try:
            probe = copy.deepcopy(s)
        finally:
            s.tracer = tracer
        try:
            probe.handle(event, time.monotonic())
        except LocalProtocolError:
            return False
        return True

    def _answer_lookup(self, token: int, keys: Sequence[bytes],
                       pending: frozenset[bytes] = frozenset()) -> None:
        if self.park_lookups:
            self.parked_lookups.append((token, (*keys, *pending)))
            return
        super()._answer_lookup(token, keys, pending)

    def answer_lookup(self, token: int, keys: Sequence[bytes],
                      pending: frozenset[bytes] = frozenset()) -> None:
        """Answer ``keys`` of the lookup ``token`` (what we hold: hits), ``pending``
        answered later."""
        super()._answer_lookup(token, keys, pending)

    # -- faults ---------------------------------------------------------------------

    def hold_sends(self, seconds: float) -> None:
        """Hold our frames for ``seconds`` (sent in order once due, by :meth:`pump`)."""
        self.hold_until = max(self.hold_until, time.monotonic() + min(seconds, PAUSE_LIMIT_S))

    def stall_nixl(self, seconds: float) -> None:
        """No NIXL progress on our side for ``seconds``."""
        self.nixl_stalled_until = max(self.nixl_stalled_until,
                                      time.monotonic() + min(seconds, PAUSE_LIMIT_S))

    def pause(self, seconds: float) -> None:
        """Do nothing for ``seconds`` (a stalled peer: the fault itself, not a wait for
        anything)."""
        time.sleep(min(max(seconds, 0.0), PAUSE_LIMIT_S))

    def send(self, msg: Message, *, off_script: bool = True) -> None:
        if self._outbox or time.monotonic() < self.hold_until:
            self._outbox.append((msg, b"", "", off_script))
            return
        super().send(msg, off_script=off_script)

    def send_raw(self, frame: bytes, text: str) -> None:
        if self._outbox or time.monotonic() < self.hold_until:
            self._outbox.append((None, frame, text, True))
            return
        super().send_raw(frame, text)

    def release(self) -> None:
        """Send the held frames, in order, once their hold is over."""
        if not self._outbox or time.monotonic() < self.hold_until:
            return
        held, self._outbox = self._outbox, []
        for msg, frame, text, off_script in held:
            if msg is not None:
                Tester.send(self, msg, off_script=off_script)
            else:
                Tester.send_raw(self, frame, text)

    @property
    def holding(self) -> bool:
        return bool(self._outbox)

    def pump(self, seconds: float) -> None:
        self.release()
        super().pump(seconds)
        self.release()
