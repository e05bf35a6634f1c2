"""The tester peer: real ZeroMQ and NIXL, with p2pfsm's own session as the oracle.

A :class:`Tester` binds a :class:`~p2pfsm.executor.zmq.plane.ControlPlane` on loopback
(a ROUTER in, a DEALER to the target, the protocol's socket pattern) and registers a
host region with a :class:`~p2pfsm.executor.nixl.plane.DataPlane` (a real NIXL agent).
Its side of the conversation is a :class:`~p2pfsm.session.Session`: the consumer's
against a producer target (it dials the target), the producer's against a consumer
target (``Target.addr`` empty: it waits for the target to connect, learns its identity
from its first frame, and serves its fetches with real WRITEs). Every frame the target
sends is fed to it, and a frame the session rejects (a
:class:`~p2pfsm.session.ProtocolViolation`: no declared transition accepts it, or it
is malformed) is recorded as a violation of the models. Cases may also send frames
the session would never send (:meth:`Tester.send`, :meth:`Tester.send_raw`), to see
what the target does with them. Every wait is bounded by a deadline and pumps the
sockets and NIXL's progress; nothing sleeps.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import torch

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import MalformedFrame, TransportError
from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.executor.runtime.driver import Driver
from p2pfsm.executor.zmq.plane import ControlPlane, FrameIn, PeerLost
from p2pfsm.protocol import AbortAck, AbortFetch, Connect, Message, decode, encode
from p2pfsm.session import (
    FetchArrived,
    FrameReceived,
    HostAnswerLookup,
    HostClose,
    HostDecline,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    Input,
    LoadResult,
    LookupRequest,
    LookupResult,
    RegistrationFinished,
    RoundEnded,
    Session,
    SessionConfig,
    SessionDead,
    Timeouts,
    TransportLost,
    WriteFinished,
)
from p2pfsm.tools.conform.describe import describe
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.tester_effects import TesterEffects
from p2pfsm.tools.conform.verdict import CaseFailure

__all__ = ["Frame", "Tester", "describe"]

NUM_BLOCKS: Final = 64
"""Blocks in the tester's registered region."""
_TICK_S: Final = 0.002  # longest single wait of a pump: NIXL needs progress while written


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame on the wire, as the tester saw it: ``at`` seconds after the tester
    started, ``sent`` by the tester or received, and decoded (None: malformed)."""

    at: float
    sent: bool
    message: Message | None
    text: str


PEER = "target"
"""The name our driver gives the one session (a tester has one peer: the target)."""


class Tester:
    """One tester identity against ``target``: its sockets, its memory, its session
    (fed through a :class:`~p2pfsm.executor.runtime.driver.Driver`; what its outputs do is
    :class:`~p2pfsm.tools.conform.tester_effects.TesterEffects`)."""

    def __init__(self, target: Target, *, timeouts: Timeouts | None = None,
                 bind: str = "127.0.0.1:0", incarnation: int | None = None,
                 lookups_in_parts: bool = False) -> None:
        self.target = target
        self.t0 = time.monotonic()
        self._closed = False
        self.control = ControlPlane(f"tcp://{bind}", connect_timeout_ms=int(
            target.deadline * 1000))
        try:
            self.data = DataPlane(f"p2pfsm-conform-{uuid.uuid4()}", NUM_BLOCKS,
                                  target.block_len)
        except BaseException:
            self.control.close()
            raise
        self.local_id = self.control.local_id
        self.peer = target.addr  # "": a consumer target, known once its first frame comes
        t = target.deadline
        self.session = Session(SessionConfig(
            self.local_id, self.data.metadata, self.data.base_addr, NUM_BLOCKS,
            target.block_len, hash_seed=target.hash_seed,
            config_fingerprint=target.fingerprint, expected_peer_id=target.addr or None,
            timeouts=timeouts or Timeouts(handshake=t, load=t, abort_ack=t, lookup=t),
            incarnation=incarnation, answer_lookups_in_parts=lookups_in_parts))
        self._driver = Driver(TesterEffects(self), time.monotonic)
        self.frames: list[Frame] = []
        self.violations: list[str] = []
        self.ignored: list[str] = []
        self.loads: list[LoadResult] = []
        self.lookups: list[LookupResult] = []
        self.dead: SessionDead | None = None
        self.lost: list[str] = []
        self.other_ids: list[str] = []
        self._dialled = False
        self._started = False
        self._held: list[bytes] = []  # frames that came before our session started
        self._excused: list[tuple[str, int]] = []  # our off-script aborts not yet acked
        self._last_in: Message | None = None  # the frame the session is handling
        self._job = 0
        # Producer side (a consumer target): what we hold, how we answer, what came.
        self.held = {demo_key(b): b for b in range(min(target.blocks, NUM_BLOCKS))}
        self.serve = "supply"
        """A fetch is answered with: "supply" (what we hold; the rest declined),
        "decline" (transfer_done(false)) or "silent" (never)."""
        self.arrived: list[FetchArrived] = []
        self.asked: list[LookupRequest] = []
        self.ended: list[RoundEnded] = []
        self.ack_delay = 0.0  # seconds our registration (so our connect_ack) waits
        self.split_lookups = False  # answer half a lookup now, the rest on answer_parked()
        self._parked: list[tuple[int, tuple[bytes, ...]]] = []
        self.hold_abort_acks = False  # keep our abort_acks until release_abort_acks()
        self.held_acks: list[Message] = []
        self.on_sent: Callable[[Message], None] | None = None  # hears our session's frames
        self.connect_first = False  # a consumer target: drop its frames until a connect
        self.dropped: list[str] = []
        self._pending_reg: tuple[float, Connect] | None = None
        self._writes: dict[int, int] = {}  # our WRITE id -> the session's xfer
        self._write_ids = 0
        self.nixl_stalled_until = 0.0  # a fault: no NIXL progress before this monotonic time
        if not target.addr:
            region = self.data.region
            assert region is not None
            for b in self.held.values():
                region[b].copy_(torch.frombuffer(bytearray(demo_block(b, target.block_len)),
                                                 dtype=region.dtype))

    # -- wire ---------------------------------------------------------------------

    def dial(self) -> None:
        """Open our DEALER to the target (once)."""
        if not self._dialled and self.target.addr:
            try:
                self.control.connect(self.peer)
            except TransportError as exc:
                raise CaseFailure("a target to dial", f"cannot dial {self.peer}: "
                                  f"{exc}") from None
            self._dialled = True

    def send_raw(self, frame: bytes, text: str) -> None:
        """Send bytes the session knows nothing of (a deviant frame)."""
        self.dial()
        self.frames.append(Frame(self.now(), True, None, text))
        self.control.send(self.peer, frame)

    def send(self, msg: Message, *, off_script: bool = True) -> None:
        """Send a well-formed frame (behind the session's back unless the session sent
        it). The target's abort_ack for an abort_fetch sent so is excused once: our
        session, which did not abort, would reject it as unsolicited."""
        self.dial()
        if off_script and isinstance(msg, AbortFetch):
            self._excused.append((msg.kv_request_id, msg.round_seq))
        self.frames.append(Frame(self.now(), True, msg, describe(msg)))
        self.control.send(self.peer, encode(msg))

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- the session --------------------------------------------------------------

    def feed(self, event: Input) -> None:
        """Hand one input to our session through the driver, which carries out what it
        asks for (an input one of its outputs causes waits for the outputs before it)."""
        self._driver.post(PEER, event, self.session)

    def answer_fetch(self, out: FetchArrived) -> None:
        """Answer a fetch of the target as :attr:`serve` says."""
        if self.serve == "silent":
            return
        missing = out.missing
        have = [k for k in missing if k in self.held]
        if self.serve == "decline" or len(have) < len(missing):
            self.feed(HostDecline(out.kv_request_id, out.round_seq))
        elif have:
            self.feed(HostSupply(self.next_job(), out.kv_request_id, tuple(have),
                                 tuple(self.held[k] for k in have)))

    def _answer_lookup(self, token: int, keys: Sequence[bytes],
                       pending: frozenset[bytes] = frozenset()) -> None:
        hits = {k: self.held[k] for k in keys if k in self.held}
        self.feed(HostAnswerLookup(token, hits, self.next_job() if hits else None, pending))

    def answer_parked(self) -> None:
        """Answer the keys :attr:`split_lookups` left pending."""
        parked, self._parked = self._parked, []
        for token, keys in parked:
            self._answer_lookup(token, keys)

    def release_abort_acks(self) -> None:
        """Send the abort_acks :attr:`hold_abort_acks` kept back."""
        held, self.held_acks = self.held_acks, []
        for msg in held:
            self.send(msg, off_script=False)

    def _excuse(self) -> bool:
        """Whether the frame just rejected answers an abort we sent off-script (and
        the session is ready, so its only fault is that our session did not ask)."""
        last = self._last_in
        if not isinstance(last, AbortAck) or not self.session.ready:
            return False
        key = (last.kv_request_id, last.round_seq)
        if key not in self._excused:
            return False
        self._excused.remove(key)
        self.ignored.append(f"abort_ack {key}: answers our off-script abort_fetch")
        return True

    def _register(self, connect: Connect) -> RegistrationFinished:
        try:
            self.data.add_peer(self.peer, connect.agent_metadata, connect.base_addr,
                               connect.num_blocks, connect.block_len, connect.layout,
                               connect.layout_names)
        except TransportError as exc:
            return RegistrationFinished(False, str(exc))
        return RegistrationFinished(True)

    def start(self) -> None:
        """Dial and send our connect (through the session); frames that came before
        are handed to the session after it."""
        self.dial()
        self._started = True
        self.feed(HostStart())
        held, self._held = self._held, []
        for frame in held:
            self.feed(FrameReceived(frame))

    def handshake(self) -> None:
        """Start and wait until our session is ready, or fail naming what came."""
        self.start()
        self.expect(lambda: self.session.ready, "the handshake to complete: the target's "
                    "connect (compatible) and its connect_ack for ours (session machine: "
                    "connecting -> registering -> awaiting_ack -> ready)")

    # -- waiting ------------------------------------------------------------------

    def pump(self, seconds: float) -> None:
        """Wait at most ``seconds`` for frames; progress NIXL; fire due timers."""
        events = self.control.poll(max(0, int(min(seconds, _TICK_S) * 1000)))
        if time.monotonic() >= self.nixl_stalled_until:
            self.data.progress()
        for wid, ok in self.data.poll():
            xfer = self._writes.pop(wid, None)  # type: ignore[call-overload]
            if xfer is not None:
                self.feed(WriteFinished(xfer, ok))
        if self._pending_reg is not None and self._pending_reg[0] <= time.monotonic():
            connect = self._pending_reg[1]
            self._pending_reg = None
            self.feed(self._register(connect))
        for ev in events:
            if isinstance(ev, FrameIn):
                self._on_frame(ev)
            elif isinstance(ev, PeerLost):
                self.lost.append(f"{ev.peer_id}: {ev.reason}")
                if ev.peer_id == self.peer and self.session.alive:
                    self.feed(TransportLost(ev.reason))
        if self._driver.queue_due(time.monotonic()):  # the session's due timers
            self._driver.drain()

    def _on_frame(self, ev: FrameIn) -> None:
        if not self.peer:  # a consumer target: its identity is that of its first frame
            self.peer = ev.peer_id
        if ev.peer_id != self.peer:
            self.other_ids.append(ev.peer_id)
        try:
            msg: Message | None = decode(ev.frame)
            text = describe(msg) if msg is not None else ""
        except MalformedFrame as exc:
            msg, text = None, f"<malformed: {exc}>"
        self.frames.append(Frame(self.now(), False, msg, text))
        self._last_in = msg
        if self._started:
            self.feed(FrameReceived(ev.frame))
        elif self.connect_first and not isinstance(msg, Connect):
            self.dropped.append(text)  # no session yet: a fresh node drops it
        else:  # delivered once our session starts (a case may send before it does)
            self._held.append(ev.frame)
            if not self.target.addr:  # a consumer target dialled us: answer its connect
                self.start()
        self._last_in = None

    def wait(self, done: Callable[[], bool], timeout: float) -> bool:
        """Pump until ``done()`` or ``timeout`` s pass; whether it was done."""
        end = time.monotonic() + timeout
        while not done():
            left = end - time.monotonic()
            if left <= 0:
                return False
            self.pump(left)
        return True

    def expect(self, done: Callable[[], bool], what: str, timeout: float | None = None) -> None:
        """Pump until ``done()``; a :class:`CaseFailure` naming ``what`` after the deadline."""
        if not self.wait(done, self.target.deadline if timeout is None else timeout):
            raise CaseFailure(what, self.summary())

    def observe(self, seconds: float | None = None) -> list[Frame]:
        """Every frame received in the next ``seconds`` (the target's window)."""
        start = len(self.frames)
        self.wait(lambda: False, self.target.window if seconds is None else seconds)
        return [f for f in self.frames[start:] if not f.sent]

    def received(self, kind: str | None = None) -> list[Message]:
        """Decoded frames from the target (of type ``kind``), in order."""
        return [f.message for f in self.frames if not f.sent and f.message is not None
                and (kind is None or kind == f.message.TYPE)]

    def summary(self, last: int = 12) -> str:
        """The last frames both ways, the session state and what the oracle said."""
        lines = [f"{f.at:.3f}s {'->' if f.sent else '<-'} {f.text}" for f in self.frames[-last:]]
        text = "; ".join(lines) if lines else "no frame at all"
        text += f" [our session: {self.session.state}"
        if self.dead is not None:
            text += f", ended: {self.dead.reason}"
        text += "]"
        if self.violations:
            text += f" [violations: {'; '.join(self.violations)}]"
        if self.lost:
            text += f" [connection: {'; '.join(self.lost)}]"
        return text

    def check_clean(self) -> None:
        """Fail when any frame of the target broke the models."""
        if self.violations:
            raise CaseFailure("every frame of the target accepted by p2pfsm's session "
                              "machines in the state it arrived in", self.summary())
        if self.other_ids:
            raise CaseFailure(f"frames only from the identity {self.peer!r}",
                              f"frames from {sorted(set(self.other_ids))}")

    # -- loads --------------------------------------------------------------------

    def next_job(self) -> int:
        self._job += 1
        return self._job

    def fetch(self, rid: str, blocks: Sequence[int], slots: Sequence[int]) -> int:
        """A load through the session: demo ``blocks`` into our ``slots`` (zeroed first)."""
        region = self.data.region
        assert region is not None
        for slot in slots:
            region[slot].zero_()
        job = self.next_job()
        self.feed(HostFetch(job, rid, tuple(demo_key(b) for b in blocks), tuple(slots)))
        self.data.expect_inbound(self.target.deadline, prompt=True)
        return job

    def finish(self, rid: str) -> None:
        self.feed(HostFinish(rid))

    def lookup(self, rid: str, blocks: Sequence[int]) -> None:
        self.feed(HostLookup(rid, tuple(demo_key(b) for b in blocks)))

    def close_session(self) -> None:
        self.feed(HostClose())

    def load_result(self, job: int, what: str) -> LoadResult:
        """Wait for the load ``job``'s result."""
        def found() -> bool:
            return any(r.job_id == job for r in self.loads)
        self.expect(found, what)
        return next(r for r in self.loads if r.job_id == job)

    def slot_bytes(self, slot: int) -> bytes:
        region = self.data.region
        assert region is not None
        return bytes(region[slot].numpy().tobytes())

    def check_blocks(self, blocks: Sequence[int], slots: Sequence[int]) -> None:
        """Every byte of demo ``blocks`` in ``slots``, or a failure naming the first bad one."""
        for block, slot in zip(blocks, slots, strict=True):
            got = self.slot_bytes(slot)
            want = demo_block(block, self.target.block_len)
            if got != want:
                bad = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
                raise CaseFailure(
                    f"demo block {block} byte-exact in our block {slot} once the round "
                    "ended with transfer_done(true)",
                    f"byte {bad} differs ({got[bad]:#04x}, want {want[bad]:#04x})"
                    + (" (nothing landed)" if not any(got) else ""))

    def zeroed(self, slots: Sequence[int]) -> bool:
        return all(not any(self.slot_bytes(s)) for s in slots)

    def close(self) -> None:
        """Close both planes (bounded by the DEALER linger); no disconnect is sent, as
        when a process dies. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.control.close()
        finally:
            self.data.close()
