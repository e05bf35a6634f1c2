"""Consumer role: load rounds and lookups, as the session owns them.

Creates :class:`~p2pfsm.session.client.ClientRound` and
:class:`~p2pfsm.session.client.ClientLookup` instances, retires them when their machine
reaches a terminal state (:meth:`ConsumerRole._retire`), allocates round numbers (the
floor and the lookup -> fetch binding) and routes the host's fetch and lookup calls
and the producer's responses (transfer_done, abort_ack, lookup_resp) to them.
"""

from __future__ import annotations

from collections import Counter

from p2pfsm.errors import LocalProtocolError, RemoteProtocolError
from p2pfsm.protocol import AbortAck, LookupResp, TransferDone
from p2pfsm.session.client import (
    CLIENT_LOOKUP,
    CLIENT_ROUND,
    ClientLookup,
    ClientRound,
    LookupPart,
)
from p2pfsm.session.inputs import HostFetch, HostLookup
from p2pfsm.session.outputs import FailReason, FrameIgnored, LoadResult, LookupResult
from p2pfsm.session.steps import ChildSteps

# Named state sets of the models (their [sets]); the code spells no state name.
_MOVES_FLOOR = CLIENT_ROUND.state_set("moves_floor")
_REPORTING = CLIENT_LOOKUP.state_set("reporting")


class ConsumerRole(ChildSteps):
    """The session's consumer side: its load rounds and lookups."""

    def _retire(self, obj: object) -> None:
        """Drop a load round or lookup whose machine reached a terminal state."""
        if isinstance(obj, ClientRound):
            if obj.fsm_state in _MOVES_FLOOR:
                # A duplicate abort_ack of this round may still arrive: move the floor.
                floor = self._round_floor.get(obj.kv_request_id) or 0
                self._round_floor.put(obj.kv_request_id, max(floor, obj.round_seq + 1),
                                      self.now)
            rounds = self._loads[obj.kv_request_id]
            del rounds[obj.round_seq]
            if not rounds:
                del self._loads[obj.kv_request_id]
            self._load_count -= 1
            self._load_jobs.discard(obj.job_id)
        elif isinstance(obj, ClientLookup):
            lookups = self._lookups[obj.kv_request_id]
            lookups.remove(obj)
            if not lookups:
                del self._lookups[obj.kv_request_id]
            del self._lookup_by_serial[obj.serial]
        else:
            super()._retire(obj)

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

    def check_host_call(self, ev: HostFetch | HostLookup) -> None:
        """Raise LocalProtocolError for what this session would refuse in ``ev`` (its
        arguments), changing nothing: for a host call held back to be fed later."""
        if isinstance(ev, HostFetch):
            self._check_fetch(ev)
        else:
            self._check_lookup(ev)

    def _check_fetch(self, ev: HostFetch) -> None:
        self._check_keys(ev.keys, ev.dest_indexes, "fetch", ev.kv_request_id)
        if len(set(ev.dest_indexes)) != len(ev.dest_indexes):
            twice = next(i for i, n in Counter(ev.dest_indexes).items() if n > 1)
            raise LocalProtocolError(
                f"fetch: destination index {twice} named twice (two blocks cannot land in one)")
        if ev.job_id in self._load_jobs:
            raise LocalProtocolError(f"fetch: job {ev.job_id} is already loading")

    def _check_lookup(self, ev: HostLookup) -> None:
        self._check_keys(ev.keys, tuple(0 for _ in ev.keys), "lookup", ev.kv_request_id)

    def _on_host_fetch(self, ev: HostFetch) -> None:
        self._require_started("fetch")
        self._check_fetch(ev)
        if not self.alive:
            self.emit(LoadResult(ev.job_id, ev.kv_request_id, False, True,
                                 FailReason.SESSION_ENDED, "the session is not alive"))
            return
        if not ev.keys:
            self.emit(LoadResult(ev.job_id, ev.kv_request_id, True, True))
            return
        seq = self._lookup_round.pop(ev.kv_request_id, None)
        if seq is None:
            seq = self._alloc_round(ev.kv_request_id)
        rnd = ClientRound(self._env, ev.job_id, ev.kv_request_id, seq, ev.keys, ev.dest_indexes)
        self._loads.setdefault(ev.kv_request_id, {})[seq] = rnd
        self._load_count += 1
        self._load_jobs.add(ev.job_id)
        self._step(CLIENT_ROUND, rnd, "host_fetch", ev)

    def _on_host_lookup(self, ev: HostLookup) -> None:
        self._require_started("lookup")
        self._check_lookup(ev)
        if not self.alive or not ev.keys:
            reason, why = ((FailReason.SESSION_ENDED, "the session is not alive")
                           if not self.alive else (None, ""))
            self.emit(LookupResult(ev.kv_request_id, ev.keys, (False,) * len(ev.keys), False,
                                   reason, why))
            return
        seq = self._lookup_round.get(ev.kv_request_id)
        if seq is None:
            seq = self._alloc_round(ev.kv_request_id)
            self._lookup_round[ev.kv_request_id] = seq
        self._lookup_serial += 1
        lk = ClientLookup(self._env, self._lookup_serial, ev.kv_request_id, seq, ev.keys)
        self._lookups.setdefault(ev.kv_request_id, []).append(lk)
        self._lookup_by_serial[lk.serial] = lk
        self._step(CLIENT_LOOKUP, lk, "host_lookup", ev)

    def _on_transfer_done(self, msg: TransferDone) -> None:
        self._check_gate("recv_response")
        rnd = self._client_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            self.emit(FrameIgnored(msg.TYPE, "no open load for this round (late or duplicate)"))
            return
        self._gate("recv_response", msg)
        self._step(CLIENT_ROUND, rnd, "recv_transfer_done", msg)

    def _on_abort_ack(self, msg: AbortAck) -> None:
        self._check_gate("recv_response")
        rnd = self._client_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            self.emit(FrameIgnored(msg.TYPE, "no open load for this round (late or duplicate)"))
            return
        if not CLIENT_ROUND.can_fire(rnd, "recv_abort_ack", msg):
            raise RemoteProtocolError("round_seq", "abort_ack for a round we did not abort")
        self._gate("recv_response", msg)
        self._step(CLIENT_ROUND, rnd, "recv_abort_ack", msg)

    def _on_lookup_resp(self, msg: LookupResp) -> None:
        """Match each (key, hit) pair on its own (the producer may split and coalesce
        answers): to a lookup of the request still waiting for that key, in the round of
        the oldest such lookup (the producer answers in arrival order, so the pair is of
        that round: never given to a later round's lookup), the oldest probing one there,
        else the oldest expired one (a producer may drop a lookup unanswered, and its
        expired lookup must not swallow the answer to a retry of the same round)."""
        self._check_gate("recv_response")
        lookups = self._lookups.get(msg.kv_request_id, ())
        parts: dict[ClientLookup, dict[bytes, bool]] = {}
        for key, hit in zip(msg.keys, msg.hits, strict=True):
            waiting = [lk for lk in lookups if lk.waits_for(key) and key not in parts.get(lk, ())]
            if waiting:
                same = [lk for lk in waiting if lk.round_seq == waiting[0].round_seq]
                lk = next((x for x in same if x.fsm_state in _REPORTING), same[0])
                parts.setdefault(lk, {})[key] = hit
        if not parts:
            self.emit(FrameIgnored(msg.TYPE, "no open lookup waits for these keys"))
            return
        self._gate("recv_response", msg)
        for lk, pairs in parts.items():
            self._step(CLIENT_LOOKUP, lk, "recv_lookup_resp", LookupPart(tuple(pairs.items())))

    def _end_consumer(self, load_trigger: str) -> None:
        for rounds in list(self._loads.values()):
            for rnd in list(rounds.values()):
                self._step(CLIENT_ROUND, rnd, load_trigger)
        for lookups in list(self._lookups.values()):
            for lk in list(lookups):
                self._step(CLIENT_LOOKUP, lk, "session_lost")
        self._lookup_round.clear()
