"""Consumer role: load rounds and lookups, as the session owns them.

Creates and retires :class:`~p2pfsm.session.client.ClientRound` and
:class:`~p2pfsm.session.client.ClientLookup` instances, allocates round numbers (the
floor and the lookup -> fetch binding) and routes the host's fetch and lookup calls
and the producer's responses (transfer_done, abort_ack, lookup_resp) to them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from p2pfsm.errors import LocalProtocolError, RemoteProtocolError
from p2pfsm.protocol import AbortAck, LookupResp, TransferDone
from p2pfsm.session.client import CLIENT_LOOKUP, CLIENT_ROUND, ClientLookup, ClientRound
from p2pfsm.session.inputs import HostFetch, HostLookup
from p2pfsm.session.machine import SessionMachine
from p2pfsm.session.outputs import FrameIgnored, LoadResult, LookupResult

if TYPE_CHECKING:
    pass


class ConsumerRole(SessionMachine):
    """The session's consumer side: its load rounds and lookups."""

    def forget_load(self, rnd: ClientRound) -> None:
        if rnd.fsm_state == "aborted":
            floor = self._round_floor.get(rnd.kv_request_id) or 0
            self._round_floor.put(rnd.kv_request_id, max(floor, rnd.round_seq + 1), self.now)
        rounds = self._loads[rnd.kv_request_id]
        del rounds[rnd.round_seq]
        if not rounds:
            del self._loads[rnd.kv_request_id]
        self._load_count -= 1
        self._load_jobs.discard(rnd.job_id)

    def _client_round(self, kv_request_id: str, round_seq: int) -> ClientRound | None:
        rounds = self._loads.get(kv_request_id)
        return None if rounds is None else rounds.get(round_seq)

    def _alloc_round(self, kv_request_id: str) -> int:
        """The round for a new load or lookup round of ``kv_request_id``.

        Like vLLM 0.33.0, a request with nothing open starts again at round 0 (its PD
        producers supply only round 0). A round number is never given to two rounds
        that could both still receive frames: live rounds are skipped, and so are rounds
        that ended with an abort whose duplicate abort_ack may still arrive (for a frame
        lifetime, Timeouts.tombstone). Channels are FIFO, so nothing else of an ended
        round can arrive after its terminal frame.
        """
        seq = self._round_floor.get(kv_request_id) or 0
        live = self._loads.get(kv_request_id)
        if live:
            seq = max(seq, max(live) + 1)
        return seq

    def _on_host_fetch(self, ev: HostFetch) -> None:
        self._require_started("fetch")
        self._check_keys(ev.keys, ev.dest_indexes, "fetch", ev.kv_request_id)
        if ev.job_id in self._load_jobs:
            raise LocalProtocolError(f"fetch: job {ev.job_id} is already loading")
        if not self.alive:
            self.emit(LoadResult(ev.job_id, ev.kv_request_id, False, True))
            return
        if not ev.keys:
            self.emit(LoadResult(ev.job_id, ev.kv_request_id, True, True))
            return
        seq = self._lookup_round.pop(ev.kv_request_id, None)
        if seq is None:
            seq = self._alloc_round(ev.kv_request_id)
        rnd = ClientRound(self._owner, ev.job_id, ev.kv_request_id, seq, ev.keys, ev.dest_indexes)
        self._loads.setdefault(ev.kv_request_id, {})[seq] = rnd
        self._load_count += 1
        self._load_jobs.add(ev.job_id)
        CLIENT_ROUND.fire(rnd, "host_fetch", ev)

    def _on_host_lookup(self, ev: HostLookup) -> None:
        self._require_started("lookup")
        self._check_keys(ev.keys, tuple(0 for _ in ev.keys), "lookup", ev.kv_request_id)
        if not self.alive or not ev.keys:
            self.emit(LookupResult(ev.kv_request_id, ev.keys, (False,) * len(ev.keys), False))
            return
        seq = self._lookup_round.get(ev.kv_request_id)
        if seq is None:
            seq = self._alloc_round(ev.kv_request_id)
            self._lookup_round[ev.kv_request_id] = seq
        self._lookup_serial += 1
        lk = ClientLookup(self._owner, self._lookup_serial, ev.kv_request_id, seq, ev.keys)
        self._lookups.setdefault(ev.kv_request_id, []).append(lk)
        self._lookup_by_serial[lk.serial] = lk
        CLIENT_LOOKUP.fire(lk, "host_lookup", ev)

    def _on_transfer_done(self, msg: TransferDone) -> None:
        self._check_gate("recv_response")
        rnd = self._client_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            self.emit(FrameIgnored(msg.TYPE, "no open load for this round (late or duplicate)"))
            return
        self._gate("recv_response", msg)
        CLIENT_ROUND.fire(rnd, "recv_transfer_done", msg)

    def _on_abort_ack(self, msg: AbortAck) -> None:
        self._check_gate("recv_response")
        rnd = self._client_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            self.emit(FrameIgnored(msg.TYPE, "no open load for this round (late or duplicate)"))
            return
        if not CLIENT_ROUND.can_fire(rnd, "recv_abort_ack", msg):
            raise RemoteProtocolError("round_seq", "abort_ack for a round we did not abort")
        self._gate("recv_response", msg)
        CLIENT_ROUND.fire(rnd, "recv_abort_ack", msg)

    def _on_lookup_resp(self, msg: LookupResp) -> None:
        self._check_gate("recv_response")
        lookups = self._lookups.get(msg.kv_request_id, [])
        same = [lk for lk in lookups if lk.keys == msg.keys]
        match = next((lk for lk in same if lk.fsm_state == "probing"), same[0] if same else None)
        if match is None:
            self.emit(FrameIgnored(msg.TYPE, "no open lookup with these keys"))
            return
        self._gate("recv_response", msg)
        CLIENT_LOOKUP.fire(match, "recv_lookup_resp", msg)
        self._drop_closed_lookups(msg.kv_request_id)

    def _drop_closed_lookups(self, kv_request_id: str) -> None:
        lookups = self._lookups.get(kv_request_id)
        if lookups is None:
            return
        for lk in lookups:
            if lk.fsm_state not in ("probing", "expired"):
                del self._lookup_by_serial[lk.serial]
        lookups[:] = [lk for lk in lookups if lk.fsm_state in ("probing", "expired")]
        if not lookups:
            del self._lookups[kv_request_id]

    def _end_consumer(self, load_trigger: str) -> None:
        for rounds in list(self._loads.values()):
            for rnd in list(rounds.values()):
                CLIENT_ROUND.fire(rnd, load_trigger)
        for lookups in list(self._lookups.values()):
            for lk in list(lookups):
                CLIENT_LOOKUP.fire(lk, "session_lost")
        self._lookups.clear()
        self._lookup_by_serial.clear()
        self._lookup_round.clear()
