"""Producer role: serve rounds and served lookups, as the session owns them.

Creates and retires :class:`~p2pfsm.session.server.ServerRound` and
:class:`~p2pfsm.session.server.ServerLookup` instances and routes the consumer's
requests (fetch, lookup, abort_fetch), the host's supply and lookup answers and the
data plane's write completions to them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from p2pfsm.errors import LocalProtocolError, MalformedFrame, RemoteProtocolError
from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, Lookup, TransferDone, check_block_indexes
from p2pfsm.session.inputs import HostAnswerLookup, HostSupply, TimerId, WriteFinished
from p2pfsm.session.machine import SessionMachine
from p2pfsm.session.outputs import FetchArrived, StoreResult
from p2pfsm.session.server import SERVER_LOOKUP, SERVER_ROUND, LookupPin, ServerLookup, ServerRound

if TYPE_CHECKING:
    pass


class ProducerRole(SessionMachine):
    """The session's producer side: its serve rounds and served lookups."""

    def bind_store_job(self, job_id: int, rnd: ServerRound) -> None:
        self._store_jobs[job_id] = rnd

    def new_write(self, rnd: ServerRound) -> int:
        xfer = self._next_xfer
        self._next_xfer += 1
        self._writes[xfer] = rnd
        return xfer

    def forget_round(self, rnd: ServerRound) -> None:
        rounds = self._rounds[rnd.kv_request_id]
        del rounds[rnd.round_seq]
        if not rounds:
            del self._rounds[rnd.kv_request_id]
        del self._round_by_serial[rnd.serial]
        for job in rnd.jobs:
            self._store_jobs.pop(job, None)
        self.disarm(TimerId("store", (rnd.serial,)))
        self.disarm(TimerId("demand", (rnd.serial,)))

    def is_first_lookup(self, served: ServerLookup) -> bool:
        return self._served[served.kv_request_id][0] is served

    def forget_lookup(self, served: ServerLookup) -> None:
        del self._tokens[served.token]
        queue = self._served[served.kv_request_id]
        queue.remove(served)
        if not queue:
            del self._served[served.kv_request_id]

    def pin_lookup_hits(self, kv_request_id: str, round_seq: int, pin: LookupPin) -> None:
        rnd = self._round_for(kv_request_id, round_seq, "lookup")
        SERVER_ROUND.fire(rnd, "lookup_pin", pin)

    def expire_lookup_round(self, rnd: ServerRound) -> None:
        """The lookup pins of ``rnd`` expired before its fetch: that fetch fails fast."""
        assert rnd.round_seq is not None
        self._expired_lookups.put(rnd.kv_request_id, rnd.round_seq, self.now)

    def _round_for(self, kv_request_id: str, round_seq: int | None,
                   origin: str = "host") -> ServerRound:
        rounds = self._rounds.setdefault(kv_request_id, {})
        rnd = rounds.get(round_seq)
        if rnd is None:
            self._round_serial += 1
            rnd = ServerRound(self._owner, self._round_serial, kv_request_id, round_seq, origin)
            rounds[round_seq] = rnd
            self._round_by_serial[rnd.serial] = rnd
        return rnd

    def _server_round(self, kv_request_id: str, round_seq: int | None) -> ServerRound | None:
        rounds = self._rounds.get(kv_request_id)
        return None if rounds is None else rounds.get(round_seq)

    def _settle(self, rnd: ServerRound) -> None:
        if rnd.fsm_state != "done":
            SERVER_ROUND.fire(rnd, "settle")

    def _settle_lookups(self, kv_request_id: str) -> None:
        # Answer in arrival order: stop at the first lookup that must still wait.
        while self._served.get(kv_request_id):
            head = self._served[kv_request_id][0]
            if SERVER_LOOKUP.fire(head, "settle") != "answered":
                return

    def _close_request(self, kv_request_id: str, trigger: str) -> None:
        """The request ended (terminal fetch or host finish): close its served side."""
        self._expired_lookups.pop(kv_request_id)
        for served in list(self._served.get(kv_request_id, ())):
            SERVER_LOOKUP.fire(served, "request_closed")
        for rnd in list(self._rounds.get(kv_request_id, {}).values()):
            if SERVER_ROUND.can_fire(rnd, trigger):
                SERVER_ROUND.fire(rnd, trigger)
                self._settle(rnd)

    def _on_fetch(self, msg: Fetch) -> None:
        self._check_gate("recv_request")
        assert self.peer is not None  # the gate admits requests only after the peer's connect
        if msg.is_terminal:
            self._gate("recv_request", msg)
            self._close_request(msg.kv_request_id, "recv_terminal_fetch")
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
            self.send(TransferDone(msg.kv_request_id, False, msg.round_seq))
            return
        if rnd is None:
            unbound = self._server_round(msg.kv_request_id, None)
            if unbound is not None and unbound.fsm_state in ("supplied", "supply_closed"):
                rnd = unbound
        if rnd is not None and not SERVER_ROUND.can_fire(rnd, "recv_fetch", msg):
            raise RemoteProtocolError(
                "round_seq", f"duplicate fetch for {msg.kv_request_id}/{msg.round_seq}")
        self._gate("recv_request", msg)
        if rnd is not None and rnd.round_seq is None:
            rounds = self._rounds[msg.kv_request_id]
            del rounds[None]
            rnd.round_seq = msg.round_seq
            rounds[msg.round_seq] = rnd
        rnd = self._round_for(msg.kv_request_id, msg.round_seq)
        supplied = tuple(k for k in msg.keys if k in rnd.supply)
        SERVER_ROUND.fire(rnd, "recv_fetch", msg)
        self.emit(FetchArrived(msg.kv_request_id, msg.round_seq, msg.keys, supplied))
        self._settle(rnd)

    def _on_lookup(self, msg: Lookup) -> None:
        self._check_gate("recv_request")
        rnd = self._server_round(msg.kv_request_id, msg.round_seq)
        if rnd is not None and rnd.demanded:
            raise RemoteProtocolError(
                "round_seq", f"lookup for {msg.kv_request_id}/{msg.round_seq} after its fetch")
        self._gate("recv_request", msg)
        self._next_token += 1
        served = ServerLookup(self._owner, self._next_token, msg.kv_request_id, msg.round_seq,
                              msg.keys)
        self._tokens[served.token] = served
        self._served.setdefault(msg.kv_request_id, []).append(served)
        SERVER_LOOKUP.fire(served, "recv_lookup", msg)
        self._settle_lookups(msg.kv_request_id)

    def _on_abort_fetch(self, msg: AbortFetch) -> None:
        self._check_gate("recv_request")
        self._gate("recv_request", msg)
        rnd = self._server_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            # Nothing of that round is in flight (unknown or already ended): ack at once.
            self.send(AbortAck(msg.kv_request_id, msg.round_seq))
            return
        SERVER_ROUND.fire(rnd, "recv_abort_fetch", msg)
        self._settle(rnd)

    def _on_host_supply(self, ev: HostSupply) -> None:
        self._require_started("supply")
        self._check_keys(ev.keys, ev.local_indexes, "supply", ev.kv_request_id)
        if ev.job_id in self._store_jobs:
            raise LocalProtocolError(f"supply: job {ev.job_id} is already pinned")
        if self.fsm_state in ("dead", "closed"):
            self.emit(StoreResult(ev.job_id, False))
            return
        rnd = self._supply_target(ev)
        SERVER_ROUND.fire(rnd, "host_supply", ev)
        self._settle(rnd)

    def _supply_target(self, ev: HostSupply) -> ServerRound:
        """The round PD supply (which names no round) belongs to.

        The PD round whose demand names one of the keys; else the parked unbound round;
        else the latest PD round that has ended its supply (it rejects the job at once);
        else a new unbound round that the next fetch of the request adopts.
        """
        rounds = [r for r in self._rounds.get(ev.kv_request_id, {}).values()
                  if r.origin == "host"]
        for rnd in rounds:
            if rnd.demand and any(k in rnd.demand for k in ev.keys):
                return rnd
        unbound = self._server_round(ev.kv_request_id, None)
        if unbound is not None:
            return unbound
        closed = [r for r in rounds if r.fsm_state != "serving"]
        if closed:
            return closed[-1]
        serving = [r for r in rounds if r.fsm_state == "serving"]
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
                self.emit(StoreResult(ev.job_id, False))
            return
        unknown = [k for k in (*ev.hits, *ev.pending) if k not in served.pending]
        if unknown:
            raise LocalProtocolError(f"answer_lookup: keys not pending in lookup {ev.token}")
        for idx in ev.hits.values():
            if type(idx) is not int or not 0 <= idx < self.config.num_blocks:
                raise LocalProtocolError(f"answer_lookup: index {idx!r} for key outside region")
        rnd = self._server_round(served.kv_request_id, served.round_seq)
        if ev.hits and rnd is not None and not SERVER_ROUND.can_fire(rnd, "lookup_pin"):
            self.emit(StoreResult(ev.job_id or 0, False))
            ev = HostAnswerLookup(ev.token, {}, None, ev.pending)
        SERVER_LOOKUP.fire(served, "host_answer", ev)
        self._settle_lookups(served.kv_request_id)

    def _on_write(self, ev: WriteFinished) -> None:
        rnd = self._writes.pop(ev.xfer, None)
        if rnd is None:
            raise LocalProtocolError(f"write {ev.xfer} is not in flight")
        SERVER_ROUND.fire(rnd, "write_done" if ev.ok else "write_failed", ev)
        self._settle(rnd)

    def _end_producer(self) -> None:
        for served in list(self._tokens.values()):
            SERVER_LOOKUP.fire(served, "request_closed")
        for srv in list(self._round_by_serial.values()):
            SERVER_ROUND.fire(srv, "session_lost")
            self._settle(srv)
