"""What a conformance tester's session outputs do: its :class:`Executor` effects.

The tester (:class:`~p2pfsm.tools.conform.tester.Tester`) feeds its one session through a
:class:`~p2pfsm.executor.runtime.driver.Driver`, as a node does; these are the effects the driver
hands each output to. They send on the tester's sockets, write with its NIXL agent,
answer the target's fetches and lookups as the case set the tester up to, and collect
results, violations and the session's death for the case to judge.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from p2pfsm.errors import TransportError
from p2pfsm.executor.runtime.effects import Executor
from p2pfsm.protocol import AbortAck
from p2pfsm.session import (
    CancelWrite,
    FetchArrived,
    FrameIgnored,
    LoadResult,
    LookupRequest,
    LookupResult,
    ProtocolViolation,
    RoundEnded,
    SendFrame,
    SessionDead,
    StartRegistration,
    StartWrite,
    StoreResult,
    WriteFinished,
)
from p2pfsm.tools.conform.describe import describe

if TYPE_CHECKING:
    from p2pfsm.tools.conform.tester import Tester


class TesterEffects(Executor):
    """Carries out the tester's session outputs on the tester (``peer`` is the target)."""

    __slots__ = ("t",)

    def __init__(self, tester: Tester) -> None:
        self.t = tester

    def send_frame(self, peer: str, out: SendFrame) -> None:
        t = self.t
        if t.hold_abort_acks and isinstance(out.message, AbortAck):
            t.held_acks.append(out.message)
            return
        t.send(out.message, off_script=False)
        if t.on_sent is not None:
            t.on_sent(out.message)

    def start_registration(self, peer: str, out: StartRegistration) -> None:
        t = self.t
        if t.ack_delay > 0:
            t._pending_reg = (time.monotonic() + t.ack_delay, out.connect)
        else:
            t.feed(t._register(out.connect))

    def fetch_arrived(self, peer: str, out: FetchArrived) -> None:
        t = self.t
        t.arrived.append(out)
        t.answer_fetch(out)

    def lookup_request(self, peer: str, out: LookupRequest) -> None:
        t = self.t
        t.asked.append(out)
        now: tuple[bytes, ...] = out.keys
        later: tuple[bytes, ...] = ()
        if t.split_lookups:
            now, later = out.keys[:len(out.keys) // 2], out.keys[len(out.keys) // 2:]
            t._parked.append((out.token, later))
        t._answer_lookup(out.token, now, frozenset(later))

    def round_ended(self, peer: str, out: RoundEnded) -> None:
        t = self.t
        t.ended.append(out)

    def start_write(self, peer: str, out: StartWrite) -> None:
        t = self.t
        t._write_ids += 1
        try:
            t.data.write(t._write_ids, t.peer, out.local_indexes,
                            out.remote_indexes)
        except TransportError:
            t.feed(WriteFinished(out.xfer, False))
        else:
            t._writes[t._write_ids] = out.xfer

    def cancel_write(self, peer: str, out: CancelWrite) -> None:
        t = self.t
        for wid, xfer in list(t._writes.items()):
            if xfer == out.xfer and t.data.cancel(wid):
                del t._writes[wid]
                t.feed(WriteFinished(xfer, False))

    def load_result(self, peer: str, out: LoadResult) -> None:
        t = self.t
        t.loads.append(out)

    def store_result(self, peer: str, out: StoreResult) -> None:
        """Our supply's end: the cases judge the consumer by its own results."""

    def lookup_result(self, peer: str, out: LookupResult) -> None:
        t = self.t
        t.lookups.append(out)

    def protocol_violation(self, peer: str, out: ProtocolViolation) -> None:
        t = self.t
        if t._excuse():
            return
        what = describe(t._last_in) if t._last_in is not None else "a frame"
        t.violations.append(
            f"{what} rejected in session state {t.session.state!r}: {out.error}")

    def frame_ignored(self, peer: str, out: FrameIgnored) -> None:
        t = self.t
        t.ignored.append(f"{out.message_type}: {out.reason}")

    def session_dead(self, peer: str, out: SessionDead) -> None:
        t = self.t
        t.dead = out
