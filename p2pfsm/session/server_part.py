"""The server part of a session (the producer role): its serve rounds and served lookups,
and their tables.

Creates :class:`~p2pfsm.session.server.ServerRound` and
:class:`~p2pfsm.session.server.ServerLookup` instances, retires them when their machine
reaches a terminal state, and routes the consumer's requests (fetch, lookup,
abort_fetch), the host's supply and lookup answers and the data plane's write
completions to them. It reaches the session only through its
:class:`~p2pfsm.session.owner.Owner`.

Both machines have a state-triggered transition, ``settle``, which the session's
cascade fires: :meth:`ServerPart.note` queues in :attr:`ServerPart.unsettled` what
a step made due and :meth:`ServerPart.settle_one` settles one item. A serve round is
settled after each of its steps other than a settle, wherever its model declares settle
from the state reached; a request's served lookups are settled oldest first after a step
leaves one of them resolving or answered (the next one may be answerable now).
"""

from __future__ import annotations

from p2pfsm.errors import LocalProtocolError, MalformedFrame, RemoteProtocolError
from p2pfsm.fsm import CompiledMachine
from p2pfsm.protocol import AbortFetch, Fetch, Lookup, check_block_indexes
from p2pfsm.session.checks import check_keys, check_request_id
from p2pfsm.session.child import ChildEnv, ExpireLookupRound, PinHits
from p2pfsm.session.config import SessionConfig
from p2pfsm.session.inputs import (
    HostAnswerLookup,
    HostDecline,
    HostSupply,
    WriteFinished,
    timer_id,
)
from p2pfsm.session.outputs import FailReason, FetchArrived, StoreResult
from p2pfsm.session.owner import Owner
from p2pfsm.session.route import Route
from p2pfsm.session.server import (
    SERVER_LOOKUP,
    SERVER_ROUND,
    LookupAnswer,
    ServerLookup,
    ServerRound,
)
from p2pfsm.session.tombstones import Tombstones

# Named state sets of the models (their [sets]); the code spells no state name.
_PARKED_SUPPLY = SERVER_ROUND.state_set("parked_supply")
_HOST_FINISHED = SERVER_ROUND.state_set("host_finished")
_TAKES_SUPPLY = SERVER_ROUND.state_set("takes_supply")
_FREES_QUEUE = SERVER_LOOKUP.state_set("frees_queue")
# Where each model declares its state-triggered ``settle`` (asked on every step).
_ROUND_SETTLES = SERVER_ROUND.sources("settle")
_LOOKUP_SETTLES = SERVER_LOOKUP.sources("settle")


class ServerPart:
    """The session's server part (the peer loads from it): its serve rounds and served
    lookups.

    Args:
        owner: the session that holds this part.
        config: our identity, layout and deadlines.
        env: what each child gets (the session's outbox, deadlines and tracer).
    """

    def __init__(self, owner: Owner, config: SessionConfig, env: ChildEnv) -> None:
        self.owner = owner
        self.config = config
        self.env = env
        self.rounds: dict[str, dict[int | None, ServerRound]] = {}
        self.round_by_serial: dict[int, ServerRound] = {}
        self.round_serial = 0
        # Lookup-pinned rounds whose pins expired before their fetch: that fetch fails fast.
        self.expired_lookups = Tombstones(config.timeouts.tombstone, config.max_tombstones,
                                          config.tombstone_budget)
        # Requests the host finished: a supply for one is refused (kept a frame lifetime).
        self.finished = Tombstones(config.timeouts.tombstone, config.max_tombstones,
                                   config.tombstone_budget)
        # Requests the peer finished (its terminal fetch; its round_seq), until a fetch or
        # lookup of one names a round again: a supply that would open a new round of one
        # is refused at once (kept a frame lifetime).
        self.peer_finished = Tombstones(config.timeouts.tombstone, config.max_tombstones,
                                        config.tombstone_budget)
        self.store_jobs: dict[int, ServerRound] = {}
        self.writes: dict[int, ServerRound] = {}
        self.served: dict[str, list[ServerLookup]] = {}
        self.tokens: dict[int, ServerLookup] = {}
        self.next_token = 0
        # What the cascade must still settle: serve rounds, and request ids whose oldest
        # served lookup may answer now.
        self.unsettled: list[ServerRound | str] = []

    @property
    def busy(self) -> bool:
        """True while a serve round or served lookup is open."""
        return bool(self.rounds or self.tokens)

    def tombstone_tables(self) -> tuple[Tombstones, ...]:
        """This part's per-request tables: the session purges them before every input
        and empties them when it is over."""
        return (self.expired_lookups, self.finished, self.peer_finished)

    # ------------------------------------------- what children's outboxes ask
    def bind_round(self, rnd: ServerRound) -> None:
        """File an unbound round its fetch adopted (``adopt_round``) under its round_seq."""
        rounds = self.rounds[rnd.kv_request_id]
        if rounds.get(None) is rnd:
            del rounds[None]
        rounds[rnd.round_seq] = rnd

    def hold_job(self, rnd: ServerRound, job_id: int) -> None:
        """``rnd`` holds the pins of store job ``job_id`` until it ends."""
        self.store_jobs[job_id] = rnd

    def start_write(self, rnd: ServerRound, xfer: int) -> None:
        """``rnd`` started write ``xfer``: its completion is routed to it."""
        self.writes[xfer] = rnd

    def expire(self, item: ExpireLookupRound) -> None:
        """The lookup pins of a round expired before its fetch: that fetch fails fast."""
        self.expired_lookups.put(item.kv_request_id, item.round_seq, self.owner.now)

    def pin_hits(self, item: PinHits) -> None:
        """A served lookup's hits, pinned: the supply of their round (a nested step)."""
        rnd = self._round_for(item.kv_request_id, item.round_seq, "lookup")
        self.owner.step_nested(SERVER_ROUND, rnd, "lookup_pin", item)

    # ------------------------------------------------------------- retiring
    def retire_round(self, rnd: ServerRound) -> None:
        """Drop a serve round whose machine reached a terminal state."""
        rounds = self.rounds[rnd.kv_request_id]
        del rounds[rnd.round_seq]
        if not rounds:
            del self.rounds[rnd.kv_request_id]
        del self.round_by_serial[rnd.serial]
        for job in rnd.jobs:
            self.store_jobs.pop(job, None)
        self.owner.disarm(timer_id(("store", (rnd.serial,))))
        self.owner.disarm(timer_id(("demand", (rnd.serial,))))

    def retire_lookup(self, served: ServerLookup) -> None:
        """Drop a served lookup whose machine reached a terminal state."""
        del self.tokens[served.token]
        queue = self.served[served.kv_request_id]
        queue.remove(served)
        if not queue:
            del self.served[served.kv_request_id]

    # -------------------------------------------------------------- cascade
    def note(self, m: CompiledMachine, obj: object, trigger: str, dest: str) -> None:
        """Queue in :attr:`unsettled` what a child's step makes due."""
        due = self.unsettled
        if type(obj) is ServerRound:  # SERVER_ROUND's
            if trigger != "settle" and dest in _ROUND_SETTLES and obj not in due:
                due.append(obj)
        elif type(obj) is ServerLookup:  # SERVER_LOOKUP's
            rid = obj.kv_request_id
            if ((dest in _FREES_QUEUE or (trigger != "settle" and dest in _LOOKUP_SETTLES))
                    and rid not in due):
                due.append(rid)

    def settle_one(self, item: ServerRound | str) -> None:
        """Fire ``settle`` of a serve round, or of a request's oldest served lookup."""
        if isinstance(item, ServerRound):
            if item.fsm_state in _ROUND_SETTLES:  # else ended meanwhile
                self.owner.step_nested(SERVER_ROUND, item, "settle")
        else:
            queue = self.served.get(item)
            if queue:  # answer in arrival order: only the oldest open lookup may answer
                self.owner.step_nested(SERVER_LOOKUP, queue[0], "settle")

    # -------------------------------------------------------------- rounds
    def _round_for(self, kv_request_id: str, round_seq: int | None,
                   origin: str = "host", host_finished: bool | None = None) -> ServerRound:
        """The open round of (kv_request_id, round_seq), created when there is none;
        ``host_finished``: what :meth:`_finished_by_host` says now, if the caller knows."""
        rounds = self.rounds.setdefault(kv_request_id, {})
        rnd = rounds.get(round_seq)
        if rnd is None:
            if host_finished is None:
                host_finished = self._finished_by_host(kv_request_id)
            self.round_serial += 1
            rnd = ServerRound(self.env, self.round_serial, kv_request_id, round_seq, origin,
                              host_finished, self.peer_finished.get(kv_request_id) is not None)
            rounds[round_seq] = rnd
            self.round_by_serial[rnd.serial] = rnd
        return rnd

    def server_round(self, kv_request_id: str, round_seq: int | None) -> ServerRound | None:
        """The open serve round of (kv_request_id, round_seq), if any."""
        rounds = self.rounds.get(kv_request_id)
        return None if rounds is None else rounds.get(round_seq)

    def host_finished(self, kv_request_id: str) -> None:
        """The host finished the request: a supply for it is refused from now on."""
        self.finished.put(kv_request_id, 0, self.owner.now)

    def close_request(self, kv_request_id: str, trigger: str, ev: object = None) -> None:
        """The request ended (terminal fetch or host finish, ``ev``): close its served
        side."""
        self.expired_lookups.pop(kv_request_id)
        owner = self.owner
        for served in list(self.served.get(kv_request_id, ())):
            owner.step(SERVER_LOOKUP, served, "request_closed")
        for rnd in list(self.rounds.get(kv_request_id, {}).values()):
            if SERVER_ROUND.can_fire(rnd, trigger, ev):
                owner.step(SERVER_ROUND, rnd, trigger, ev)

    def _finished_by_host(self, kv_request_id: str) -> bool:
        """The host finished the request (within a frame lifetime, or a round of it is
        still in a state only its finish leads to)."""
        if self.finished.get(kv_request_id) is not None:
            return True
        rounds = self.rounds.get(kv_request_id)
        if rounds:  # a loop, not any() over a generator: asked twice per fetch
            for r in rounds.values():
                if r.fsm_state in _HOST_FINISHED:
                    return True
        return False

    # ------------------------------------------------------------- frames
    # Their routes come from models/inputs.toml; the dispatch checked each one's gate.
    def on_terminal_fetch(self, msg: Fetch, route: Route) -> None:
        """The peer ended the request (a fetch naming no keys): its served side closes."""
        owner = self.owner
        owner.step_nested(owner.machine, owner, route.gate, msg)
        # Until the peer names a round of the request again, supply for it is refused.
        self.peer_finished.put(msg.kv_request_id, msg.round_seq, owner.now)
        self.close_request(msg.kv_request_id, route.trigger, msg)

    def on_fetch(self, msg: Fetch, route: Route) -> None:
        owner = self.owner
        peer = owner.peer
        assert peer is not None  # the gate admits requests only after the peer's connect
        check_block_indexes(msg, peer.num_blocks)
        if len(set(msg.keys)) != len(msg.keys):
            raise MalformedFrame("keys", "duplicate keys in one fetch")
        if len(set(msg.block_indexes)) != len(msg.block_indexes):  # two blocks, one place
            raise MalformedFrame("block_indexes", "a destination named twice in one fetch")
        rnd = self.server_round(msg.kv_request_id, msg.round_seq)
        if rnd is None and self.expired_lookups.get(msg.kv_request_id) == msg.round_seq:
            # The lookup pins of this round expired before the fetch: it can never be
            # served, so fail it now rather than let the consumer wait (vLLM P7).
            owner.step_nested(owner.machine, owner, route.gate, msg)
            self.expired_lookups.pop(msg.kv_request_id)
            self.peer_finished.pop(msg.kv_request_id)
            owner.step_nested(owner.machine, owner, "recv_expired_fetch", msg)  # done(false)
            return
        if rnd is None:
            unbound = self.server_round(msg.kv_request_id, None)
            if unbound is not None and unbound.fsm_state in _PARKED_SUPPLY:
                rnd = unbound
        if rnd is not None and not SERVER_ROUND.can_fire(rnd, route.trigger, msg):
            raise RemoteProtocolError(
                "round_seq", f"duplicate fetch for {msg.kv_request_id}/{msg.round_seq}")
        owner.step_nested(owner.machine, owner, route.gate, msg)
        self.peer_finished.pop(msg.kv_request_id)  # the peer goes on with the request
        finished = self._finished_by_host(msg.kv_request_id)  # a new round leaves it so
        if rnd is None:
            rnd = self._round_for(msg.kv_request_id, msg.round_seq, host_finished=finished)
        supplied = tuple(filter(rnd.supply.__contains__, msg.keys))
        dest = owner.step_nested(SERVER_ROUND, rnd, route.trigger, msg)
        # A host is never asked to supply a request it finished, nor a round that ended
        # at once (the fetch named keys its lookup did not pin: transfer_done(false)).
        if not finished and dest not in SERVER_ROUND.spec.terminal:
            owner.emit(FetchArrived(msg.kv_request_id, msg.round_seq, msg.keys, supplied))
        owner.settle()  # after the host hears of the fetch

    def on_lookup(self, msg: Lookup, route: Route) -> None:
        owner = self.owner
        rnd = self.server_round(msg.kv_request_id, msg.round_seq)
        if rnd is not None and rnd.demanded:
            raise RemoteProtocolError(
                "round_seq", f"lookup for {msg.kv_request_id}/{msg.round_seq} after its fetch")
        most = self.config.max_lookups_per_request
        if len(self.served.get(msg.kv_request_id, ())) >= most:
            raise RemoteProtocolError(
                "kv_request_id", f"{most} lookups of {msg.kv_request_id} are unanswered "
                "already (max_lookups_per_request)")
        owner.step_nested(owner.machine, owner, route.gate, msg)
        self.peer_finished.pop(msg.kv_request_id)  # the peer goes on with the request
        self.next_token += 1
        served = ServerLookup(self.env, self.next_token, msg.kv_request_id, msg.round_seq,
                              msg.keys)
        self.tokens[served.token] = served
        self.served.setdefault(msg.kv_request_id, []).append(served)
        owner.step(SERVER_LOOKUP, served, route.trigger, msg)

    def on_abort_fetch(self, msg: AbortFetch, route: Route) -> None:
        owner = self.owner
        owner.step_nested(owner.machine, owner, route.gate, msg)
        rnd = self.server_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            # Nothing of that round is in flight (unknown or already ended): ack at once.
            owner.step_nested(owner.machine, owner, "recv_unknown_abort", msg)
            return
        owner.step(SERVER_ROUND, rnd, route.trigger, msg)

    # ----------------------------------------------------------- host calls
    def on_host_supply(self, ev: HostSupply, trigger: str) -> None:
        """The host pins blocks for a request (the session checked that it started); its
        round fires ``trigger``."""
        check_keys(self.config, ev.keys, ev.local_indexes, "supply", ev.kv_request_id)
        if ev.job_id in self.store_jobs:
            raise LocalProtocolError(f"supply: job {ev.job_id} is already pinned")
        if self._finished_by_host(ev.kv_request_id):
            raise LocalProtocolError(
                f"supply: request {ev.kv_request_id!r} was finished by this host (HostFinish "
                "says no more supply comes); its fetch, if any, is answered already")
        if not self.owner.alive:  # over (idle was refused): the session fails the job at once
            self.owner.step_nested(self.owner.machine, self.owner, "host_supply_over", ev)
            return
        rnd = self._supply_target(ev)
        self.owner.step(SERVER_ROUND, rnd, trigger, ev)

    def on_host_decline(self, ev: HostDecline, trigger: str) -> None:
        """The host will not supply a fetched round (the session checked that it
        started): the round fires ``trigger``."""
        check_request_id(self.config, ev.kv_request_id, "decline")
        if type(ev.round_seq) is not int or ev.round_seq < 0:
            raise LocalProtocolError(f"decline: round_seq {ev.round_seq!r} is not a round")
        rnd = self.server_round(ev.kv_request_id, ev.round_seq)
        if rnd is None:
            return  # the round ended meanwhile: its one reply is sent already
        if not SERVER_ROUND.can_fire(rnd, trigger):
            raise LocalProtocolError(
                f"decline: no fetch of {ev.kv_request_id}/{ev.round_seq} has arrived yet "
                f"(its round is {rnd.fsm_state})")
        self.owner.step(SERVER_ROUND, rnd, trigger, ev)

    def _supply_target(self, ev: HostSupply) -> ServerRound:
        """The round PD supply (which names no round) belongs to.

        The PD round whose demand names one of the keys; else the parked unbound round;
        else the latest PD round that has ended its supply (it rejects the job at once);
        else a new unbound round that the next fetch of the request adopts (or, when the
        peer finished the request, that rejects the job at once).
        """
        rounds = [r for r in self.rounds.get(ev.kv_request_id, {}).values()
                  if r.origin == "host"]
        for rnd in rounds:
            if rnd.demand and not rnd.demand.keys().isdisjoint(ev.keys):
                return rnd
        unbound = self.server_round(ev.kv_request_id, None)
        if unbound is not None:
            return unbound
        closed = [r for r in rounds if r.fsm_state not in _TAKES_SUPPLY]
        if closed:
            return closed[-1]
        serving = [r for r in rounds if r.fsm_state in _TAKES_SUPPLY]
        # The caller refused supply for a request the host finished: it is not.
        return serving[-1] if serving else self._round_for(ev.kv_request_id, None,
                                                           host_finished=False)

    def on_host_answer(self, ev: HostAnswerLookup, trigger: str) -> None:
        """The host answers a served lookup (some keys hit and pinned, some pending): the
        lookup fires ``trigger``."""
        served = self.tokens.get(ev.token)
        if ev.hits and ev.job_id is None:
            raise LocalProtocolError("answer_lookup: hits need the job_id that pins them")
        if ev.job_id is not None and ev.job_id in self.store_jobs:
            raise LocalProtocolError(f"answer_lookup: job {ev.job_id} is already pinned")
        if served is None:
            # The lookup ended meanwhile (terminal fetch, finish, death): free the pins now.
            if ev.hits and ev.job_id is not None:
                self.owner.emit(StoreResult(ev.job_id, False, FailReason.NOT_SERVED,
                                            "the lookup ended before the answer"))
            return
        unknown = [k for k in (*ev.hits, *ev.pending) if k not in served.pending]
        if unknown:
            raise LocalProtocolError(f"answer_lookup: keys not pending in lookup {ev.token}")
        for idx in ev.hits.values():
            if type(idx) is not int or not 0 <= idx < self.config.num_blocks:
                raise LocalProtocolError(f"answer_lookup: index {idx!r} for key outside region")
        rnd = self.server_round(served.kv_request_id, served.round_seq)
        answer = LookupAnswer(ev)
        if ev.hits and rnd is not None and not SERVER_ROUND.can_fire(rnd, "lookup_pin"):
            # The round takes no more pins: the lookup fails the job, the hits are misses.
            answer = LookupAnswer(HostAnswerLookup(ev.token, {}, None, ev.pending),
                                  ev.job_id or 0)
        self.owner.step(SERVER_LOOKUP, served, trigger, answer)

    def on_write(self, ev: WriteFinished, trigger: str) -> None:
        """The data plane finished write ``ev.xfer``: its round fires ``trigger`` (the
        input table's variant for ``ev.ok``)."""
        rnd = self.writes.pop(ev.xfer, None)
        if rnd is None:
            raise LocalProtocolError(f"write {ev.xfer} is not in flight")
        self.owner.step(SERVER_ROUND, rnd, trigger, ev)

    # ----------------------------------------------------------------- end
    def end(self) -> None:
        """The session ended: every served lookup and serve round is closed."""
        owner = self.owner
        for served in list(self.tokens.values()):
            owner.step(SERVER_LOOKUP, served, "request_closed")
        for srv in list(self.round_by_serial.values()):
            owner.step(SERVER_ROUND, srv, "session_lost")
