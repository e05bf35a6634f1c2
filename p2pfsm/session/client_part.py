"""The client part of a session (the consumer role): its load rounds and lookups, and
the tables it owns.

Creates :class:`~p2pfsm.session.client.ClientRound` and
:class:`~p2pfsm.session.client.ClientLookup` instances, retires them when their machine
reaches a terminal state (the session calls :meth:`ClientPart.retire_round` and
:meth:`ClientPart.retire_lookup`), allocates round numbers (the floor and the
lookup -> fetch binding) and routes the host's fetch and lookup calls and the
producer's responses (transfer_done, abort_ack, lookup_resp) to them. It reaches the
session only through its :class:`~p2pfsm.session.owner.Owner`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from p2pfsm.errors import LocalProtocolError, RemoteProtocolError
from p2pfsm.fsm import UnsentFetch
from p2pfsm.protocol import AbortAck, Fetch, FetchRound, LookupResp, Message, TransferDone
from p2pfsm.session.checks import check_keys
from p2pfsm.session.child import ChildEnv
from p2pfsm.session.client import (
    CLIENT_LOOKUP,
    CLIENT_ROUND,
    ClientLookup,
    ClientRound,
    LookupPart,
)
from p2pfsm.session.config import SessionConfig
from p2pfsm.session.inputs import (
    HostFetch,
    HostFinish,
    HostLookup,
    PeerGone,
    TimerFired,
    TimerId,
)
from p2pfsm.session.outputs import FrameIgnored, LoadResult, LookupResult
from p2pfsm.session.owner import Owner
from p2pfsm.session.route import Route
from p2pfsm.session.tombstones import Tombstones

# Named state sets of the models (their [sets]); the code spells no state name.
_MOVES_FLOOR = CLIENT_ROUND.state_set("moves_floor")
_HELD_PAST_SESSION = CLIENT_ROUND.state_set("held_past_session")
_REPORTING = CLIENT_LOOKUP.state_set("reporting")
_UNSENT = CLIENT_ROUND.state_set("unsent")
_LIVE = CLIENT_ROUND.state_set("live")


class ClientPart:
    """The session's client part (it loads from the peer): its load rounds and lookups.

    Args:
        owner: the session that holds this part.
        config: our identity, layout and deadlines.
        env: what each child gets (the session's outbox, deadlines and tracer).
    """

    def __init__(self, owner: Owner, config: SessionConfig, env: ChildEnv) -> None:
        self.owner = owner
        self.config = config
        self.env = env
        self.loads: dict[str, dict[int, ClientRound]] = {}
        self.load_count = 0
        self.load_jobs: set[int] = set()
        # Lowest round number a request may use next: rounds below it ended with an
        # abort whose late abort_ack may still be on the wire (kept a frame lifetime).
        self.round_floor = Tombstones(config.timeouts.tombstone)
        self.lookup_round: dict[str, int] = {}
        self.lookups: dict[str, list[ClientLookup]] = {}
        self.lookup_by_serial: dict[int, ClientLookup] = {}
        self.lookup_serial = 0
        # Rounds whose job has its result (released=False) and whose session is over:
        # their destinations wait for a proof or the bounded hold.
        self.held: dict[tuple[str, int], ClientRound] = {}

    @property
    def busy(self) -> bool:
        """True while a load or lookup is open."""
        return bool(self.loads or self.lookups)

    def withheld(self, message: Message) -> bool:
        """A terminal fetch that must not close a load or lookup of its request still
        open (the profile's unsent_fetch = retire_locally, as vLLM 0.34.0's flush)."""
        return (isinstance(message, Fetch) and not message.keys
                and self.env.behaviour.unsent_fetch is UnsentFetch.RETIRE_LOCALLY
                and self.request_live(message.kv_request_id))

    def request_live(self, kv_request_id: str) -> bool:
        """A load or lookup of the request is open: a terminal fetch would close it."""
        return (kv_request_id in self.lookups or kv_request_id in self.lookup_round
                or any(r.fsm_state in _LIVE for r in self.loads.get(kv_request_id, {}).values()))

    def hand_off(self, take_timer: Callable[[TimerId], bool]) -> None:
        """The handshake's flush: each load round still queued is handed to the transport
        (``handed_off``), or retired first when its load timer is due (``take_timer``
        takes it: the timer fires before the flush)."""
        unsent = [r for rounds in self.loads.values() for r in rounds.values()
                  if r.fsm_state in _UNSENT]
        for rnd in unsent:
            timer = TimerId("load", (rnd.kv_request_id, rnd.round_seq))
            if take_timer(timer):
                self.owner.step(CLIENT_ROUND, rnd, "timer_load", TimerFired(timer))
            else:
                self.owner.step(CLIENT_ROUND, rnd, "handed_off")

    def round_at(self, kv_request_id: str, round_seq: int) -> ClientRound:
        """The load round (open or held past the session) of a timer's key."""
        rnd = self._client_round(kv_request_id, round_seq)
        return self.held[kv_request_id, round_seq] if rnd is None else rnd

    def note(self, rnd: ClientRound) -> None:
        """A round stepped: one now held past the session leaves the open rounds."""
        if rnd.fsm_state in _HELD_PAST_SESSION and (rnd.kv_request_id, rnd.round_seq) \
                not in self.held:
            self._unlist(rnd)
            self.held[rnd.kv_request_id, rnd.round_seq] = rnd

    def release_held(self, ev: PeerGone, trigger: str) -> None:
        """The peer's writes are proven over: every held destination gets ``trigger``."""
        for rnd in list(self.held.values()):
            self.owner.step(CLIENT_ROUND, rnd, trigger, ev)

    def tombstone_tables(self) -> tuple[Tombstones, ...]:
        """This part's per-request tables: the session purges them before every input
        and empties them when it is over."""
        return (self.round_floor,)

    # ------------------------------------------------------------- retiring
    def retire_round(self, rnd: ClientRound) -> None:
        """Drop a load round whose machine reached a terminal state."""
        if rnd.fsm_state in _MOVES_FLOOR:
            # A duplicate abort_ack of this round may still arrive: move the floor.
            floor = self.round_floor.get(rnd.kv_request_id) or 0
            self.round_floor.put(rnd.kv_request_id, max(floor, rnd.round_seq + 1),
                                 self.owner.now)
        if self.held.pop((rnd.kv_request_id, rnd.round_seq), None) is None:
            self._unlist(rnd)

    def _unlist(self, rnd: ClientRound) -> None:
        rounds = self.loads[rnd.kv_request_id]
        del rounds[rnd.round_seq]
        if not rounds:
            del self.loads[rnd.kv_request_id]
        self.load_count -= 1
        self.load_jobs.discard(rnd.job_id)

    def retire_lookup(self, lk: ClientLookup) -> None:
        """Drop a lookup whose machine reached a terminal state."""
        lookups = self.lookups[lk.kv_request_id]
        lookups.remove(lk)
        if not lookups:
            del self.lookups[lk.kv_request_id]
        del self.lookup_by_serial[lk.serial]

    # -------------------------------------------------------------- rounds
    def _client_round(self, kv_request_id: str, round_seq: int) -> ClientRound | None:
        rounds = self.loads.get(kv_request_id)
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
        seq = self.round_floor.get(kv_request_id) or 0
        live = self.loads.get(kv_request_id)
        if live:
            seq = max(seq, max(live) + 1)
        return seq

    # ----------------------------------------------------------- host calls
    def check_host_call(self, ev: HostFetch | HostLookup) -> None:
        """Raise LocalProtocolError for what this part would refuse in ``ev`` (its
        arguments), changing nothing."""
        if isinstance(ev, HostFetch):
            self._check_fetch(ev)
        else:
            self._check_lookup(ev)

    def _check_fetch(self, ev: HostFetch) -> None:
        check_keys(self.config, ev.keys, ev.dest_indexes, "fetch", ev.kv_request_id)
        if len(set(ev.dest_indexes)) != len(ev.dest_indexes):
            twice = next(i for i, n in Counter(ev.dest_indexes).items() if n > 1)
            raise LocalProtocolError(
                f"fetch: destination index {twice} named twice (two blocks cannot land in one)")
        if ev.job_id in self.load_jobs:
            raise LocalProtocolError(f"fetch: job {ev.job_id} is already loading")

    def _check_lookup(self, ev: HostLookup) -> None:
        check_keys(self.config, ev.keys, tuple(0 for _ in ev.keys), "lookup", ev.kv_request_id)

    def on_host_fetch(self, ev: HostFetch, trigger: str) -> None:
        """The host asks to load ``ev.keys`` (the session checked that it started); the
        new round fires ``trigger``."""
        self._check_fetch(ev)
        owner = self.owner
        if not owner.alive:  # over (idle was refused): the session fails the job at once
            owner.step_nested(owner.machine, owner, "host_fetch_over", ev)
            return
        if not ev.keys:
            owner.emit(LoadResult(ev.job_id, ev.kv_request_id, True, True))
            return
        seq = self.lookup_round.pop(ev.kv_request_id, None)
        probed = seq is not None
        if seq is None:
            seq = self._alloc_round(ev.kv_request_id)
        rnd = ClientRound(self.env, ev.job_id, ev.kv_request_id, seq, ev.keys, ev.dest_indexes,
                          probed, not owner.ready)
        self.loads.setdefault(ev.kv_request_id, {})[seq] = rnd
        self.load_count += 1
        self.load_jobs.add(ev.job_id)
        owner.step(CLIENT_ROUND, rnd, trigger, ev)
        lookups = self.lookups.get(ev.kv_request_id)
        for lk in list(lookups) if lookups else ():
            if CLIENT_LOOKUP.can_fire(lk, "request_fetched", ev):  # the profile's choice
                owner.step(CLIENT_LOOKUP, lk, "request_fetched", ev)

    def on_host_lookup(self, ev: HostLookup, trigger: str) -> None:
        """The host asks which of ``ev.keys`` the peer holds (the session checked that
        it started); the new lookup fires ``trigger``."""
        self._check_lookup(ev)
        owner = self.owner
        if not owner.alive:  # over (idle was refused): the session answers all-miss at once
            owner.step_nested(owner.machine, owner, "host_lookup_over", ev)
            return
        if not ev.keys:
            owner.emit(LookupResult(ev.kv_request_id, ev.keys, (), False))
            return
        seq = self.lookup_round.get(ev.kv_request_id)
        if seq is None:
            seq = self._alloc_round(ev.kv_request_id)
            self.lookup_round[ev.kv_request_id] = seq
        self.lookup_serial += 1
        lk = ClientLookup(self.env, self.lookup_serial, ev.kv_request_id, seq, ev.keys)
        self.lookups.setdefault(ev.kv_request_id, []).append(lk)
        self.lookup_by_serial[lk.serial] = lk
        owner.step(CLIENT_LOOKUP, lk, trigger, ev)

    def finish(self, ev: HostFinish, trigger: str, lookup_trigger: str) -> None:
        """The host finished ``ev.kv_request_id``: its loads get ``trigger``, its lookups
        ``lookup_trigger``; a lookup round no fetch took is closed with a terminal fetch."""
        rid = ev.kv_request_id
        owner = self.owner
        for rnd in list(self.loads.get(rid, {}).values()):
            owner.step(CLIENT_ROUND, rnd, trigger, ev)
        for lk in list(self.lookups.get(rid, ())):
            owner.step(CLIENT_LOOKUP, lk, lookup_trigger, ev)
        open_round = self.lookup_round.pop(rid, None)
        if open_round is not None and owner.alive:  # a terminal fetch closes that round
            named = FetchRound(rid, open_round)
            owner.step_nested(owner.machine, owner, "finish_lookup_round", named)

    # -------------------------------------------------------------- frames
    # The frames' routes (``models/inputs.toml``): the dispatch checked each one's gate.
    def on_transfer_done(self, msg: TransferDone, route: Route) -> None:
        owner = self.owner
        rnd = self._client_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            owner.emit(FrameIgnored(msg.TYPE, "no open load for this round (late or duplicate)"))
            return
        owner.step_nested(owner.machine, owner, route.gate, msg)
        owner.step(CLIENT_ROUND, rnd, route.trigger, msg)

    def on_abort_ack(self, msg: AbortAck, route: Route) -> None:
        owner = self.owner
        rnd = self._client_round(msg.kv_request_id, msg.round_seq)
        if rnd is None:
            owner.emit(FrameIgnored(msg.TYPE, "no open load for this round (late or duplicate)"))
            return
        if not CLIENT_ROUND.can_fire(rnd, route.trigger, msg):
            raise RemoteProtocolError("round_seq", "abort_ack for a round we did not abort")
        owner.step_nested(owner.machine, owner, route.gate, msg)
        owner.step(CLIENT_ROUND, rnd, route.trigger, msg)

    def on_lookup_resp(self, msg: LookupResp, route: Route) -> None:
        """Match each (key, hit) pair on its own (the producer may split and coalesce
        answers): to a lookup of the request still waiting for that key, in the round of
        the oldest such lookup (the producer answers in arrival order, so the pair is of
        that round: never given to a later round's lookup), the oldest probing one there,
        else the oldest expired one (a producer may drop a lookup unanswered, and its
        expired lookup must not swallow the answer to a retry of the same round)."""
        owner = self.owner
        lookups = self.lookups.get(msg.kv_request_id, ())
        parts: dict[ClientLookup, dict[bytes, bool]] = {}
        for key, hit in zip(msg.keys, msg.hits, strict=True):
            waiting = [lk for lk in lookups if lk.waits_for(key) and key not in parts.get(lk, ())]
            if waiting:
                same = [lk for lk in waiting if lk.round_seq == waiting[0].round_seq]
                lk = next((x for x in same if x.fsm_state in _REPORTING), same[0])
                parts.setdefault(lk, {})[key] = hit
        if not parts:
            owner.emit(FrameIgnored(msg.TYPE, "no open lookup waits for these keys"))
            return
        owner.step_nested(owner.machine, owner, route.gate, msg)
        for lk, pairs in parts.items():
            owner.step(CLIENT_LOOKUP, lk, route.trigger, LookupPart(tuple(pairs.items())))

    # ----------------------------------------------------------------- end
    def end(self, trigger: str) -> None:
        """The session ended: every load and lookup gets ``trigger`` (``session_lost``,
        or ``session_lost_unsent`` when the session was never ready)."""
        owner = self.owner
        for rounds in list(self.loads.values()):
            for rnd in list(rounds.values()):
                owner.step(CLIENT_ROUND, rnd, trigger)
        for lookups in list(self.lookups.values()):
            for lk in list(lookups):
                owner.step(CLIENT_LOOKUP, lk, trigger)
        self.lookup_round.clear()
