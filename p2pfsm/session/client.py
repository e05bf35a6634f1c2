"""The client machines (the consumer role): load rounds and lookups.

Each :class:`ClientRound` is one load job for (kv_request_id, round_seq) and each
:class:`ClientLookup` one lookup frame; their machines (``models/client_round.toml``,
``models/client_lookup.toml``) decide every state change, and the methods below are
the guards and actions those files name. Actions only append to the step's outbox
(:mod:`~p2pfsm.session.child`); the session applies it and retires an instance once its
machine reaches a terminal state. Round numbers are chosen by ``ClientPart._alloc_round``
so that two rounds that could both still receive frames never share one (see
docs/explanation/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from p2pfsm.fsm import (
    AbortAckTimeout,
    CompiledMachine,
    LookupTimeout,
    ReportFailedLoad,
    UnsentFetch,
    machine,
    writes,
)
from p2pfsm.protocol import AbortFetch, Fetch, Lookup, TransferDone
from p2pfsm.session.child import (
    Arm,
    ChildEnv,
    Disarm,
    EndSession,
    Send,
    WithdrawFetch,
)
from p2pfsm.session.inputs import PeerGone, TimerId, timer_id
from p2pfsm.session.outputs import (
    DestinationReleased,
    FailReason,
    LoadResult,
    LookupResult,
    ReleaseCause,
)


class ClientRound:
    """One load job: a fetch for (kv_request_id, round_seq)."""

    __slots__ = ("before_ready", "cause", "dest_indexes", "env", "fsm_state", "job_id",
                 "keys", "kv_request_id", "probed", "round_seq")

    fsm_data = ("cause",)
    """What this round's actions write (restored should one raise)."""

    def __init__(
        self, env: ChildEnv, job_id: int, kv_request_id: str, round_seq: int,
        keys: tuple[bytes, ...], dest_indexes: tuple[int, ...], probed: bool = False,
        before_ready: bool = False,
    ) -> None:
        self.env = env
        self.probed = probed  # the request ran lookups first (its load deadline may differ)
        self.before_ready = before_ready  # made before the handshake completed
        self.fsm_state = CLIENT_ROUND.spec.initial
        self.job_id = job_id
        self.kv_request_id = kv_request_id
        self.round_seq = round_seq
        self.keys = keys
        self.dest_indexes = dest_indexes
        self.cause: FailReason | None = None  # why the round was aborted, once it was

    fsm_outputs = property(attrgetter("env.outbox"))  # C getters: read on every step

    @property
    def fsm_label(self) -> str:
        return f"{self.kv_request_id}/{self.round_seq}"

    fsm_tracer = property(attrgetter("env.tracer"))

    def _timer(self, kind: str) -> TimerId:
        return timer_id((kind, (self.kv_request_id, self.round_seq)))

    # guards: the session's behaviour profile
    def reports_at_abort_send(self, _ev: object) -> bool:
        return self.env.behaviour.report_failed_load is ReportFailedLoad.AT_ABORT_SEND

    def ack_timeout_ends_session(self, _ev: object) -> bool:
        return self.env.behaviour.abort_ack_timeout is AbortAckTimeout.END_SESSION

    def waits_for_handshake(self, _ev: object) -> bool:
        """Made before the handshake completed, under a profile that retires a fetch
        still queued then: the round waits in ``queued`` for the flush."""
        return (self.before_ready
                and self.env.behaviour.unsent_fetch is UnsentFetch.RETIRE_LOCALLY)

    # actions
    @writes()
    def send_fetch(self, _ev: object) -> None:
        self.env.outbox.append(Send(Fetch(self.kv_request_id, self.keys, self.dest_indexes,
                                          self.round_seq)))

    @writes()
    def withdraw_fetch(self, _ev: object) -> None:
        self.env.outbox.append(WithdrawFetch(self.kv_request_id, self.round_seq))

    @writes()
    def send_terminal_fetch(self, _ev: object) -> None:
        # Closes the request on the peer (its parked supply is failed), naming this round,
        # whose fetch the peer never got; the session drops it while another load or
        # lookup of the request is open.
        self.env.outbox.append(Send(Fetch(self.kv_request_id, (), (), self.round_seq)))

    @writes()
    def arm_load_timer(self, _ev: object) -> None:
        self.env.outbox.append(Arm(self._timer("load"), self.env.timeouts.load_for(self.probed)))

    @writes()
    def disarm_load_timer(self, _ev: object) -> None:
        self.env.outbox.append(Disarm(self._timer("load")))

    # Why the round is aborted: the first abort's transition says; re-sends keep it.
    @writes("cause")
    def note_timed_out(self, _ev: object) -> None:
        if self.cause is None:
            self.cause = FailReason.TIMEOUT

    @writes("cause")
    def note_finished(self, _ev: object) -> None:
        if self.cause is None:
            self.cause = FailReason.FINISHED

    @writes()
    def send_abort(self, _ev: object) -> None:
        self.env.outbox.append(Send(AbortFetch(self.kv_request_id, self.round_seq)))

    @writes()
    def arm_abort_ack_timer(self, _ev: object) -> None:
        self.env.outbox.append(Arm(self._timer("abort_ack"), self.env.timeouts.abort_ack))

    @writes()
    def disarm_abort_ack_timer(self, _ev: object) -> None:
        self.env.outbox.append(Disarm(self._timer("abort_ack")))

    @writes()
    def report_transfer_result(self, ev: TransferDone) -> None:
        if ev.success:
            self.env.outbox.append(LoadResult(self.job_id, self.kv_request_id, True, True))
        else:
            self._fail(FailReason.PEER_FAILED, "the peer answered transfer_done(false) (it "
                       "lacks a key, declined the round or its host finished the request)")

    @writes()
    def report_aborted(self, _ev: object) -> None:
        if self.cause is FailReason.FINISHED:
            self._fail(self.cause, "the host finished the request while it loaded; the "
                       "round was aborted and the peer acknowledged it")
        else:
            self._fail(FailReason.TIMEOUT, f"no transfer_done within the load timeout "
                       f"({self.env.timeouts.load_for(self.probed):g} s); the round was "
                       "aborted and the peer acknowledged it")

    @writes()
    def report_aborted_held(self, _ev: object) -> None:
        if self.cause is FailReason.FINISHED:
            why = "the host finished the request while it loaded"
        else:
            why = (f"no transfer_done within the load timeout "
                   f"({self.env.timeouts.load_for(self.probed):g} s)")
        assert self.cause is not None  # send_abort ran first
        self._fail(self.cause, f"{why}; the round is being aborted: the destination is "
                   "released later (DestinationReleased)", released=False)

    @writes()
    def end_session_ack_expired(self, _ev: object) -> None:
        self.env.outbox.append(EndSession("abort_ack_expired"))

    @writes()
    def arm_hold_timer(self, _ev: object) -> None:
        hold = self.env.timeouts.hold
        if hold is not None:  # no bounded hold: only a proof releases the destination
            self.env.outbox.append(Arm(self._timer("hold"), hold))

    @writes()
    def disarm_hold_timer(self, _ev: object) -> None:
        self.env.outbox.append(Disarm(self._timer("hold")))

    # The destination is free: each transition that frees it names why.
    @writes()
    def report_released_abort_ack(self, _ev: object) -> None:
        self._released(ReleaseCause.ABORT_ACK)

    @writes()
    def report_released_transfer_done(self, _ev: object) -> None:
        self._released(ReleaseCause.TRANSFER_DONE)

    @writes()
    def report_released_hold_expired(self, _ev: object) -> None:
        self._released(ReleaseCause.HOLD_EXPIRED)

    @writes()
    def report_released_peer_gone(self, ev: PeerGone) -> None:
        self._released(ReleaseCause(ev.cause))

    @writes()
    def report_released_never_sent(self, _ev: object) -> None:
        self._released(ReleaseCause.NEVER_SENT)  # the fetch never left the queue

    def _released(self, cause: ReleaseCause) -> None:
        self.env.outbox.append(DestinationReleased(self.job_id, self.kv_request_id,
                                                   self.round_seq, cause))

    @writes()
    def report_orphaned(self, _ev: object) -> None:
        self._fail(FailReason.SESSION_ENDED, "the session ended while the peer could still "
                   "write: the destination is not released", released=False)

    @writes()
    def report_unsent(self, _ev: object) -> None:
        # The fetch never left the queue (the session was never ready): no write can land,
        # and the peer never saw it (never_sent: it may go to the peer's next session).
        self._fail(FailReason.SESSION_ENDED, "the session ended before it was ready; the "
                   "fetch was never sent", never_sent=True)

    @writes()
    def report_retired_timed_out(self, _ev: object) -> None:
        self._fail(FailReason.TIMEOUT, f"queued fetch {self.kv_request_id} round="
                   f"{self.round_seq} timed out before transport handoff (load timeout "
                   f"{self.env.timeouts.load_for(self.probed):g} s): never sent, no abort")

    @writes()
    def report_retired_finished(self, _ev: object) -> None:
        self._fail(FailReason.FINISHED, "the host finished the request before the fetch "
                   "left the queue: never sent, no abort")

    def _fail(self, reason: FailReason, detail: str, *, released: bool = True,
              never_sent: bool = False) -> None:
        self.env.outbox.append(LoadResult(self.job_id, self.kv_request_id, False, released, reason,
                              f"{len(self.keys)} key(s): {detail}", never_sent))


@dataclass(frozen=True, slots=True)
class LookupPart:
    """The (key, hit) pairs of one lookup_resp that the session matched to one lookup."""

    pairs: tuple[tuple[bytes, bool], ...]


class ClientLookup:
    """One lookup frame sent to the peer, waiting for an answer to each of its keys."""

    __slots__ = ("answers", "env", "fsm_state", "keys", "kv_request_id", "round_seq",
                 "serial")

    fsm_data = ("answers",)
    """What this lookup's actions write (restored should one raise)."""

    def __init__(
        self, env: ChildEnv, serial: int, kv_request_id: str, round_seq: int,
        keys: tuple[bytes, ...],
    ) -> None:
        self.env = env
        self.fsm_state = CLIENT_LOOKUP.spec.initial
        self.serial = serial
        self.kv_request_id = kv_request_id
        self.round_seq = round_seq
        self.keys = keys
        self.answers: dict[bytes, bool] = {}

    def waits_for(self, key: bytes) -> bool:
        """The peer has not answered ``key`` of this lookup yet (and it asked for it)."""
        return key not in self.answers and key in self.keys

    fsm_outputs = property(attrgetter("env.outbox"))  # C getters: read on every step

    @property
    def fsm_label(self) -> str:
        return f"{self.kv_request_id}/{self.round_seq}#{self.serial}"

    fsm_tracer = property(attrgetter("env.tracer"))

    # guards
    def completes(self, ev: LookupPart) -> bool:
        return len(self.answers) + len(ev.pairs) == len(self.keys)

    def lookup_timeout_ends_session(self, _ev: object) -> bool:
        """The profile ends the whole session on an overdue lookup answer."""
        return self.env.behaviour.lookup_timeout is LookupTimeout.END_SESSION

    # actions
    @writes()
    def end_session_lookup_expired(self, _ev: object) -> None:
        self.env.outbox.append(EndSession("lookup_expired"))

    @writes()
    def send_lookup(self, _ev: object) -> None:
        self.env.outbox.append(Send(Lookup(self.kv_request_id, self.keys, self.round_seq)))

    @writes()
    def arm_lookup_timer(self, _ev: object) -> None:
        self.env.outbox.append(Arm(TimerId("lookup", (self.serial,)), self.env.timeouts.lookup))

    @writes()
    def disarm_lookup_timer(self, _ev: object) -> None:
        self.env.outbox.append(Disarm(TimerId("lookup", (self.serial,))))

    @writes("answers")
    def record_part(self, ev: LookupPart) -> None:
        self.answers.update(ev.pairs)

    @writes()
    def report_answer(self, _ev: object) -> None:
        hits = tuple(self.answers[k] for k in self.keys)
        self.env.outbox.append(LookupResult(self.kv_request_id, self.keys, hits, answered=True))

    # The lookup ends unanswered: each transition that ends it names why.
    @writes()
    def report_miss_timed_out(self, _ev: object) -> None:
        self._miss(FailReason.TIMEOUT,
                   f"not answered within the lookup timeout ({self.env.timeouts.lookup:g} s)")

    @writes()
    def report_miss_finished(self, _ev: object) -> None:
        self._miss(FailReason.FINISHED, "the host finished the request first")

    @writes()
    def report_miss_fetched(self, _ev: object) -> None:
        self._miss(FailReason.FINISHED, "the host fetched the request first")

    @writes()
    def report_miss_session_ended(self, _ev: object) -> None:
        self._miss(FailReason.SESSION_ENDED, "the session ended first")

    @writes()
    def report_miss_never_sent(self, _ev: object) -> None:
        # The lookup never left the queue (the session was never ready): the peer never
        # saw it (never_sent: it may go to the peer's next session).
        self._miss(FailReason.SESSION_ENDED, "the session ended first", never_sent=True)

    def _miss(self, reason: FailReason, why: str, *, never_sent: bool = False) -> None:
        hits = tuple(self.answers.get(k, False) for k in self.keys)
        left = len(self.keys) - len(self.answers)
        self.env.outbox.append(LookupResult(self.kv_request_id, self.keys, hits, False, reason,
                                f"{left} of {len(self.keys)} key(s) {why}: taken as MISS",
                                never_sent))


CLIENT_ROUND = CompiledMachine(machine("client_round"), ClientRound)
CLIENT_LOOKUP = CompiledMachine(machine("client_lookup"), ClientLookup)
