"""Producer role: serve rounds and served lookups, as the session owns them.

Creates :class:`~p2pfsm.session.server.ServerRound` and
:class:`~p2pfsm.session.server.ServerLookup` instances, retires them when their machine
reaches a terminal state, and routes the consumer's requests (fetch, lookup,
abort_fetch), the host's supply and lookup answers and the data plane's write
completions to them.

Both machines have a state-triggered transition, ``settle``, which the cascade
(:meth:`~p2pfsm.session.steps.ChildSteps._cascade`) fires; the rule is
:meth:`ProducerRole._note`: a serve round is settled after each of its steps other
than a settle, wherever its model declares settle from the state reached; a request's
served lookups are settled oldest first after a step leaves one of them resolving or
answered (the next one may be answerable now).
"""

from __future__ import annotations

from p2pfsm.errors import LocalProtocolError, MalformedFrame, RemoteProtocolError
from p2pfsm.fsm import CompiledMachine
from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, Lookup, TransferDone, check_block_indexes
from p2pfsm.session.child import PinHits
from p2pfsm.session.inputs import (
    HostAnswerLookup,
    HostDecline,
    HostSupply,
    TimerId,
    WriteFinished,
)
from p2pfsm.session.outputs import FailReason, FetchArrived, StoreResult
from p2pfsm.session.server import SERVER_LOOKUP, SERVER_ROUND, ServerLookup, ServerRound
from p2pfsm.session.steps import ChildSteps

# Named state sets of the models (their [sets]); the code spells no state name.
_PARKED_SUPPLY = SERVER_ROUND.state_set("parked_supply")
_HOST_FINISHED = SERVER_ROUND.state_set("host_finished")
_TAKES_SUPPLY = SERVER_ROUND.state_set("takes_supply")
_FREES_QUEUE = SERVER_LOOKUP.state_set("frees_queue")


class ProducerRole(ChildSteps):
    """The session's producer side: its serve rounds and served lookups."""

    def _bind_round(self, rnd: object) -> None:
        """File an unbound round its fetch adopted (``adopt_round``) under its round_seq."""
        assert isinstance(rnd, ServerRound)
        rounds = self._rounds[rnd.kv_request_id]
        if rounds.get(None) is rnd:
            del rounds[None]
        rounds[rnd.round_seq] = rnd

    def _retire(self, obj: object) -> None:
        """Drop a serve round or served lookup whose machine reached a terminal state."""
        if isinstance(obj, ServerRound):
            rounds = self._rounds[obj.kv_request_id]
            del rounds[obj.round_seq]
            if not rounds:
                del self._rounds[obj.kv_request_id]
            del self._round_by_serial[obj.serial]
            for job in obj.jobs:
                self._store_jobs.pop(job, None)
            self.disarm(TimerId("store", (obj.serial,)))
            self.disarm(TimerId("demand", (obj.serial,)))
        elif isinstance(obj, ServerLookup):
            del self._tokens[obj.token]
            queue = self._served[obj.kv_request_id]
            queue.remove(obj)
            if not queue:
                del self._served[obj.kv_request_id]
        else:
            super()._retire(obj)

    def _note(self, m: CompiledMachine, obj: object, trigger: str, dest: str) -> None:
        due = self._unsettled
        if m is SERVER_ROUND:
            assert isinstance(obj, ServerRound)
            if trigger != "settle" and SERVER_ROUND.declares(dest, "settle") and obj not in due:
                due.append(obj)
        elif m is SERVER_LOOKUP:
            assert isinstance(obj, ServerLookup)
            rid = obj.kv_request_id
            if ((dest in _FREES_QUEUE
                 or (trigger != "settle" and SERVER_LOOKUP.declares(dest, "settle")))
                    and rid not in due):
                due.append(rid)

    def _settle_one(self, item: object) -> None:
        if isinstance(item, ServerRound):
            if SERVER_ROUND.declares(item.fsm_state, "settle"):  # else ended meanwhile
                self._fire(SERVER_ROUND, item, "settle")
        else:
            assert isinstance(item, str)
            queue = self._served.get(item)
            if queue:  # answer in arrival order: only the oldest open lookup may answer
                self._fire(SERVER_LOOKUP, queue[0], "settle")

    def _pin_hits(self, item: PinHits) -> None:
        rnd = self._round_for(item.kv_request_id, item.round_seq, "lookup")
        self._fire(SERVER_ROUND, rnd, "lookup_pin", item)

    def _round_for(self, kv_request_id: str, round_seq: int | None,
                   origin: str = "host") -> ServerRound:
        rounds = self._rounds.setdefault(kv_request_id, {})
        rnd = rounds.get(round_seq)
        if rnd is None:
            self._round_serial += 1
            rnd = ServerRound(self._env, self._round_serial, kv_request_id, round_seq, origin,
                              self._finished_by_host(kv_request_id),
                              self._peer_finished.get(kv_request_id) is not None)
            rounds[round_seq] = rnd
            self._round_by_serial[rnd.serial] = rnd
        return rnd

    def _server_round(self, kv_request_id: str, round_seq: int | None) -> ServerRound | None:
        rounds = self._rounds.get(kv_request_id)
        return None if rounds is None else rounds.get(round_seq)

    def _close_request(self, kv_request_id: str, trigger: str, ev: object = None) -> None:
        """The request ended (terminal fetch or host finish, ``ev``): close its served
        side."""
        self._expired_lookups.pop(kv_request_id)
        for served in list(self._served.get(kv_request_id, ())):
            self._step(SERVER_LOOKUP, served, "request_closed")
        for rnd in list(self._rounds.get(kv_request_id, {}).values()):
            if SERVER_ROUND.can_fire(rnd, trigger, ev):
                self._step(SERVER_ROUND, rnd, trigger, ev)

    def _on_fetch(self, msg: Fetch) -> None:
        self._check_gate("recv_request")
        assert self.peer is not None  # the gate admits requests only after the peer's connect
        if msg.is_terminal:
            self._gate("recv_request", msg)
            # Until the peer names a round of the request again, supply for it is refused.
            self._peer_finished.put(msg.kv_request_id, msg.round_seq, self.now)
            self._close_request(msg.kv_request_id, "recv_terminal_fetch", msg)
            return
        check_block_indexes(msg, self.peer.num_blocks)
        if len(set(msg.keys)) != len(msg.keys):
            raise MalformedFrame("keys", "duplicate keys in one fetch")
        rnd = self._server_round(msg.kv_request_id, msg.round_seq)
        if rnd is None and self._expired_lookups.get(msg.kv_request_id) == msg.round_seq:
            # The lookup pins of this round expired before the fetch: it can never be
            # served, so fail it now rather than let the consumer wait (vLLM P7).
            self._gate("recv_request", msg)
            self._expired_lookups.pop(msg.kv_request_id)
            self._peer_finished.pop(msg.kv_request_id)
            self.send(TransferDone(msg.kv_request_id, False, msg.round_seq))
            return
        if rnd is None:
            unbound = self._server_round(msg.kv_request_id, None)
            if unbound is not None and unbound.fsm_state in _PARKED_SUPPLY:
                rnd = unbound
        if rnd is not None and not SERVER_ROUND.can_fire(rnd, "recv_fetch", msg):
            raise RemoteProtocolError(
                "round_seq", f"duplicate fetch for {msg.kv_request_id}/{msg.round_seq}")
        self._gate("recv_request", msg)
        self._peer_finished.pop(msg.kv_request_id)  # the peer goes on with the request
        if rnd is None:
            rnd = self._round_for(msg.kv_request_id, msg.round_seq)
        supplied = tuple(k for k in msg.keys if k in rnd.supply)
        may_supply = not self._finished_by_host(msg.kv_request_id)
        dest = self._fire(SERVER_ROUND, rnd, "recv_fetch", msg)
        # A host is never asked to supply a request it finished, nor a round that ended
        # at once (the fetch named keys its lookup did not pin: transfer_done(false)).
        if may_supply and dest not in SERVER_ROUND.spec.terminal:
            self.emit(FetchArrived(msg.kv_request_id, msg.round_seq, msg.keys, supplied))
        self._cascade()  # after the host hears of the fetch

    def _on_lookup(self, msg: Lookup) -> None:
        self._check_gate("recv_request")
        rnd = self._server_round(msg.kv_request_id, msg.round_seq)
        if rnd is not None and rnd.demanded:
            raise RemoteProtocolError(
                "round_seq", f"lookup for {msg.kv_request_id}/{msg.round_seq} after its fetch")
        most = self.config.max_lookups_per_request
        if len(self._served.get(msg.kv_request_id, ())) >= most:
            raise RemoteProtocolError(
                "kv_request_id", f"{most} lookups of {msg.kv_request_id} are unanswered "
                "already (max_lookups_per_request)")
        self._gate("recv_request", msg)
        self._peer_finished.pop(msg.kv_request_id)  # the peer goes on with the request
        self._next_token += 1
        served = ServerLookup(self._env, self._next_token, msg.kv_request_id, msg.round_seq,
                              msg.keys)
        self._tokens[served.token] = served
        self._served.setdefault(msg.kv_request_id, []).append(served)
        self._step(SERVER_LOOKUP, served, "recv_lookup", msg)

    def _on_abort_fetch(self, msg: AbortFetch) -> None:
        self._check_gate("recv_request")
        self._gate("recv_request", msg)
        rnd = self._server_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            # Nothing of that round is in flight (unknown or already ended): ack at once.
            self.send(AbortAck(msg.kv_request_id, msg.round_seq))
            return
        self._step(SERVER_ROUND, rnd, "recv_abort_fetch", msg)

    def _on_host_supply(self, ev: HostSupply) -> None:
        self._require_started("supply")
        self._check_keys(ev.keys, ev.local_indexes, "supply", ev.kv_request_id)
        if ev.job_id in self._store_jobs:
            raise LocalProtocolError(f"supply: job {ev.job_id} is already pinned")
        if self._finished_by_host(ev.kv_request_id):
            raise LocalProtocolError(
                f"supply: request {ev.kv_request_id!r} was finished by this host (HostFinish "
                "says no more supply comes); its fetch, if any, is answered already")
        if not self.alive:  # dead, ended or closed (idle was refused above)
            self.emit(StoreResult(ev.job_id, False, FailReason.SESSION_ENDED,
                                  "the session is not alive"))
            return
        rnd = self._supply_target(ev)
        self._step(SERVER_ROUND, rnd, "host_supply", ev)

    def _on_host_decline(self, ev: HostDecline) -> None:
        self._require_started("decline")
        self._check_request_id(ev.kv_request_id, "decline")
        if type(ev.round_seq) is not int or ev.round_seq < 0:
            raise LocalProtocolError(f"decline: round_seq {ev.round_seq!r} is not a round")
        rnd = self._server_round(ev.kv_request_id, ev.round_seq)
        if rnd is None:
            return  # the round ended meanwhile: its one reply is sent already
        if not SERVER_ROUND.can_fire(rnd, "host_decline"):
            raise LocalProtocolError(
                f"decline: no fetch of {ev.kv_request_id}/{ev.round_seq} has arrived yet "
                f"(its round is {rnd.fsm_state})")
        self._step(SERVER_ROUND, rnd, "host_decline", ev)

    def _finished_by_host(self, kv_request_id: str) -> bool:
        """The host finished the request (within a frame lifetime, or a round of it is
        still in a state only its finish leads to)."""
        if self._finished.get(kv_request_id) is not None:
            return True
        return any(r.fsm_state in _HOST_FINISHED
                   for r in self._rounds.get(kv_request_id, {}).values())

    def _supply_target(self, ev: HostSupply) -> ServerRound:
        """The round PD supply (which names no round) belongs to.

        The PD round whose demand names one of the keys; else the parked unbound round;
        else the latest PD round that has ended its supply (it rejects the job at once);
        else a new unbound round that the next fetch of the request adopts (or, when the
        peer finished the request, that rejects the job at once).
        """
        rounds = [r for r in self._rounds.get(ev.kv_request_id, {}).values()
                  if r.origin == "host"]
        for rnd in rounds:
            if rnd.demand and any(k in rnd.demand for k in ev.keys):
                return rnd
        unbound = self._server_round(ev.kv_request_id, None)
        if unbound is not None:
            return unbound
        closed = [r for r in rounds if r.fsm_state not in _TAKES_SUPPLY]
        if closed:
            return closed[-1]
        serving = [r for r in rounds if r.fsm_state in _TAKES_SUPPLY]
        return serving[-1] if serving else self._round_for(ev.kv_request_id, None)

    def _on_host_answer(self, ev: HostAnswerLookup) -> None:
        served = self._tokens.get(ev.token)
        if ev.hits and ev.job_id is None:
            raise LocalProtocolError("answer_lookup: hits need the job_id that pins them")
        if ev.job_id is not None and ev.job_id in self._store_jobs:
            raise LocalProtocolError(f"answer_lookup: job {ev.job_id} is already pinned")
        if served is None:
            # The lookup ended meanwhile (terminal fetch, finish, death): free the pins now.
            if ev.hits and ev.job_id is not None:
                self.emit(StoreResult(ev.job_id, False, FailReason.NOT_SERVED,
                                      "the lookup ended before the answer"))
            return
        unknown = [k for k in (*ev.hits, *ev.pending) if k not in served.pending]
        if unknown:
            raise LocalProtocolError(f"answer_lookup: keys not pending in lookup {ev.token}")
        for idx in ev.hits.values():
            if type(idx) is not int or not 0 <= idx < self.config.num_blocks:
                raise LocalProtocolError(f"answer_lookup: index {idx!r} for key outside region")
        rnd = self._server_round(served.kv_request_id, served.round_seq)
        if ev.hits and rnd is not None and not SERVER_ROUND.can_fire(rnd, "lookup_pin"):
            self.emit(StoreResult(ev.job_id or 0, False, FailReason.NOT_SERVED,
                                  "the lookup's round no longer takes pins"))
            ev = HostAnswerLookup(ev.token, {}, None, ev.pending)
        self._step(SERVER_LOOKUP, served, "host_answer", ev)

    def _on_write(self, ev: WriteFinished) -> None:
        rnd = self._writes.pop(ev.xfer, None)
        if rnd is None:
            raise LocalProtocolError(f"write {ev.xfer} is not in flight")
        self._step(SERVER_ROUND, rnd, "write_done" if ev.ok else "write_failed", ev)

    def _end_producer(self) -> None:
        for served in list(self._tokens.values()):
            self._step(SERVER_LOOKUP, served, "request_closed")
        for srv in list(self._round_by_serial.values()):
            self._step(SERVER_ROUND, srv, "session_lost")
