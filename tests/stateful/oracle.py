"""The oracle: a reference model of what each host is told, judged on every session call.

Written from the models' tables (``models/client_round.toml``, ``client_lookup.toml``,
``server_round.toml``) and the outputs' documented meaning (``p2pfsm/session/outputs.py``),
never from the session code. It hears every ``Session.handle`` call (a driver hook: the
input and the outputs) and keeps, per node, only what a host can know: the loads it
started and the rounds their fetches went out in, the lookups it sent, the stores it
gave, the rounds it heard of (``FetchArrived``) and the frames that crossed the wire.
From that it predicts, for each call:

* **loads** (client_round): a ``transfer_done`` of a round gives exactly that round's job
  its result, with the producer's verdict (success, or ``peer_failed``); an
  ``abort_ack`` gives an aborting round's job its failure with the abort's cause
  (``timeout`` after the load deadline, ``finished`` after the host's finish); the load
  deadline and a finish send the round's ``abort_fetch`` and report nothing yet, the
  abort_ack deadline re-sends it; a session's death fails every open load with
  ``session_ended``, released only when its fetch never went out; nothing else gives a
  load a result;
* **lookups** (client_lookup): each result answers an open lookup of that request and
  keys; a hit is a key the peer holds (and, answered in one go, every held key is a hit);
  an unanswered result's reason is its step's cause (lookup deadline ``timeout``, finish
  ``finished``, death ``session_ended``), and a finish or death answers every open lookup
  of the request (or session) in that step;
* **stores and rounds** (server_round): a store succeeds only where its round's
  ``transfer_done(true)`` goes out; ``session_ended`` only on a dead session; a round the
  host heard of ends once (``RoundEnded``), ``served`` exactly when its transfer_done(true)
  goes out, its ``why`` the step's cause (abort_fetch ``aborted``, terminal fetch
  ``peer_finished``, death ``session_ended``, demand deadline ``demand_timeout``, a failed
  write ``write_failed``, decline ``declined``, a request the host finished ``failed``), and
  an abort_fetch or a death in that step ends each such round it names;
* **frames**: a fetch carries its load's keys and destination blocks; an abort_fetch names
  an aborting round; a terminal (empty) fetch only for a request the host finished; a
  lookup carries a host lookup's keys; a producer replies (transfer_done or abort_ack) to
  a round at most as often as the peer asked about it (fetch, abort_fetch);
  ``FetchArrived`` and ``LookupRequest`` repeat the frame that caused them.

A disagreement raises :class:`OracleMismatch` inside the step (hypothesis reports the
steps that led there). Where the oracle cannot know (which of two identical lookups a
part answers), it accepts any that fits.
"""

from __future__ import annotations

import re
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from p2pfsm.protocol import (
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    Lookup,
    LookupResp,
    Message,
    TransferDone,
    decode,
)
from p2pfsm.session import (
    FailReason,
    FetchArrived,
    FrameIgnored,
    FrameReceived,
    HostAnswerLookup,
    HostClose,
    HostDecline,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    Input,
    LoadResult,
    LookupRequest,
    LookupResult,
    Output,
    ProtocolViolation,
    RoundEnded,
    SendFrame,
    SendToLostPeer,
    SessionDead,
    StartWrite,
    StoreResult,
    TimerFired,
    WriteFinished,
)

_STALE = (Fetch, AbortFetch, Lookup, LookupResp, TransferDone, AbortAck)
"""A peer's requests and responses (what a dead session answers)."""


class OracleMismatch(AssertionError):
    """A session told its host (or its peer) something the reference model does not."""


@dataclass
class OLoad:
    job: int
    rid: str
    keys: tuple[bytes, ...]
    dest: tuple[int, ...]
    round: int | None = None
    """Its round (None: not known yet, learnt from its fetch or a deadline of it)."""
    sent: bool = False
    """Its fetch went out (queued before the session is ready: not yet)."""
    why: FailReason | None = None
    """Set while aborting: what the abort's eventual result says."""


@dataclass
class OLookup:
    rid: str
    keys: tuple[bytes, ...]


@dataclass
class ONode:
    loads: dict[int, OLoad] = field(default_factory=dict)
    lookups: list[OLookup] = field(default_factory=list)
    asked_lookups: set[tuple[str, tuple[bytes, ...]]] = field(default_factory=set)
    """Every (request, keys) the host looked up (a queued lookup frame still goes out
    after its lookup ended)."""
    stores: dict[int, str | None] = field(default_factory=dict)
    """Open store jobs -> their request (None: a lookup pin)."""
    heard: set[tuple[str, int]] = field(default_factory=set)
    """Rounds the host heard of (FetchArrived) that have not ended (RoundEnded)."""
    looked: set[tuple[str, int]] = field(default_factory=set)
    """Rounds the host heard of through a LookupRequest only (their pins may be fetched
    without a FetchArrived: they may be told ended, once)."""
    fetched: set[tuple[str, int]] = field(default_factory=set)
    """Rounds a fetch frame named that have not been told ended (a round served from
    supply the host gave before it finished the request is told ended unannounced)."""
    ended: set[tuple[str, int]] = field(default_factory=set)
    asked: Counter[tuple[str, int]] = field(default_factory=Counter)
    """(request, round) -> fetches and abort_fetches received (what a reply answers)."""
    replied: Counter[tuple[str, int]] = field(default_factory=Counter)
    finished: dict[str, float] = field(default_factory=dict)
    """Requests the host finished -> when (the session forgets a finish after the
    tombstone lifetime, not before)."""
    dead: bool = False
    acked_in: bool = False
    acked_out: bool = False
    incarnation: int | None = None
    """The peer's incarnation, from its first connect."""
    last_disconnect: float = float("-inf")
    pending_why: dict[tuple[str, int], FailReason] = field(default_factory=dict)
    """Load deadlines that fired for a round whose fetch is still queued among several
    of its request (which load it is shows when the fetch goes out)."""
    tokens: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Lookup tokens the host was asked to answer -> the (request, round) they name."""
    pins: dict[tuple[str, int], dict[bytes, tuple[int, int]]] = field(default_factory=dict)
    """(request, round) -> key -> (local block, store job) the host's lookup answers
    pinned for that round (valid while the job is open)."""
    peer_finished: set[str] = field(default_factory=set)
    """Requests the peer finished (its terminal fetch arrived)."""


def _message(event: Input) -> Message | None:
    if not isinstance(event, FrameReceived):
        return None
    try:
        return decode(event.frame)
    except Exception:
        return None


def _brief(item: object) -> str:
    """An input or output, its frame decoded, keys shortened."""
    if isinstance(item, FrameReceived):
        item = _message(item) or item
    if isinstance(item, SendFrame):
        item = item.message
    return re.sub(r"b'[^']{12,}'", "k", repr(item))


def _sent(outputs: Sequence[Output]) -> list[Message]:
    return [o.message for o in outputs if isinstance(o, SendFrame)]


class Oracle:
    """Judges each call of either node's session (a :class:`CallRecorder`).

    Args:
        holds: per node, the keys its host holds (what a lookup of them must find).
        exact_lookups: a lookup answered in full finds every held key (off when a host
            may defer or hold back answers until a deadline makes them MISS).
        fifo: frames are neither duplicated nor reordered (a duplicated fetch may open
            its round again: off, a round may be heard of twice).
        clock, tombstone: the sessions' clock and ``Timeouts.tombstone``: a finish is
            remembered at least that long.
        by_peer: the hook names the remote peer of one node's sessions (a real
            :class:`~p2pfsm.executor.node.Node`), not the node: ``holds`` is keyed by that
            peer, and a new session with it (``HostStart``) starts afresh.
    """

    def __init__(self, holds: dict[str, frozenset[bytes]], exact_lookups: bool = True,
                 fifo: bool = True, by_peer: bool = False,
                 clock: Callable[[], float] = time.monotonic, tombstone: float = 60.0) -> None:
        self.holds = holds
        self.clock = clock
        self.tombstone = tombstone
        self.exact_lookups = exact_lookups
        self.fifo = fifo
        self.by_peer = by_peer
        self.nodes: dict[str, ONode] = {} if by_peer else {n: ONode() for n in holds}
        self.calls = 0
        self.checked: Counter[str] = Counter()
        self.tracer = None  # a node's call hook may lend its sessions a tracer: none
        self.recent: deque[tuple[str, Input, list[Output]]] = deque(maxlen=12)

    def other(self, node: str) -> str:
        return next(n for n in self.nodes if n != node)

    def truth(self, node: str) -> frozenset[bytes]:
        """The keys ``node``'s peer holds."""
        return self.holds.get(node if self.by_peer else self.other(node), frozenset())

    def fail(self, node: str, event: Input, what: str) -> None:
        calls = "\n".join(f"  {n}: {type(e).__name__} {_brief(e)} -> "
                          f"{[_brief(o) for o in outs]}" for n, e, outs in self.recent)
        raise OracleMismatch(f"oracle, {node} on {type(event).__name__}: {what}\n"
                             f"the last calls (node: input -> outputs):\n{calls}")

    # ---------------------------------------------------------- the hook
    def discard(self) -> None:
        """A call raised: it changed nothing."""

    def close(self) -> None:
        """The node closed (a node's call hook is closed with it)."""

    def record(self, peer_id: str, state_before: str, event: Input, started_ns: int,
               outputs: Sequence[Output]) -> None:
        self.calls += 1
        self.recent.append((peer_id, event, list(outputs)))
        if self.by_peer and (peer_id not in self.nodes or isinstance(event, HostStart)):
            self.nodes[peer_id] = ONode()
        node = self.nodes[peer_id]
        msg = _message(event)
        if isinstance(msg, Fetch | AbortFetch):
            node.asked[(msg.kv_request_id, msg.round_seq)] += 1
        if isinstance(msg, Fetch) and msg.keys:
            node.fetched.add((msg.kv_request_id, msg.round_seq))
        died = any(isinstance(o, SessionDead) for o in outputs) or isinstance(event, HostClose)
        self._host_input(peer_id, node, event)
        self._frames_out(peer_id, node, event, outputs)
        self._load_results(peer_id, node, event, msg, died, outputs)
        self._lookup_results(peer_id, node, event, died, outputs)
        self._producer(peer_id, node, event, msg, died, outputs)
        self._handshake(peer_id, node, event, msg, outputs)
        self._stale(peer_id, node, state_before, event, msg, outputs)
        self._pinned_writes(peer_id, node, state_before, event, msg, died, outputs)
        if died:
            node.dead = True

    # ---------------------------------------------------------- inputs
    def _host_input(self, name: str, node: ONode, event: Input) -> None:
        if isinstance(event, HostFetch):
            node.loads[event.job_id] = OLoad(event.job_id, event.kv_request_id, event.keys,
                                             event.dest_indexes)
        elif isinstance(event, HostLookup):
            node.lookups.append(OLookup(event.kv_request_id, event.keys))
            node.asked_lookups.add((event.kv_request_id, event.keys))
        elif isinstance(event, HostSupply):
            node.stores[event.job_id] = event.kv_request_id
        elif isinstance(event, HostAnswerLookup) and event.job_id is not None:
            node.stores[event.job_id] = None
        elif isinstance(event, HostFinish):
            node.finished[event.kv_request_id] = self.clock()

    # ---------------------------------------------------------- frames
    def _frames_out(self, name: str, node: ONode, event: Input,
                    outputs: Sequence[Output]) -> None:
        aborts: list[tuple[str, int]] = []
        for m in _sent(outputs):
            if isinstance(m, Fetch) and m.keys:
                load = next((ld for ld in node.loads.values()
                             if not ld.sent and ld.round in (None, m.round_seq)
                             and ld.rid == m.kv_request_id
                             and ld.keys == m.keys and ld.dest == m.block_indexes), None)
                if load is None:
                    self.fail(name, event, f"a fetch {m.kv_request_id}/{m.round_seq} no open "
                              f"load asked for (keys or blocks differ): {m}")
                    return
                load.round = m.round_seq
                load.sent = True
                if (m.kv_request_id, m.round_seq) in node.pending_why:
                    load.why = node.pending_why.pop((m.kv_request_id, m.round_seq))
            elif isinstance(m, Fetch):
                if m.kv_request_id not in node.finished:
                    self.fail(name, event, f"a terminal fetch of {m.kv_request_id}, which "
                              "the host never finished")
            elif isinstance(m, AbortFetch):
                aborts.append((m.kv_request_id, m.round_seq))
            elif isinstance(m, Lookup):
                if (m.kv_request_id, m.keys) not in node.asked_lookups:
                    self.fail(name, event, f"a lookup no host lookup asked for: {m}")
            elif isinstance(m, TransferDone | AbortAck):
                key = (m.kv_request_id, m.round_seq)
                node.replied[key] += 1
                if node.replied[key] > node.asked[key]:
                    self.fail(name, event, f"{m.TYPE} {key} replies more often than the "
                              f"peer asked ({node.asked[key]} fetches and aborts)")
        self._abort_frames(name, node, event, aborts)

    def _abort_frames(self, name: str, node: ONode, event: Input,
                      aborts: list[tuple[str, int]]) -> None:
        """Which rounds this call must abort (send abort_fetch for), and that nothing
        else is aborted."""
        must: set[tuple[str, int]] = set()
        if isinstance(event, TimerFired) and event.timer.kind in ("load", "abort_ack"):
            key = (str(event.timer.key[0]), int(event.timer.key[1]))
            load = self._load_of(node, key)
            if load is None:  # its fetch is still queued: which load is it?
                unsent = [ld for ld in node.loads.values()
                          if not ld.sent and ld.round is None and ld.rid == key[0]]
                if len(unsent) > 1 or key in node.pending_why:
                    # Known once its fetch goes out (rounds are the session's to number).
                    if event.timer.kind == "load":
                        if key in node.pending_why:
                            self.fail(name, event, f"the load deadline of {key} fired twice")
                        node.pending_why[key] = FailReason.TIMEOUT
                    return
                load = unsent[0] if unsent else None
            if load is None:
                self.fail(name, event, f"a {event.timer.kind} deadline of {key}, which no "
                          "open load's fetch went out in")
                return
            load.round = key[1]
            if event.timer.kind == "load":
                if load.why is not None:
                    self.fail(name, event, f"the load deadline of {key} fired while aborting")
                load.why = FailReason.TIMEOUT
            elif load.why is None:
                self.fail(name, event, f"the abort_ack deadline of {key} fired while loading")
            if load.sent:  # else the abort is queued behind its fetch
                must.add(key)
        elif isinstance(event, HostFinish) and not node.dead:
            for load in node.loads.values():
                if load.rid == event.kv_request_id and load.why is None:
                    load.why = FailReason.FINISHED
                    if load.sent:
                        must.add((load.rid, load.round))  # type: ignore[arg-type]
        for key in aborts:
            load = self._load_of(node, key)
            if load is None or load.why is None:
                self.fail(name, event, f"an abort_fetch of {key}, which is no aborting load")
        if not node.dead and not must <= set(aborts):
            self.fail(name, event, f"no abort_fetch sent for {sorted(must - set(aborts))}")
        self.checked["abort frames"] += bool(must)

    @staticmethod
    def _load_of(node: ONode, key: tuple[str, int]) -> OLoad | None:
        return next((ld for ld in node.loads.values()
                     if (ld.rid, ld.round) == key), None)

    # ---------------------------------------------------------- loads
    def _load_results(self, name: str, node: ONode, event: Input, msg: Message | None,
                      died: bool, outputs: Sequence[Output]) -> None:
        expected: dict[int, tuple[bool, bool, FailReason | None]] = {}
        if isinstance(msg, TransferDone) and not node.dead:
            load = self._load_of(node, (msg.kv_request_id, msg.round_seq))
            if load is not None:
                expected[load.job] = (msg.success, True,
                                      None if msg.success else FailReason.PEER_FAILED)
        elif isinstance(msg, AbortAck) and not node.dead:
            load = self._load_of(node, (msg.kv_request_id, msg.round_seq))
            if load is not None and load.why is not None:
                expected[load.job] = (False, True, load.why)
        if died:
            for load in node.loads.values():
                if load.job not in expected:
                    expected[load.job] = (False, not load.sent, FailReason.SESSION_ENDED)
        may_refuse = isinstance(event, HostFetch) and node.dead
        if may_refuse:  # a fetch on a dead session: refused by its result at once
            expected[event.job_id] = (False, True, FailReason.SESSION_ENDED)
        got = {o.job_id: o for o in outputs if isinstance(o, LoadResult)}
        for job, res in got.items():
            load = node.loads.get(job)
            if load is None:
                self.fail(name, event, f"a result for load {job}, which has none open")
                return
            if job not in expected:
                self.fail(name, event, f"load {job} ({load.rid}/{load.round}) got a result "
                          f"this step gives it no cause for: {res}")
            success, released, reason = expected[job]
            if (res.kv_request_id, res.success, res.released, res.reason) != (
                    load.rid, success, released, reason):
                self.fail(name, event, f"load {job} ({load.rid}/{load.round}): got {res}, "
                          f"expected success={success} released={released} "
                          f"reason={reason}")
            del node.loads[job]
        missing = sorted(set(expected) - set(got) - ({event.job_id} if may_refuse else set())
                         - ({event.job_id} if isinstance(event, HostFetch) and died else set()))
        if missing:
            self.fail(name, event, f"loads {missing} got no result (expected "
                      f"{[expected[j] for j in missing]})")
        self.checked["load results"] += len(got)

    # ---------------------------------------------------------- lookups
    def _lookup_results(self, name: str, node: ONode, event: Input, died: bool,
                        outputs: Sequence[Output]) -> None:
        truth = self.truth(name)
        cause = (FailReason.SESSION_ENDED if died or node.dead else
                 FailReason.FINISHED if isinstance(event, HostFinish) else
                 FailReason.TIMEOUT if isinstance(event, TimerFired)
                 and event.timer.kind == "lookup" else None)
        results = [o for o in outputs if isinstance(o, LookupResult)]
        for res in results:
            lk = next((lk for lk in node.lookups
                       if lk.rid == res.kv_request_id and lk.keys == res.keys), None)
            if lk is None:
                self.fail(name, event, f"a lookup result no open lookup waits for: {res}")
                return
            node.lookups.remove(lk)
            false_hits = [k for k, h in zip(res.keys, res.hits, strict=True)
                          if h and k not in truth]
            if false_hits:
                self.fail(name, event, f"lookup {res.kv_request_id}: hits for keys the peer "
                          f"does not hold: {false_hits}")
            if res.answered:
                if res.reason is not None:
                    self.fail(name, event, f"an answered lookup with a reason: {res}")
                missed = [k for k, h in zip(res.keys, res.hits, strict=True)
                          if not h and k in truth]
                if self.exact_lookups and missed:
                    self.fail(name, event, f"lookup {res.kv_request_id}: answered, yet held "
                              f"keys are misses: {missed}")
            elif cause is None or res.reason != cause:
                self.fail(name, event, f"lookup {res.kv_request_id} unanswered with reason "
                          f"{res.reason}; this step's cause gives {cause}")
        if isinstance(event, TimerFired) and event.timer.kind == "lookup" and len(results) > 1:
            self.fail(name, event, "one lookup deadline answered several lookups")
        if died or (isinstance(event, HostFinish) and not node.dead):
            left = [lk for lk in node.lookups
                    if died or lk.rid == event.kv_request_id]  # type: ignore[union-attr]
            if left:
                self.fail(name, event, f"lookups left without their result: {left}")
        self.checked["lookup results"] += len(results)

    # ---------------------------------------------------------- producer
    def _producer(self, name: str, node: ONode, event: Input, msg: Message | None, died: bool,
                  outputs: Sequence[Output]) -> None:
        served = {(m.kv_request_id, m.round_seq) for m in _sent(outputs)
                  if isinstance(m, TransferDone) and m.success}
        for out in outputs:
            if isinstance(out, FetchArrived):
                self._fetch_arrived(name, node, event, msg, out)
            elif isinstance(out, LookupRequest):
                if not (isinstance(msg, Lookup) and (msg.kv_request_id, msg.round_seq,
                                                     msg.keys) == (out.kv_request_id,
                                                                   out.round_seq, out.keys)):
                    self.fail(name, event, f"a lookup request no lookup frame carried: {out}")
                node.looked.add((out.kv_request_id, out.round_seq))
                node.tokens[out.token] = (out.kv_request_id, out.round_seq)
            elif isinstance(out, StoreResult):
                self._store_result(name, node, event, died, served, out)
        ended = [o for o in outputs if isinstance(o, RoundEnded)]
        for out in ended:
            self._round_ended(name, node, event, msg, died, served, out)
        told = {(o.kv_request_id, o.round_seq) for o in ended}
        must: set[tuple[str, int]] = set()
        if died:
            must = set(node.heard)
        elif isinstance(msg, AbortFetch) and (msg.kv_request_id, msg.round_seq) in node.heard:
            must = {(msg.kv_request_id, msg.round_seq)}
        must |= served & node.heard
        if must - told:
            self.fail(name, event, f"rounds the host heard of ended with no RoundEnded: "
                      f"{sorted(must - told)}")
        node.heard -= told
        node.looked -= told
        node.fetched -= told
        node.ended |= told

    def _fetch_arrived(self, name: str, node: ONode, event: Input, msg: Message | None,
                       out: FetchArrived) -> None:
        key = (out.kv_request_id, out.round_seq)
        if not (isinstance(msg, Fetch) and msg.keys and (msg.kv_request_id, msg.round_seq,
                                                         msg.keys) == (*key, out.keys)):
            self.fail(name, event, f"FetchArrived no fetch frame carried: {out}")
        if not set(out.supplied) <= set(out.keys):
            self.fail(name, event, f"FetchArrived supplied keys it did not fetch: {out}")
        when = node.finished.get(out.kv_request_id)
        if when is not None and self.clock() < when + self.tombstone:
            self.fail(name, event, f"FetchArrived for {out.kv_request_id}, which the host "
                      "finished")
        if self.fifo and key in node.heard:
            self.fail(name, event, f"FetchArrived twice for round {key}")
        node.heard.add(key)
        self.checked["fetches arrived"] += 1

    def _store_result(self, name: str, node: ONode, event: Input, died: bool,
                      served: set[tuple[str, int]], out: StoreResult) -> None:
        if out.job_id not in node.stores:
            self.fail(name, event, f"a result for store {out.job_id}, which has none open")
        rid = node.stores.pop(out.job_id)
        if out.success:
            if out.reason is not None or not served or (
                    rid is not None and all(r != rid for r, _ in served)):
                self.fail(name, event, f"store {out.job_id} ({rid}) succeeded with no "
                          f"transfer_done(true) of its request sent: {out}")
        elif out.reason is None:
            self.fail(name, event, f"a failed store without a reason: {out}")
        elif out.reason is FailReason.SESSION_ENDED and not (died or node.dead):
            self.fail(name, event, f"store {out.job_id}: session_ended on a live session")
        self.checked["store results"] += 1

    def _round_ended(self, name: str, node: ONode, event: Input, msg: Message | None,
                     died: bool, served: set[tuple[str, int]], out: RoundEnded) -> None:
        key = (out.kv_request_id, out.round_seq)
        if key not in node.heard | node.looked | node.fetched:
            self.fail(name, event, f"RoundEnded for {key}, which the host never heard of "
                      f"or was told of already ({'told' if key in node.ended else 'never'})")
        if out.served != (key in served):
            self.fail(name, event, f"RoundEnded {key} served={out.served}, but its "
                      f"transfer_done(true) {'did' if key in served else 'did not'} go out")
        if out.served:
            return
        why = out.why
        cause_ok = {
            "aborted": isinstance(msg, AbortFetch) and (msg.kv_request_id,
                                                        msg.round_seq) == key,
            "peer_finished": isinstance(msg, Fetch) and not msg.keys
                             and msg.kv_request_id == key[0],
            "session_ended": died or node.dead,
            "demand_timeout": isinstance(event, TimerFired) and event.timer.kind == "demand",
            "write_failed": isinstance(event, WriteFinished) and not event.ok,
            "declined": isinstance(event, HostDecline) and (event.kv_request_id,
                                                            event.round_seq) == key,
            "failed": key[0] in node.finished,
        }
        if not cause_ok.get(why, False):
            self.fail(name, event, f"RoundEnded {key} why={why!r}: not this step's cause")
        self.checked["rounds ended"] += 1

    def _pinned_writes(self, name: str, node: ONode, state_before: str, event: Input,
                       msg: Message | None, died: bool, outputs: Sequence[Output]) -> None:
        """Where bytes go: a round's first fetch naming only keys the host's lookup
        answers pinned for that round (their pins still held) is written in that step,
        each key's pinned block into the block the fetch names for it, nothing else
        (server_round: ``pinned -> serving``, one write of every key)."""
        if isinstance(event, HostAnswerLookup) and event.job_id is not None \
                and event.job_id in node.stores and event.token in node.tokens:
            pins = node.pins.setdefault(node.tokens[event.token], {})
            pins.update({k: (i, event.job_id) for k, i in event.hits.items()})
        if isinstance(msg, Fetch) and not msg.keys:
            node.peer_finished.add(msg.kv_request_id)
        if not (isinstance(msg, Fetch) and msg.keys):
            return
        key = (msg.kv_request_id, msg.round_seq)
        pins = node.pins.get(key, {})
        if (died or node.dead or state_before not in ("awaiting_ack", "ready")
                or node.asked[key] != 1 or msg.kv_request_id in node.finished
                or msg.kv_request_id in node.peer_finished
                or len(set(msg.keys)) != len(msg.keys)
                or any(isinstance(o, ProtocolViolation | FrameIgnored) for o in outputs)
                or not all(k in pins and pins[k][1] in node.stores for k in msg.keys)):
            return
        want = {(pins[k][0], d) for k, d in zip(msg.keys, msg.block_indexes, strict=True)}
        got = [(loc, rem) for o in outputs if isinstance(o, StartWrite)
               for loc, rem in zip(o.local_indexes, o.remote_indexes, strict=True)]
        if sorted(got) != sorted(want):
            self.fail(name, event, f"fetch {key} of keys every one pinned for its round: "
                      f"expected writes (local, remote) {sorted(want)}, got {sorted(got)}")
        self.checked["pinned writes"] += 1

    # ---------------------------------------------------------- handshake
    def _handshake(self, name: str, node: ONode, event: Input, msg: Message | None,
                   outputs: Sequence[Output]) -> None:
        """A peer's connect on a ready session: its incarnation says whether the peer
        restarted (a new one) or connects again after losing its side (the same); either
        ends the session, and says which (``SessionDead``)."""
        if any(isinstance(m, ConnectAck) for m in _sent(outputs)):
            node.acked_out = True
        if isinstance(msg, ConnectAck):
            node.acked_in = True
        if not isinstance(msg, Connect):
            return
        ready = node.acked_in and node.acked_out and not node.dead
        known, node.incarnation = node.incarnation, (
            msg.incarnation if node.incarnation is None else node.incarnation)
        deaths = [o for o in outputs if isinstance(o, SessionDead)]
        if ready and (known is None or msg.incarnation is None):
            # No incarnation to tell by: a second connect is the duplicate-connect error.
            if any(d.restarted_by is not None for d in deaths):
                self.fail(name, event, f"a second connect without incarnations taken for "
                          f"a restart or a reconnect: {deaths}")
            return
        if not ready:
            return
        want = "peer restarted" if msg.incarnation != known else "peer reconnected"
        if len(deaths) != 1 or deaths[0].reason != want or deaths[0].restarted_by != msg:
            self.fail(name, event, f"a connect of incarnation {msg.incarnation} (known "
                      f"{known}) on a ready session: expected one SessionDead({want!r}, "
                      f"restarted_by=that connect), got {deaths}")
        self.checked["connects again"] += 1

    def _stale(self, name: str, node: ONode, state_before: str, event: Input,
               msg: Message | None, outputs: Sequence[Output]) -> None:
        """A dead session answers a request or response of a peer that may still hold it
        live with a disconnect, at most one a second (models/session.toml, recv_stale)."""
        now = self.clock()
        answered = any(isinstance(o, SendToLostPeer) and isinstance(o.message, Disconnect)
                       for o in outputs)
        if state_before == "dead" and isinstance(msg, _STALE) and not self.by_peer:
            # (Simulated sessions only: a real node's clock is read apart from its
            # session's, and its control plane may answer a lost peer itself.)
            since = now - node.last_disconnect
            if since > 1.25 and not answered:  # slack: the node reads its clock apart
                self.fail(name, event, f"a dead session left a peer's {msg.TYPE} unanswered "
                          f"({since:.2f} s after its last disconnect)")
            if since < 0.75 and answered:
                self.fail(name, event, f"a dead session answered a {msg.TYPE} with a second "
                          f"disconnect within a second ({since:.2f} s)")
            self.checked["stale frames"] += 1
        if any(isinstance(o, SendFrame) and isinstance(o.message, Disconnect)
               for o in outputs):
            node.last_disconnect = now

    # ---------------------------------------------------------- the end
    def check_quiet(self) -> None:
        """Once the run is quiet: every round the host heard of was told ended."""
        for name, node in self.nodes.items():
            if node.heard:
                raise OracleMismatch(f"oracle, {name}: rounds heard of and never told ended: "
                                     f"{sorted(node.heard)}")
            if node.loads or node.lookups:
                raise OracleMismatch(f"oracle, {name}: jobs left open: {node.loads} "
                                     f"{node.lookups}")
