"""The server machines (the producer role): serve rounds and served lookups.

A :class:`ServerRound` holds one (kv_request_id, round_seq)'s supply (our pinned
blocks, by key) and demand (the consumer's destination index, by key). Every
match event starts one write. The round ends exactly once, from ``settle`` (which the
session fires after every other step of the round, where the model declares it), and
only when none of its writes is in flight; its jobs' StoreResults (pin releases)
and its reply (transfer_done or abort_ack) go out then, except those of jobs only
failed writes read, which go out as the last of those writes ends. Supply the host gives
before any fetch names a round waits in an *unbound* round (round_seq None) that
the first fetch of the request adopts.

A :class:`ServerLookup` is one received lookup frame; the host resolves its keys
through LookupRequest / HostAnswerLookup; the answer goes out once every key is
settled; the session settles only the oldest open lookup of a request, so answers go
out in arrival order.

Actions of both only append to the step's outbox (:mod:`~p2pfsm.session.child`): the
session applies it, and retires an instance when its machine reaches a terminal state.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from operator import attrgetter

from p2pfsm.fsm import CompiledMachine, machine, writes
from p2pfsm.protocol import AbortAck, Fetch, LookupResp, TransferDone
from p2pfsm.session.child import (
    Arm,
    BindRound,
    ChildEnv,
    Disarm,
    ExpireLookupRound,
    HoldJob,
    PinHits,
    Send,
)
from p2pfsm.session.inputs import (
    HostAnswerLookup,
    HostSupply,
    TimerId,
    WriteFinished,
    timer_id,
)
from p2pfsm.session.outputs import (
    CancelWrite,
    FailReason,
    LookupClosed,
    LookupRequest,
    RoundEnded,
    StartWrite,
    StoreResult,
)


class ServerRound:
    """Producer state of one (kv_request_id, round_seq)."""

    __slots__ = (
        "demand", "env", "fsm_state", "host_finished", "inflight", "jobs", "kv_request_id",
        "landed", "origin", "owners", "peer_finished", "reads", "round_seq", "serial", "supply",
        "told", "total",
    )

    def __init__(self, env: ChildEnv, serial: int, kv_request_id: str, round_seq: int | None,
                 origin: str = "host", host_finished: bool = False,
                 peer_finished: bool = False) -> None:
        self.env = env
        self.fsm_state = SERVER_ROUND.spec.initial
        self.serial = serial
        self.kv_request_id = kv_request_id
        self.round_seq = round_seq
        self.origin = origin
        """Which supply feeds the round, fixed at creation: "host" or "lookup"."""
        self.host_finished = host_finished
        """The host had finished the request when this round was created: no host supply
        will ever come for it (fixed at creation, like ``origin``)."""
        self.peer_finished = peer_finished
        """The peer had finished the request (its terminal fetch, and no fetch or lookup of
        it since) when this round was created: no fetch will name it (fixed at creation)."""
        self.supply: dict[bytes, int] = {}
        self.owners: dict[bytes, int] = {}
        """The store job whose pin supplies each key of ``supply``."""
        self.demand: dict[bytes, int] = {}
        self.inflight: dict[int, int] = {}
        self.reads: dict[int, frozenset[int]] = {}
        """Each write in flight -> the store jobs whose pins it reads."""
        self.jobs: set[int] = set()
        self.total = 0
        self.landed = 0
        self.told = False
        """The host was told the round ended (RoundEnded): at most once."""

    fsm_data = ("round_seq", "supply", "owners", "demand", "inflight", "reads", "jobs", "total",
                "landed", "told")
    """What this round's actions write (restored should one raise)."""

    fsm_outputs = property(attrgetter("env.outbox"))  # C getters: read on every step

    @property
    def demanded(self) -> bool:
        """A fetch has named this round (its demand was recorded)."""
        return self.total > 0

    @property
    def fsm_label(self) -> str:
        return f"{self.kv_request_id}/{'-' if self.round_seq is None else self.round_seq}"

    fsm_tracer = property(attrgetter("env.tracer"))

    def _add(self, job_id: int, keys: tuple[bytes, ...], local_indexes: tuple[int, ...]) -> None:
        self.jobs.add(job_id)
        self.env.outbox.append(HoldJob(job_id))
        if not self.supply:  # the usual case: one supply (keys are distinct, checked)
            self.supply.update(zip(keys, local_indexes, strict=True))
            self.owners.update(dict.fromkeys(keys, job_id))
            return
        for key, local in zip(keys, local_indexes, strict=True):
            if key not in self.supply:
                self.supply[key] = local
                self.owners[key] = job_id

    # guards
    def is_unservable(self, ev: Fetch) -> bool:
        return not all(map(self.supply.__contains__, ev.keys))

    def is_host_finished(self, _ev: object) -> bool:
        return self.host_finished

    def is_peer_finished(self, _ev: object) -> bool:
        return self.peer_finished

    def is_complete(self, _ev: object) -> bool:
        return not self.demand and not self.inflight and self.landed == self.total

    def is_quiescent(self, _ev: object) -> bool:
        return not self.inflight

    # actions
    @writes("jobs", "supply", "owners")
    def add_supply(self, ev: HostSupply | PinHits) -> None:
        self._add(ev.job_id, ev.keys, ev.local_indexes)

    @writes()
    def reject_supply(self, ev: HostSupply) -> None:
        self.env.outbox.append(StoreResult(ev.job_id, False, FailReason.NOT_SERVED,
                               "the round no longer takes supply"))

    @writes()
    def reject_finished_supply(self, ev: HostSupply) -> None:
        self.env.outbox.append(StoreResult(ev.job_id, False, FailReason.NOT_SERVED,
                               f"the peer finished request {self.kv_request_id!r} (its "
                               "terminal fetch): no fetch will read this supply"))

    @writes()
    def arm_store_timer(self, _ev: object) -> None:
        self.env.outbox.append(Arm(timer_id(("store", (self.serial,))), self.env.timeouts.store,
                                   keep=True))

    @writes()
    def disarm_store_timer(self, _ev: object) -> None:
        self.env.outbox.append(Disarm(timer_id(("store", (self.serial,)))))

    @writes()
    def arm_demand_timer(self, _ev: object) -> None:
        self.env.outbox.append(Arm(timer_id(("demand", (self.serial,))), self.env.timeouts.demand))

    @writes("round_seq")
    def adopt_round(self, ev: Fetch) -> None:
        """A round supplied before any fetch named it (round_seq None) is the fetch's."""
        if self.round_seq is None:
            self.round_seq = ev.round_seq
            self.env.outbox.append(BindRound())

    @writes("total", "demand")
    def record_demand(self, ev: Fetch) -> None:
        self.total = len(ev.keys)
        self.demand = dict(zip(ev.keys, ev.block_indexes, strict=True))

    @writes("supply", "owners", "demand", "inflight", "reads")
    def write_matched(self, _ev: object) -> None:
        small, large = (
            (self.demand, self.supply) if len(self.demand) <= len(self.supply)
            else (self.supply, self.demand)
        )
        matched = list(filter(large.__contains__, small))
        if not matched:
            return
        local = tuple(map(self.supply.pop, matched))
        remote = tuple(map(self.demand.pop, matched))
        xfer = next(self.env.xfers)
        self.inflight[xfer] = len(matched)
        self.reads[xfer] = frozenset(map(self.owners.pop, matched))
        self.env.outbox.append(StartWrite(xfer, local, remote))

    @writes("inflight", "reads", "landed")
    def account_write(self, ev: WriteFinished) -> None:
        count = self.inflight.pop(ev.xfer)
        del self.reads[ev.xfer]
        if ev.ok:
            self.landed += count

    @writes("jobs")
    def release_failed_reads(self, ev: WriteFinished) -> None:
        """The jobs the ended write ``ev.xfer`` read that no other write in flight reads:
        their StoreResult (failed) now. Only a draining round's writes fail unlanded, and
        it starts no write, so nothing reads their pins any more."""
        self._fail_unread(self.reads[ev.xfer], ev.xfer, "the write reading these pins failed")

    @writes("jobs")
    def release_unread_jobs(self, _ev: object) -> None:
        """An abort: the round's jobs no write in flight reads get their StoreResult
        (failed) now; the round starts no write once draining, so nothing will read them."""
        self._fail_unread(self.jobs, None, "the consumer aborted the round")

    def _fail_unread(self, jobs: Set[int], ended: int | None, detail: str) -> None:
        """Each of ``jobs`` still held that no write in flight but ``ended`` reads: its
        StoreResult (failed, ``detail``) now, and it leaves the round."""
        still = frozenset().union(*(r for x, r in self.reads.items() if x != ended))
        for job in sorted((jobs - still) & self.jobs):
            self.jobs.discard(job)
            self.env.outbox.append(StoreResult(job, False, FailReason.NOT_SERVED, detail))

    @writes()
    def cancel_writes(self, _ev: object) -> None:
        for xfer in self.inflight:
            self.env.outbox.append(CancelWrite(xfer))

    @writes()
    def send_done_success(self, _ev: object) -> None:
        self.env.outbox.append(Send(TransferDone(self.kv_request_id, True, self._wire_round())))

    @writes()
    def send_done_failure(self, _ev: object) -> None:
        self.env.outbox.append(Send(TransferDone(self.kv_request_id, False, self._wire_round())))

    @writes()
    def send_abort_ack(self, _ev: object) -> None:
        self.env.outbox.append(Send(AbortAck(self.kv_request_id, self._wire_round())))

    @writes("told")
    def tell_round_served(self, _ev: object) -> None:
        self._tell(True, "served")

    @writes("told")
    def tell_round_failed(self, _ev: object) -> None:
        self._tell(False, "failed")  # the host finished the request before supplying all

    # The round takes no more supply for a reason its transition names (RoundEnded.why).
    @writes("told")
    def tell_round_aborted(self, _ev: object) -> None:
        self._tell(False, "aborted")

    @writes("told")
    def tell_round_peer_finished(self, _ev: object) -> None:
        self._tell(False, "peer_finished")  # its terminal fetch

    @writes("told")
    def tell_round_demand_timeout(self, _ev: object) -> None:
        self._tell(False, "demand_timeout")

    @writes("told")
    def tell_round_write_failed(self, _ev: object) -> None:
        self._tell(False, "write_failed")

    @writes("told")
    def tell_round_declined(self, _ev: object) -> None:
        self._tell(False, "declined")

    @writes("told")
    def tell_round_session_ended(self, _ev: object) -> None:
        self._tell(False, "session_ended")

    def _tell(self, served: bool, why: str) -> None:
        """Tell the host a round it heard of (FetchArrived) ended, once."""
        if self.told or not self.demanded or self.round_seq is None:
            return
        self.told = True
        self.env.outbox.append(RoundEnded(self.kv_request_id, self.round_seq, served, why))

    @writes()
    def remember_expired(self, _ev: object) -> None:
        assert self.round_seq is not None  # lookup rounds are named by their lookup
        self.env.outbox.append(ExpireLookupRound(self.kv_request_id, self.round_seq))

    @writes()
    def release_jobs(self, _ev: object) -> None:
        self._release(False)

    @writes()
    def release_served_jobs(self, _ev: object) -> None:
        self._release(True)

    def _release(self, served: bool) -> None:
        for job in sorted(self.jobs):
            if served:
                self.env.outbox.append(StoreResult(job, True))
            else:
                self.env.outbox.append(StoreResult(job, False, FailReason.NOT_SERVED,
                                       "the round ended without a fetch reading these pins"))

    def _wire_round(self) -> int:
        # Only rounds named by a frame reply on the wire, and those have a round_seq.
        return self.round_seq if self.round_seq is not None else 0


@dataclass(frozen=True, slots=True)
class LookupAnswer:
    """The host's answer to a served lookup, as its machine takes it (``host_answer``).

    ``refused_job``: the job whose hits the lookup's round no longer takes (its fetch
    came, or it ended unserved): that job fails at once, and ``answer`` is the host's
    answer without those hits (they count as misses); None: ``answer`` as the host gave
    it."""

    answer: HostAnswerLookup
    refused_job: int | None = None


class ServerLookup:
    """One lookup frame received from the peer."""

    __slots__ = ("env", "fsm_state", "keys", "kv_request_id", "pending", "resolved", "round_seq",
                 "sent", "token")

    def __init__(
        self, env: ChildEnv, token: int, kv_request_id: str, round_seq: int,
        keys: tuple[bytes, ...],
    ) -> None:
        self.env = env
        self.fsm_state = SERVER_LOOKUP.spec.initial
        self.token = token
        self.kv_request_id = kv_request_id
        self.round_seq = round_seq
        self.keys = keys
        self.resolved: dict[bytes, bool] = {}
        self.pending: set[bytes] = set(keys)
        self.sent: set[bytes] = set()  # keys a part answered already

    fsm_data = ("resolved", "pending", "sent")
    """What this lookup's actions write (restored should one raise)."""

    fsm_outputs = property(attrgetter("env.outbox"))  # C getters: read on every step

    @property
    def fsm_label(self) -> str:
        return f"{self.kv_request_id}/{self.round_seq}#{self.token}"

    fsm_tracer = property(attrgetter("env.tracer"))

    # guards
    def is_answerable(self, _ev: object) -> bool:
        # The session fires settle on the oldest open lookup of the request only.
        return not self.pending

    def has_part(self, _ev: object) -> bool:
        # Answering in parts, and a key was resolved since the last part.
        return self.env.lookup_parts and len(self.resolved) > len(self.sent)

    def is_pinning_refused(self, ev: LookupAnswer) -> bool:
        return ev.refused_job is not None

    # actions
    @writes()
    def ask_host(self, _ev: object) -> None:
        unique = tuple(dict.fromkeys(self.keys))
        self.env.outbox.append(LookupRequest(self.token, self.kv_request_id, self.round_seq,
                                             unique))

    @writes()
    def arm_pending_timer(self, _ev: object) -> None:
        self.env.outbox.append(Arm(TimerId("lookup_pending", (self.token,)),
                                   self.env.timeouts.lookup_pending))

    @writes()
    def disarm_pending_timer(self, _ev: object) -> None:
        self.env.outbox.append(Disarm(TimerId("lookup_pending", (self.token,))))

    @writes()
    def refuse_pins(self, ev: LookupAnswer) -> None:
        assert ev.refused_job is not None  # is_pinning_refused
        self.env.outbox.append(StoreResult(ev.refused_job, False, FailReason.NOT_SERVED,
                               "the lookup's round no longer takes pins"))

    @writes("resolved", "pending")
    def record_answers(self, answer: LookupAnswer) -> None:
        ev = answer.answer
        for key in list(self.pending):
            if key in ev.hits:
                self.resolved[key] = True
            elif key not in ev.pending:
                self.resolved[key] = False
            else:
                continue
            self.pending.discard(key)
        if ev.hits and ev.job_id is not None:
            keys = tuple(ev.hits)
            self.env.outbox.append(PinHits(self.kv_request_id, self.round_seq, ev.job_id, keys,
                               tuple(ev.hits[k] for k in keys)))

    @writes("resolved", "pending")
    def expire_pending(self, _ev: object) -> None:
        for key in self.pending:
            self.resolved[key] = False
        self.pending.clear()

    @writes("sent")
    def send_lookup_part(self, _ev: object) -> None:
        self._send_unsent()

    @writes("sent")
    def send_lookup_resp(self, _ev: object) -> None:
        self._send_unsent()

    def _send_unsent(self) -> None:
        """One lookup_resp with every key no part carried yet, in wire order (a key the
        lookup names twice is echoed twice, answered from its one resolution)."""
        keys = tuple(k for k in self.keys if k in self.resolved and k not in self.sent)
        self.sent.update(keys)
        self.env.outbox.append(Send(LookupResp(self.kv_request_id, keys,
                                   tuple(self.resolved[k] for k in keys))))

    @writes()
    def close_host_context(self, _ev: object) -> None:
        self.env.outbox.append(LookupClosed(self.token))


SERVER_ROUND = CompiledMachine(machine("server_round"), ServerRound)
SERVER_LOOKUP = CompiledMachine(machine("server_lookup"), ServerLookup)
