"""The must-fail mutants: vLLM's bugs at the Session boundary, and slips planted inside.

Most mutants wrap :meth:`Session.handle`: it sees the input before the session does and
the outputs after, and may rewrite, add or swallow them, keeping its own notes
(:class:`~mutants.boundary.Boundary`) and nothing of the session's insides. So a mutant
keeps working while the session's internals are restructured, as long as the public
inputs and outputs keep their meaning. The others (:data:`SLIPS`) are one-line slips
planted in the product code's own functions while they are on (:mod:`mutants.slips`):
the bugs a developer would write, each in a window the stateful search must reach
(issue 24). Each must be caught by the stateful test alone
(``tests/mutants/test_caught.py``). The executor's slips (:data:`EXECUTOR_SLIPS`, not in
:data:`MUTANTS`: the session-level stateful test never runs the executor) must each be
caught by the default-suite tests they name (``tests/mutants/test_executor_slips.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, Lookup, Message, TransferDone, decode
from p2pfsm.protocol import encode as encode_frame
from p2pfsm.session import (
    CancelWrite,
    FrameReceived,
    HostFinish,
    Input,
    LoadResult,
    Output,
    SendFrame,
    Session,
    SessionDead,
    StartWrite,
    StoreResult,
    TimerFired,
)

from .boundary import Boundary
from .slips import Slip

Inner = Callable[[Input, float], list[Output]]


def _frame(event: Input, session: Session) -> Message | None:
    """The message an incoming frame carries, or None (not a frame, or undecodable)."""
    if not isinstance(event, FrameReceived):
        return None
    try:
        return decode(event.frame, session.config.limits)
    except Exception:
        return None


def _sent(outputs: list[Output], cls: type) -> list[Message]:
    return [o.message for o in outputs if isinstance(o, SendFrame) and isinstance(o.message, cls)]


class Mutant:
    """One session's mutant: ``handle`` is called instead of the session's own."""

    name = ""
    race = ""
    what = ""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.b = Boundary()

    def handle(self, inner: Inner, event: Input, now: float) -> list[Output]:
        event = self.rewrite_input(event)
        self.b.before(event)
        try:
            outputs = inner(event, now)
        except Exception:
            self.b.failed(event)
            raise
        self.b.after(outputs)
        return self.rewrite_outputs(event, outputs)

    def rewrite_input(self, event: Input) -> Input:
        return event

    def rewrite_outputs(self, event: Input, outputs: list[Output]) -> list[Output]:
        return outputs


class P1Consumer(Mutant):
    name = "p1_consumer"
    race = "P1"
    what = ("consumer completes the request's open round (the oldest) on any transfer_done, "
            "ignoring its round_seq")

    def rewrite_input(self, event: Input) -> Input:
        msg = _frame(event, self.session)
        if not isinstance(msg, TransferDone):
            return event
        rounds = self.b.open_rounds(msg.kv_request_id)
        if not rounds or rounds[0].round_seq == msg.round_seq:
            return event
        return FrameReceived(encode_frame(replace(msg, round_seq=rounds[0].round_seq)))


class P3FinishDrops(Mutant):
    name = "p3_finish_drops"
    race = "P3"
    what = "consumer finish sends abort_fetch and drops its loads: they never get a LoadResult"

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.dropped: set[int] = set()

    def rewrite_outputs(self, event: Input, outputs: list[Output]) -> list[Output]:
        if isinstance(event, HostFinish):
            self.dropped |= {j.job_id for j in self.b.loads.values()
                             if j.kv_request_id == event.kv_request_id and not j.done
                             and j.round_seq is not None}
        return [o for o in outputs if not (isinstance(o, LoadResult) and o.job_id in self.dropped)]


class P4RoundRestart(Mutant):
    name = "p4_round_restart"
    race = "P4"
    what = ("consumer round numbers restart at 0 once a request has nothing open (no round "
            "floor after an abort): a late abort_ack completes the new generation")

    STALE = 1 << 40
    """Internal round for a reply naming no live wire round (the session ignores it)."""

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.wire: dict[tuple[str, int], int] = {}  # (kv, internal round) -> wire round

    def _to_wire(self, kv: str, internal: int) -> int:
        key = (kv, internal)
        if key not in self.wire:
            live = [w for (k, _), w in self.wire.items() if k == kv]
            self.wire[key] = max(live) + 1 if live else 0
        return self.wire[key]

    def rewrite_input(self, event: Input) -> Input:
        msg = _frame(event, self.session)
        if not isinstance(msg, TransferDone | AbortAck):
            return event
        internal = next((i for (k, i), w in self.wire.items()
                         if k == msg.kv_request_id and w == msg.round_seq), None)
        seq = self.STALE + msg.round_seq if internal is None else internal
        return FrameReceived(encode_frame(replace(msg, round_seq=seq)))

    def rewrite_outputs(self, event: Input, outputs: list[Output]) -> list[Output]:
        result: list[Output] = []
        ended: list[tuple[str, int]] = []
        for out in outputs:
            if isinstance(out, SendFrame) and isinstance(out.message, Fetch | AbortFetch | Lookup):
                msg = out.message
                if isinstance(msg, Fetch) and not msg.keys:  # closes a lookup round
                    ended.append((msg.kv_request_id, msg.round_seq))
                out = SendFrame(replace(msg, round_seq=self._to_wire(msg.kv_request_id,
                                                                     msg.round_seq)))
            elif isinstance(out, LoadResult) and out.job_id in self.b.loads:
                job = self.b.loads[out.job_id]
                if job.round_seq is not None:
                    ended.append((job.kv_request_id, job.round_seq))
            elif isinstance(out, SessionDead):
                self.wire.clear()
            result.append(out)
        for key in ended:  # the request's idle state is pruned: its counter restarts
            self.wire.pop(key, None)
        return result


class P5Producer(Mutant):
    name = "p5_producer"
    race = "P5 (producer)"
    what = ("producer sends abort_ack as soon as abort_fetch arrives, before its writes are "
            "quiescent (the real, later reply is swallowed)")

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.acked: set[tuple[str, int]] = set()

    def rewrite_outputs(self, event: Input, outputs: list[Output]) -> list[Output]:
        result: list[Output] = []
        for out in outputs:
            msg = out.message if isinstance(out, SendFrame) else None
            if isinstance(msg, AbortAck | TransferDone) and (
                    (msg.kv_request_id, msg.round_seq) in self.acked):
                self.acked.discard((msg.kv_request_id, msg.round_seq))
                continue
            result.append(out)
        msg = _frame(event, self.session)
        if isinstance(msg, AbortFetch) and self.session.ready:
            key = (msg.kv_request_id, msg.round_seq)
            if not any((m.kv_request_id, m.round_seq) == key for m in _sent(result, AbortAck)):
                result.append(SendFrame(AbortAck(*key)))
                self.acked.add(key)
        return result


class _GiveUp(Mutant):
    """Consumer reports a load failed and its destination free when a timer aborts it."""

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.aborts: dict[int, int] = {}  # job -> abort_fetch frames sent
        self.given_up: set[int] = set()

    def give_up(self, aborts_sent: int) -> bool:
        raise NotImplementedError

    def rewrite_outputs(self, event: Input, outputs: list[Output]) -> list[Output]:
        result = [o for o in outputs
                  if not (isinstance(o, LoadResult) and o.job_id in self.given_up)]
        for msg in _sent(outputs, AbortFetch):
            assert isinstance(msg, AbortFetch)
            job = self.b.job_of_round(msg.kv_request_id, msg.round_seq)
            if job is None or job.job_id in self.given_up:
                continue
            self.aborts[job.job_id] = self.aborts.get(job.job_id, 0) + 1
            if isinstance(event, TimerFired) and self.give_up(self.aborts[job.job_id]):
                self.given_up.add(job.job_id)
                result.append(LoadResult(job.job_id, job.kv_request_id, False, True))
        return result


class P5Consumer(_GiveUp):
    name = "p5_consumer"
    race = "P5 (consumer)"
    what = ("consumer frees the destination on the load timeout (failure, released) "
            "without waiting for abort_ack")

    def give_up(self, aborts_sent: int) -> bool:
        return aborts_sent == 1


class P5ConsumerAckTimeout(_GiveUp):
    name = "p5_consumer_ack_timeout"
    race = "P5 (consumer)"
    what = ("consumer gives up when the abort_ack deadline passes (vLLM G1-G4) and frees "
            "the destination")

    def give_up(self, aborts_sent: int) -> bool:
        return aborts_sent >= 2


class _Unpin(Mutant):
    """Producer reports a store job (pin release) early; the real StoreResult is swallowed."""

    success = True

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.released: set[int] = set()

    def trigger(self, out: Output) -> tuple[int, ...] | None:
        raise NotImplementedError

    def rewrite_outputs(self, event: Input, outputs: list[Output]) -> list[Output]:
        result: list[Output] = []
        for out in outputs:
            if isinstance(out, StoreResult) and out.job_id in self.released:
                continue
            result.append(out)
            blocks = self.trigger(out)
            if blocks is None:
                continue
            for job in self.b.pins_read_by(blocks):
                if job not in self.released:
                    self.released.add(job)
                    result.append(StoreResult(job, self.success))
        return result


class P6UnpinOnIssue(_Unpin):
    name = "p6_unpin_on_issue"
    race = "P6"
    what = ("producer releases a pin (StoreResult) when the write reading it is issued, "
            "not when it has completed")

    def trigger(self, out: Output) -> tuple[int, ...] | None:
        return tuple(out.local_indexes) if isinstance(out, StartWrite) else None


class P6UnpinOnCancel(_Unpin):
    name = "p6_unpin_on_cancel"
    race = "P6"
    what = ("producer releases the pins a write reads (StoreResult false) when it cancels "
            "the write, before the cancel completes (vLLM G4 abort drain)")
    success = False

    def trigger(self, out: Output) -> tuple[int, ...] | None:
        return self.b.writes.get(out.xfer) if isinstance(out, CancelWrite) else None


@dataclass(frozen=True)
class Entry:
    name: str
    race: str
    what: str
    cls: type[Mutant] | None = None
    """A wrapper of Session.handle, or"""
    slip: Slip | None = None
    """one line of the product code changed."""
    caught_by: tuple[str, ...] = ()
    """Executor slips: the default-suite tests (pytest node ids) that must catch it."""


SLIPS: tuple[Entry, ...] = (
    Entry("lost_abort_released", "session loss while aborting",
          "the consumer frees a destination when the session is lost while an abort's "
          "write may still land (an aborting round ends as if its fetch was never sent)",
          slip=Slip("p2pfsm.session.client_part", "ClientPart.end",
                    "owner.step(CLIENT_ROUND, rnd, trigger)",
                    "owner.step(CLIENT_ROUND, rnd, trigger if rnd.fsm_state == "
                    "'loading' else 'session_lost_unsent')")),
    Entry("round_floor_10s", "ABA on round numbers",
          "the round floor is forgotten after 10 s instead of the frame lifetime "
          "(Timeouts.tombstone), so a round number is reused while a frame of its aborted "
          "round may still arrive",
          slip=Slip("p2pfsm.session.client_part", "ClientPart.__init__",
                    "self.round_floor = Tombstones(config.timeouts.tombstone)",
                    "self.round_floor = Tombstones(10.0)")),
    Entry("late_answer_pins_kept", "late host answer",
          "a host's late lookup answer, for a lookup that ended meanwhile, never gets its "
          "pins released (its release is guarded by the answer's pending keys, not its hits)",
          slip=Slip("p2pfsm.session.server_part", "ServerPart.on_host_answer",
                    "if ev.hits and ev.job_id is not None:",
                    "if ev.pending and ev.job_id is not None:")),
    Entry("fetch_index_num_blocks", "boundary index",
          "a fetch naming block index num_blocks (one past the consumer's region) is "
          "accepted (< became <=)",
          slip=Slip("p2pfsm.protocol.validate", "index_outside",
                    "if not indexes or (min(indexes) >= 0 and max(indexes) < limit):",
                    "if not indexes or (min(indexes) >= 0 and max(indexes) <= limit):")),
)
"""Slips planted inside the code (issue 24's table, its session-level rows)."""

EXECUTOR_SLIPS: tuple[Entry, ...] = (
    Entry("cancel_releases_running_write", "cancel of a running WRITE",
          "DataPlane.cancel releases a WRITE still running (its PROC check dropped), so "
          "the session is told the write is over while UCX may still move its bytes",
          slip=Slip("p2pfsm.executor.nixl.xfers", "Transfers.cancel",
                    'if state == "PROC":', "if False:"),
          caught_by=("tests/integration/test_nixl_plane.py::"
                     "test_cancel_leaves_a_running_write_to_end",
                     "tests/integration/test_node_stateful.py::"
                     "test_an_abort_leaves_a_stalled_write_running")),
    Entry("cancelled_future_drops_result", "cancel of a fetch's future",
          "a cancelled fetch's future really cancels (concurrent.futures' cancel), so "
          "the node finds it done and drops its LoadResult",
          slip=Slip("p2pfsm.executor.node.jobs", "JobFuture.cancel",
                    "return False", "return Future.cancel(self)"),
          caught_by=("tests/integration/test_node_results.py::"
                     "test_cancel_on_a_sync_fetch_finishes_the_request_and_the_result_still_comes",
                     "tests/integration/test_node_stateful.py::test_nodes_interleaved")),
    Entry("dial_back_any_named_host", "hostile identity",
          "an unknown identity is dialled back at whatever host it names (the source "
          "address check inverted: it runs only with dial_back_any_host)",
          slip=Slip("p2pfsm.executor.zmq.intake", "RouterIntake._admit",
                    "if not self._any_host:", "if self._any_host:"),
          caught_by=("tests/integration/test_reflection.py::"
                     "test_a_connect_naming_another_host_is_not_dialled_back",
                     "tests/integration/test_node_stateful.py::test_nodes_interleaved")),
)
"""Slips planted in the executor (issue 24's table, its executor rows): each caught by
the default-suite tests it names (``tests/mutants/test_executor_slips.py``)."""

NODE_SLIPS: tuple[Entry, ...] = (
    Entry("own_agent_registered", "a node's own NIXL agent under another name",
          "DataPlane.add_peer takes a peer whose metadata describes this agent (its name "
          "or the rest of it): WRITEs to that peer land in the node's own memory",
          slip=Slip("p2pfsm.executor.nixl.agent", "agent_refusal",
                    "if describes_same_agent(metadata, own):", "if False:"),
          caught_by=("tests/integration/test_node_stateful.py::test_nodes_interleaved",)),
    Entry("deadline_kept_when_it_moves", "a deadline that moves earlier",
          "the driver keeps the first deadline it noted for a session, so a timer armed "
          "earlier than it (or the next one, once it moved later) is missed until then",
          slip=Slip("p2pfsm.executor.runtime.deadlines", "SessionDeadlines.note",
                    "if at.get(session) == deadline:", "if session in at:"),
          caught_by=("tests/integration/test_node_stateful.py::test_nodes_interleaved",)),
)
"""Executor slips only the node-level stateful test is asked to catch (CI's mutation
step, ``test_mutation_sample.py``; not the default suite's ``test_executor_slips.py``)."""

EXECUTOR: dict[str, Entry] = {e.name: e for e in (*EXECUTOR_SLIPS, *NODE_SLIPS)}

MUTANTS: dict[str, Entry] = {
    **{m.name: Entry(m.name, m.race, m.what, m)
       for m in (P1Consumer, P3FinishDrops, P4RoundRestart, P5Producer, P5Consumer,
                 P5ConsumerAckTimeout, P6UnpinOnIssue, P6UnpinOnCancel)},
    **{e.name: e for e in SLIPS},
}
