"""Fuzzing ``Session.handle(FrameReceived(frame), now)`` in every reachable state.

Each example takes a deep copy of a session in one of ``states.STATES`` (idle,
handshake stages, ready with open client rounds, aborted rounds, client lookups,
serve rounds with writes in flight, PD supply, served and pinned lookups,
tombstones, dead, closed, a SimWorld mid-run) and feeds it a sequence of fuzzed
frames (``frames.fuzz_frames``: mostly mutated valid messages aimed at its open
ids), sometimes interleaved with legitimate events (a due timer, a write result,
the registration result) that move it to further states. For every frame:

* no exception escapes ``handle`` (a crash);
* outputs are Output instances; every frame the session sends decodes back to itself;
* a frame ``decode`` refuses yields exactly one ProtocolViolation (FrameIgnored for
  an unknown type, or when the session is no longer live), and so does a fetch naming a
  block at or past the peer's ``num_blocks`` (``frames.indexes`` draws that boundary);
* every rejected frame (one ProtocolViolation or FrameIgnored) leaves the session
  unchanged: state, open counts, pending work and the full ``states.digest``;
* a rejection is the only output of its frame.

CI: derandomized, about 4 500 frames and 1 500 other events. Long run: see test_fuzz_decode.py.
"""

from __future__ import annotations

import typing

from helpers.world import Driver, sent
from hypothesis import given
from hypothesis import strategies as st

from fuzz.frames import fuzz_frames
from fuzz.states import STATES, fresh, full_snapshot, settle_clock
from fuzz.stats import COUNTS, fuzz_settings
from p2pfsm.errors import MalformedFrame, RemoteProtocolError, UnknownMessageType
from p2pfsm.protocol import Disconnect, Fetch, TransferDone, decode, encode, fetch_round
from p2pfsm.session import (
    FrameIgnored,
    FrameReceived,
    Input,
    Output,
    ProtocolViolation,
    RegistrationFinished,
    SendFrame,
    SendToLostPeer,
    Session,
    WriteFinished,
)
from p2pfsm.session.core import LIVE_STATES

OUTPUT_TYPES = typing.get_args(Output)  # the declared outputs, and nothing else


def check_outputs(out: list[Output]) -> None:
    for o in out:
        assert isinstance(o, OUTPUT_TYPES), o
        if isinstance(o, ProtocolViolation):
            assert isinstance(o.error, RemoteProtocolError), o
    for msg in sent(out):
        assert decode(encode(msg)) == msg, f"the session sent a frame it would refuse: {msg}"


def feed(d: Driver, event: Input) -> list[Output]:
    try:
        out = d(event)
    except BaseException:
        COUNTS.crashes += 1
        raise
    check_outputs(out)
    return out


def feed_frame(d: Driver, frame: bytes) -> list[Output]:
    """Feed one fuzzed frame and check every property of the module docstring."""
    settle_clock(d)
    s = d.s
    live = s.state in LIVE_STATES
    before = full_snapshot(s)
    queued = len(s.view.queued)
    COUNTS.session_frames += 1
    out = feed(d, FrameReceived(frame))
    if before[0] == "dead" and out[:1] == [SendToLostPeer(Disconnect())]:
        out = out[1:]  # a dead session's answer to its peer (test_scenario_one_sided)
    try:
        msg = decode(frame, s.config.limits)
        if before[0] == "dead" and isinstance(msg, Disconnect):
            # The peer ended its side too: dead -> ended, nothing sent.
            assert out == [] and s.state == "ended", out
            return out
        refused: type[Output] | None = None
    except UnknownMessageType:
        refused = FrameIgnored
    except MalformedFrame:
        refused = ProtocolViolation
    else:
        if (isinstance(msg, Fetch) and msg.keys and s.peer is not None
                and max(msg.block_indexes) >= s.peer.num_blocks):
            refused = ProtocolViolation  # a block outside the peer's region (its connect)
    if not live:
        refused = FrameIgnored
    if refused is not None:  # first the rejection; a bad fetch's answer may follow (below)
        assert out and type(out[0]) is refused, (refused, out)
    rejections = [o for o in out if isinstance(o, ProtocolViolation | FrameIgnored)]
    if rejections:
        answered = _answer_of(s, before[0], frame, out)
        assert len(out) == 1 + answered, f"a rejection came with other outputs: {out}"
        unqueued = 0
        if (answered == 0 and s.state == "awaiting_ack" and len(s.view.queued) == queued + 1
                and _answer_queued(s, frame)):
            unqueued = 1  # the reply waits for ready; nothing else may have changed
            COUNTS.answered_rejections += 1
        after = full_snapshot(s, unqueued)
        if after != before:
            COUNTS.changed_by_rejection += 1
            changed = [i for i, (x, y) in enumerate(zip(before, after, strict=True)) if x != y]
            raise AssertionError(f"{out[0]} changed the session (parts {changed}):\n"
                                 f"before {before}\nafter  {after}")
        COUNTS.rejected_frames += 1
    return out


def _answer_of(s: Session, state: str, frame: bytes, out: list[Output]) -> int:
    """1 when a malformed fetch naming its round was answered with transfer_done(false)
    for it (recv_bad_fetch) right after its ProtocolViolation, else 0."""
    named = fetch_round(frame, s.config.limits)
    if state != "ready" or named is None or len(out) != 2:
        return 0
    want = SendFrame(TransferDone(named.kv_request_id, False, named.round_seq))
    if isinstance(out[0], ProtocolViolation) and out[1] == want:
        COUNTS.answered_rejections += 1
        return 1
    return 0


def _answer_queued(s: Session, frame: bytes) -> bool:
    named = fetch_round(frame, s.config.limits)
    queue = s.view.queued
    return named is not None and bool(queue) and queue[-1] == TransferDone(
        named.kv_request_id, False, named.round_seq)


def step_event(d: Driver, choice: int) -> None:
    """A legitimate event that moves the session on: a due timer, a write result or the
    registration result (whichever applies; nothing when none does)."""
    s = d.s
    if s.state in ("registering", "registering_acked"):
        COUNTS.session_events += 1
        feed(d, RegistrationFinished(True))
    elif s.view.writes and choice % 2:
        xfer = sorted(s.view.writes)[choice % len(s.view.writes)]
        COUNTS.session_events += 1
        feed(d, WriteFinished(xfer, choice % 3 != 0))
    elif d.timers:
        timer = sorted(d.timers, key=lambda t: (d.timers[t], str(t)))[choice % len(d.timers)]
        COUNTS.session_events += 1
        try:
            d.fire(timer)
        except BaseException:
            COUNTS.crashes += 1
            raise


ops = st.one_of(fuzz_frames, fuzz_frames, fuzz_frames, st.integers(0, 7))
"""Mostly frames; an int is a legitimate event (``step_event``)."""


@fuzz_settings(900)
@given(st.sampled_from(sorted(STATES)), st.lists(ops, min_size=1, max_size=10))
def test_fuzzed_frames_in_every_state(state: str, steps: list[bytes | int]) -> None:
    d = fresh(state)
    for step in steps:
        if isinstance(step, bytes):
            feed_frame(d, step)
        else:
            step_event(d, step)


@fuzz_settings(150)
@given(st.lists(fuzz_frames, min_size=1, max_size=10))
def test_fuzzed_frames_on_the_busiest_session(frames: list[bytes]) -> None:
    # The state with the most open machines gets extra attention.
    d = fresh("ready+busy")
    for frame in frames:
        feed_frame(d, frame)


def test_every_state_is_built_as_named() -> None:
    for name in STATES:
        d = fresh(name)
        expected = name.split("+")[0]
        assert d.s.state == ("ready" if expected == "sim-midrun" else expected), name
    busy = fresh("ready+busy").s.open_counts()
    assert all(busy[k] > 0 for k in ("client_round", "client_lookup", "server_round",
                                     "server_lookup", "writes", "timers")), busy


def test_digest_sees_a_change_in_any_machine_table() -> None:
    # The unchanged-session check can fail: each of these edits shows up in the digest.
    # They corrupt the session on purpose, so they write the parts' tables and (through
    # vars(), as the digest reads them) the session's own, never through the view.
    from fuzz.states import digest

    edits = {
        "client round state": lambda s: setattr(next(iter(s.client.loads["load"].values())),
                                                "fsm_state", "x"),
        "client lookup keys": lambda s: setattr(s.client.lookups["look"][0], "keys", ()),
        "server round demand": lambda s: s.server.rounds["dem"][0].demand.clear(),
        "server round supply": lambda s: s.server.rounds["pd"][None].supply.clear(),
        "served lookup pending": lambda s: s.server.tokens[1].pending.clear(),
        "write table": lambda s: s.server.writes.clear(),
        "store jobs": lambda s: s.server.store_jobs.pop(50),
        "timers": lambda s: vars(s)["_timers"].disarm(next(iter(vars(s)["_timers"]))),
        "queue": lambda s: vars(s)["_queue"].append(None),
        "round floor": lambda s: s.client.round_floor.put("z", 1, 0.0),
        "peer finished": lambda s: s.server.peer_finished.put("z", 1, 0.0),
        "a replaced round": lambda s: s.server.rounds["dem"].update(
            {0: __import__("copy").copy(s.server.rounds["dem"][0])}),
    }
    for name, edit in edits.items():
        s = fresh("ready+busy").s
        before = digest(s)
        edit(s)
        assert digest(s) != before, name
