"""The stateful test's world: a SimWorld with the checks that name a race, not a symptom.

On top of SimWorld's own (a write landing in a released destination, a pin released
while a write reads it, a second result, wrong bytes), every step checks:

* **terminal frames complete their own round** (TLA+ ``TerminalFrameInv``): each frame
  carries a ghost, the load job it is about (a fetch: its job; an abort: the job of that
  round open at the consumer; a producer's reply: the ghost of the last request frame of
  that round it received); a transfer_done or abort_ack may give a LoadResult only to
  its ghost job. The ghosts never reach the sessions.
* **no protocol error between conformant peers** unless the network lost or duplicated
  a frame (``NoProtocolErrorInv``); garbage a test injects is not counted.
* **no destination is released while a write into it may still land** (TLA+
  ``NoFreeWhileWriteInv``, checked when the LoadResult arrives rather than when a late
  write lands): until a write has completed it may land (again), cancelled or not
  (NIXL), so a load reported released while one of its writes is in flight is a
  violation, whether or not this run lets it land.
* **no round number reused while its older generation is on the wire**
  (``RoundReuseInv``, checked when the consumer sends the new round's fetch): a
  transfer_done, abort_ack, abort_fetch or fetch of the same request and round still in
  flight would be taken for the new round's (vLLM P4), before any of them arrives.
* **canary**: a released destination block is filled with a canary; it must still hold
  it when the host gives the block to a new load (nothing landed while it was free).

Beyond SimWorld's own moves, a producer's host may hold a lookup's answer back
(``lookup(..., hold=True)``: answered by :meth:`CheckedWorld.answer_held`, or once the
run is quiet) so that it reaches a lookup that ended meanwhile, the clock may move with
nothing happening (:meth:`CheckedWorld.idle`, never past a frame's lifetime), and a
hostile peer's fetch may name a block one past the region
(:meth:`CheckedWorld.fetch_beyond_region`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from p2pfsm.demo_blocks import demo_key
from p2pfsm.errors import LocalProtocolError
from p2pfsm.protocol import AbortAck, AbortFetch, Connect, Fetch, TransferDone, decode, encode
from p2pfsm.session import (
    FrameReceived,
    HostAnswerLookup,
    LoadResult,
    LookupRequest,
    SendFrame,
    StartWrite,
)
from p2pfsm.sim.host import SafetyViolation, SimHost, SimWrite
from p2pfsm.sim.world import SimWorld

CANARY = 0xA5


class CheckedWorld(SimWorld):
    """SimWorld plus ghost round checks, the protocol-error check and canaries.

    Args:
        check_rounds: check terminal frames against their ghosts (off when frames are
            duplicated or reordered: the wire cannot tell generations apart then).
        retries: how many failed loads the host loads again at once, same request and
            keys (a host reusing a request id: a new round right after the old one ended).
        incarnations: both sessions carry one (else neither does, as a vLLM peer).
        parts: both producers answer lookups in parts (``answer_lookups_in_parts``) and
            each host finds a lookup's first held key at once and the others only when
            :meth:`resolve_deferred` says so (the keys stay pending until then, or until
            ``lookup_pending`` makes them MISS).
        kwargs: as :class:`SimWorld`.
    """

    def __init__(self, seed: int = 0, *, check_rounds: bool = True, retries: int = 0,
                 parts: bool = False, incarnations: bool = True, **kwargs: Any) -> None:
        self.check_rounds = check_rounds
        self.retries = retries
        self.parts = parts
        self.held: list[tuple[str, HostAnswerLookup]] = []
        """Lookup answers their producer's host holds back (their pins are taken)."""
        self.gone: set[str] = set()
        """Writers whose peer heard them restart: the process that wrote is gone, so no
        write of theirs lands after that (ReleaseCause.PEER_RESTARTED), however long
        their session here, which stands in for it, keeps going."""
        self.hold_next: dict[str, list[bool]] = {"a": [], "b": []}
        """Per producer, in lookup order: whether its host holds that answer back."""
        self.deferred: list[tuple[str, int, dict[bytes, int]]] = []
        # Both carry an incarnation, so that a peer's connect again is told apart from
        # a restart (``connect_again``).
        configs: dict[str, dict[str, object]] = {
            n: {"incarnation": 7 + i} if incarnations else {}
            for i, n in enumerate(self.NODES)}
        for n in self.NODES:
            if parts:
                configs[n]["answer_lookups_in_parts"] = True
        kwargs["configs"] = configs
        self.connects: dict[str, Connect] = {}
        """The connect each node sent."""
        self._retry: list[tuple[str, str, tuple[int, ...]]] = []
        self.ghosts: dict[tuple[str, str], list[int | None]] = {("a", "b"): [], ("b", "a"): []}
        self.served: dict[str, dict[tuple[str, int], int | None]] = {"a": {}, "b": {}}
        self.load_round: dict[str, dict[int, tuple[str, int]]] = {"a": {}, "b": {}}
        self.lossy = False
        self.injected_violations: Counter[str] = Counter()
        self.canaried: dict[str, set[int]] = {"a": set(), "b": set()}
        self.stats: Counter[str] = Counter()
        super().__init__(seed, **kwargs)

    # ------------------------------------------------------------- ghosts
    def _ghost_of(self, node: str, message: object) -> int | None:
        host = self.hosts[node]
        if isinstance(message, Fetch) and message.keys:
            for job, load in host.loads.items():
                if (job not in host.load_results and load.kv_request_id == message.kv_request_id
                        and load.dest == tuple(message.block_indexes)):
                    self.load_round[node][job] = (message.kv_request_id, message.round_seq)
                    return job
            return None
        if isinstance(message, AbortFetch):
            key = (message.kv_request_id, message.round_seq)
            open_jobs = [j for j, r in self.load_round[node].items()
                         if r == key and j not in host.load_results]
            return open_jobs[-1] if open_jobs else None
        if isinstance(message, TransferDone | AbortAck):
            return self.served[node].get((message.kv_request_id, message.round_seq))
        return None

    def send_frame(self, peer: str, out: SendFrame) -> None:
        msg = out.message
        if isinstance(msg, Connect):
            self.connects.setdefault(peer, msg)
        if self.check_rounds and isinstance(msg, Fetch) and msg.keys:
            self._check_round_fresh(peer, msg)
        super().send_frame(peer, out)
        self.ghosts[(peer, self.other(peer))].append(self._ghost_of(peer, out.message))

    def deliver(self, src: str, index: int = 0) -> None:
        dst = self.other(src)
        frame = self.channels[(src, dst)].pop(index)
        self.sent_at[(src, dst)].pop(index)
        ghost = self.ghosts[(src, dst)].pop(index)
        msg = decode(frame)
        if isinstance(msg, AbortFetch) or (isinstance(msg, Fetch) and msg.keys):
            self.served[dst][(msg.kv_request_id, msg.round_seq)] = ghost
        outputs = self.feed(dst, FrameReceived(frame))
        if self.check_rounds and isinstance(msg, TransferDone | AbortAck):
            for out in outputs:
                if isinstance(out, LoadResult) and out.job_id != ghost:
                    raise SafetyViolation(
                        f"{dst}: {msg.TYPE} {msg.kv_request_id}/{msg.round_seq} sent for job "
                        f"{ghost} completed job {out.job_id} (another round's load)")
        self._flush_answers()

    def _check_round_fresh(self, node: str, msg: Fetch) -> None:
        """``RoundReuseInv``: a load round is not opened under a number whose older
        generation still has a frame on the wire (its fetch or abort, which the producer
        will answer, or its transfer_done or abort_ack): that reply would be taken for
        the new round's (vLLM P4). The real session's round floor keeps an aborted
        round's number until its frames are gone."""
        key = (msg.kv_request_id, msg.round_seq)
        peer = self.other(node)
        # Only this consumer's rounds: its requests to the peer, the peer's replies.
        frames = [(f, AbortFetch | Fetch) for f in self.channels[(node, peer)]]
        frames += [(f, TransferDone | AbortAck) for f in self.channels[(peer, node)]]
        for frame, kinds in frames:
            old = decode(frame)
            if isinstance(old, kinds) and (not isinstance(old, Fetch) or old.keys) and (
                    (old.kv_request_id, old.round_seq) == key):
                    raise SafetyViolation(
                        f"{node}: fetch {key[0]}/{key[1]} reused a round whose {old.TYPE} "
                        "is still on the wire (its reply would be taken for the new round's)")

    def connect_again(self, node: str, restarted: bool) -> None:
        """``node`` hears its peer's connect once more: of the same incarnation (the peer
        lost its side of the session and connects again) or of a new one (it
        restarted). Either ends ``node``'s session with every job's result. Without
        incarnations it is the same connect again."""
        first = self.connects[self.other(node)]
        again = first if first.incarnation is None else replace(
            first, incarnation=first.incarnation + restarted)
        if again.incarnation != first.incarnation:
            self.gone.add(self.other(node))
        self.inject(node, encode(again))

    def drop(self, src: str, index: int = 0) -> None:
        super().drop(src, index)
        self.ghosts[(src, self.other(src))].pop(index)
        self.lossy = True

    def duplicate(self, src: str, index: int = 0) -> None:
        super().duplicate(src, index)
        ghosts = self.ghosts[(src, self.other(src))]
        ghosts.insert(index, ghosts[index])
        self.lossy = True

    def lose_queued_frames(self) -> None:
        super().lose_queued_frames()
        for ghosts in self.ghosts.values():
            ghosts.clear()

    def inject(self, dst: str, frame: bytes) -> None:
        before = len(self.hosts[dst].violations)
        super().inject(dst, frame)
        self.injected_violations[dst] += len(self.hosts[dst].violations) - before

    def check_no_protocol_errors(self) -> None:
        if self.lossy:
            return
        for node, host in self.hosts.items():
            if len(host.violations) != self.injected_violations[node]:
                raise SafetyViolation(f"{node} rejected a conformant peer's frame: "
                                      f"{host.violations[-1].error}")

    # ------------------------------------------------------------ lookups in parts
    def lookup(self, node: str, kv_request_id: str, key_ids: Any, hold: bool = False) -> None:
        """As SimWorld's; with ``hold`` the peer's host holds its answer back."""
        self.hold_next[self.other(node)].append(hold)
        super().lookup(node, kv_request_id, key_ids)

    def _answer_lookup(self, node: str, req: LookupRequest) -> None:
        first = len(self._pending_answers)
        self._answer_now(node, req)
        # Lookups arrive in the order they were sent (a lost one only shifts the flags).
        if self.hold_next[node] and self.hold_next[node].pop(0):
            self.held += self._pending_answers[first:]  # pins taken, answer later
            del self._pending_answers[first:]

    def _answer_now(self, node: str, req: LookupRequest) -> None:
        if not self.parts:
            super()._answer_lookup(node, req)
            return
        by_key = {demo_key(i): i for i in self.hosts[node].held}
        found = [k for k in dict.fromkeys(req.keys) if k in by_key]
        now = {k: by_key[k] for k in found[:1]}
        later = {k: by_key[k] for k in found[1:]}
        job = None
        if now:
            job = self.new_job()
            self.hosts[node].store_jobs[job] = tuple(now.values())
        self._pending_answers.append(
            (node, HostAnswerLookup(req.token, now, job, frozenset(later))))
        if later:
            self.deferred.append((node, req.token, later))

    def resolve_deferred(self, index: int) -> None:
        """The host finds the keys it deferred for one lookup: they are pinned and
        answered. A lookup whose keys are no longer pending (its ``lookup_pending``
        deadline made them MISS) takes nothing: the host forgets the answer."""
        node, token, hits = self.deferred.pop(index)
        job = self.new_job()
        self.hosts[node].store_jobs[job] = tuple(hits.values())
        self._give_answer(node, HostAnswerLookup(token, hits, job))

    def answer_held(self, index: int) -> None:
        """A host gives a lookup answer it held back: to a lookup still waiting for
        it, or to one that ended meanwhile (finish, terminal fetch, death), whose pins
        the session must then release at once."""
        self._give_answer(*self.held.pop(index))

    def _give_answer(self, node: str, answer: HostAnswerLookup) -> None:
        try:
            self.feed(node, answer)
        except LocalProtocolError as exc:
            # Its keys are no longer pending (lookup_pending made them MISS): the
            # session refuses the answer and the host releases the pins itself.
            if "not pending" not in str(exc):
                raise
            if answer.job_id is not None:
                del self.hosts[node].store_jobs[answer.job_id]
        self._flush_answers()

    def enabled(self) -> list[tuple[str, Callable[[], None]]]:
        steps = super().enabled()
        if self.held:  # the host answers once the run goes on without faults
            steps.append(("answer held lookup", partial(self.answer_held, 0)))
        return steps

    # ------------------------------------------------------------ time and bounds
    def lifetime_left(self) -> float:
        """How far the clock may move before a frame on the wire outlives its lifetime
        (``max_delay``); unbounded (inf) with nothing on the wire."""
        oldest = min((t for times in self.sent_at.values() for t in times), default=None)
        return float("inf") if oldest is None else oldest + self.max_delay - self.now

    def idle(self, seconds: float) -> None:
        """Time passes with nothing happening (no frame arrives, no timer fires: the
        executor may be late), never beyond a frame's lifetime."""
        self.now += max(0.0, min(seconds, self.lifetime_left()))

    def fetch_beyond_region(self, producer: str, kv_request_id: str, round_seq: int,
                            key_ids: tuple[int, ...], position: int, beyond: int) -> None:
        """``producer`` receives, as if from its peer, a fetch of ``key_ids`` whose block
        index at ``position`` is ``beyond`` the peer's region (num_blocks + ``beyond``;
        the others are inside it); then its host supplies the request those keys."""
        num_blocks = self.hosts[self.other(producer)].num_blocks
        indexes = [num_blocks - 1 - i for i in range(len(key_ids))]
        indexes[position % len(indexes)] = num_blocks + beyond
        self.inject(producer, encode(Fetch(kv_request_id, tuple(demo_key(k) for k in key_ids),
                                           tuple(indexes), round_seq)))
        self.supply(producer, kv_request_id, key_ids)

    # ------------------------------------------------------------ retries
    def _flush_answers(self) -> None:
        super()._flush_answers()
        while self._retry:
            node, kv_request_id, key_ids = self._retry.pop(0)
            if self.sessions[node].state != "idle":
                self.fetch(node, kv_request_id, key_ids)
            super()._flush_answers()

    # ------------------------------------------------------------ canary
    def _on_load_result(self, host: SimHost, res: LoadResult) -> None:
        if res.released and self.check_destinations:
            self._check_no_write_may_land(host, res.job_id)
        owned = [d for d, j in host.owner.items() if j == res.job_id]
        super()._on_load_result(host, res)
        if not res.success and res.released and self.retries > 0:
            self.retries -= 1
            load = host.loads[res.job_id]
            self._retry.append((host.name, load.kv_request_id, load.key_ids))
        if res.released:
            for d in owned:
                host.region[d * host.block_len:(d + 1) * host.block_len] = bytes(
                    [CANARY]) * host.block_len
                self.canaried[host.name].add(d)

    def _check_no_write_may_land(self, host: SimHost, job: int) -> None:
        src = self.other(host.name)
        for (node, xfer), w in sorted(self.writes.items()):
            if node != src:
                continue
            into = [r for r, j in zip(w.remote_indexes, w.owner_jobs, strict=True) if j == job]
            if into:
                raise SafetyViolation(
                    f"{host.name}: job {job} released blocks {into} while write {src}#{xfer} "
                    f"into them may still land{' (cancelled)' if w.cancelled else ''}")

    def check_canaries(self, node: str, blocks: list[int]) -> None:
        host = self.hosts[node]
        if not self.check_destinations:
            return
        for d in blocks:
            if d in self.canaried[node] and host.block(d) != bytes([CANARY]) * host.block_len:
                raise SafetyViolation(f"{node}: free block {d} was written while free")

    def fetch(self, node: str, kv_request_id: str, key_ids: Any) -> int | None:
        key_ids = tuple(key_ids)
        host = self.hosts[node]
        taken = host.free[:len(key_ids)]
        if len(key_ids) <= len(host.free):
            self.check_canaries(node, taken)
            self.canaried[node].difference_update(taken)
        return super().fetch(node, kv_request_id, key_ids)

    # ------------------------------------------------------------ stats
    def land(self, src: str, xfer: int) -> None:
        w = self.writes[(src, xfer)]
        if src in self.gone:  # its process is gone: nothing it wrote lands any more,
            self.complete(src, xfer, fail=True)  # and the write ends (for its stand-in)
            return
        if w.cancelled and not w.landed:
            self.stats["cancelled writes landed"] += 1
        super().land(src, xfer)

    def _start_write(self, node: str, out: StartWrite) -> None:
        if node in self.gone:  # a write of a gone process: it never lands (land)
            dst = self.hosts[self.other(node)]
            self.writes[(node, out.xfer)] = SimWrite(
                node, out.xfer, out.local_indexes, out.remote_indexes,
                tuple(dst.owner.get(r) for r in out.remote_indexes))
            return
        super()._start_write(node, out)
