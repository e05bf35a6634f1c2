"""A deterministic simulated world for two sessions: network, clock, data plane, hosts.

Everything nondeterministic is an explicit action, chosen either by a caller
(scenario tests, hypothesis rules) or by a seeded ``random.Random`` (:meth:`SimWorld.run`),
so every run replays from its seed:

* the network: two FIFO channels per peer pair (one per direction) whose frames can be
  delivered, dropped, duplicated, delayed (reordered) or cut (both sides lose the link);
* the clock: virtual; :meth:`SimWorld.advance` jumps to the next armed deadline;
* the data plane: a started write may *land* (copy its source blocks into the
  destination) at any step until it *completes* (reported to its session); a cancelled
  write may still land until it completes; a faulty write completes without landing;
* the hosts: :class:`~p2pfsm.sim.host.SimHost` allocates destination blocks, supplies
  stored blocks, answers lookups, and checks the safety properties on every result.

Block model (as vLLM's interop harness): key ``demo_key(i)`` has content
``demo_block(i)`` and a node that holds it keeps it at block ``i``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from functools import partial

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import LocalProtocolError
from p2pfsm.executor.runtime.driver import CallRecorder, Driver
from p2pfsm.executor.runtime.effects import Executor
from p2pfsm.fsm import Tracer, machine
from p2pfsm.protocol import encode
from p2pfsm.session import (
    CancelWrite,
    DestinationReleased,
    FetchArrived,
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
    LookupClosed,
    LookupRequest,
    LookupResult,
    Output,
    ProtocolViolation,
    RegistrationFinished,
    SendFrame,
    Session,
    SessionConfig,
    SessionDead,
    StartRegistration,
    StartWrite,
    StoreResult,
    Timeouts,
    TimerFired,
    TimerId,
    TransportLost,
    WriteFinished,
)
from p2pfsm.session.config import PROFILE_TIMEOUTS
from p2pfsm.sim.host import Load, SafetyViolation, SimHost, SimWrite

_UNSTARTED = machine("session").state_set("unstarted")
"""Session states before HostStart (models/session.toml [sets])."""


class SimWorld(Executor):
    """Two peers ``a`` and ``b`` connected by a simulated network.

    Args:
        seed: seeds :meth:`run`'s choices.
        block_len, num_blocks: both nodes' layout.
        held: block numbers each node stores (by node name).
        timeouts: both sessions' deadlines.
        configs: per-node overrides of SessionConfig fields (e.g. a mismatching hash_seed).
        tracer: shared by both sessions.
        hook: the driver's call hook, told of every ``Session.handle`` call with its
            outputs (how recorders watch a run: the trace log, the diagrams' flows).
        check_destinations: raise SafetyViolation when a write targets or lands in a
            block not owned by a waiting load, and verify loaded bytes. The protocol
            guarantees this over FIFO channels; tests that duplicate or reorder frames
            (outside that model) turn it off and check the remaining properties.
        cancelled_writes_land: :meth:`enabled` (so :meth:`run` and :meth:`stabilize`)
            also lets a cancelled write land before its cancel completes (stabilize
            lands it first), as NIXL may; by default a cancelled write there only
            completes, unlanded (:meth:`land` may still land it).
    """

    NODES = ("a", "b")

    def __init__(
        self,
        seed: int = 0,
        *,
        block_len: int = 16,
        num_blocks: int = 32,
        held: Mapping[str, Iterable[int]] | None = None,
        timeouts: Timeouts | None = None,
        configs: dict[str, dict[str, object]] | None = None,
        tracer: Tracer | None = None,
        hook: CallRecorder | None = None,
        check_destinations: bool = True,
        cancelled_writes_land: bool = False,
    ) -> None:
        self.rng = random.Random(seed)
        self.check_destinations = check_destinations
        self.cancelled_writes_land = cancelled_writes_land
        self._pending_answers: list[tuple[str, HostAnswerLookup]] = []
        self.now = 0.0
        self.tracer = tracer
        held = held or {"a": range(0, 8), "b": range(8, 16)}
        self.hosts = {
            n: SimHost(n, num_blocks, block_len, frozenset(held.get(n, ()))) for n in self.NODES
        }
        self.sessions: dict[str, Session] = {}
        for n in self.NODES:
            extra = dict((configs or {}).get(n, {}))
            cfg = SessionConfig(
                local_id=f"127.0.0.1:{5000 + self.NODES.index(n)}",
                agent_metadata=f"agent-{n}".encode(),
                base_addr=0x1000 * (1 + self.NODES.index(n)),
                num_blocks=num_blocks,
                block_len=block_len,
                timeouts=timeouts or PROFILE_TIMEOUTS,  # None: the profile's
                **extra,  # type: ignore[arg-type]
            )
            self.sessions[n] = Session(cfg, tracer)
        self.channels: dict[tuple[str, str], list[bytes]] = {("a", "b"): [], ("b", "a"): []}
        self.sent_at: dict[tuple[str, str], list[float]] = {("a", "b"): [], ("b", "a"): []}
        # Frames live at most half a tombstone period (the sessions' stated assumption).
        self.max_delay = (timeouts or PROFILE_TIMEOUTS).tombstone / 2
        self.registrations: set[str] = set()
        self.writes: dict[tuple[str, int], SimWrite] = {}
        self.registered: dict[str, bool] = {n: False for n in self.NODES}
        self._job = 0
        self.log: list[str] = []
        # Feeds the sessions on the virtual clock; outputs come back to the methods below.
        self._driver = Driver(self, self._clock, hook)

    # ------------------------------------------------------------ plumbing
    @staticmethod
    def other(node: str) -> str:
        return "b" if node == "a" else "a"

    def feed(self, node: str, event: Input) -> list[Output]:
        """Give ``event`` to ``node``'s session and carry out its outputs (the driver's
        call; the ``hook`` hears of it)."""
        return self._driver.feed(node, event, self.sessions[node])

    def _clock(self) -> float:
        return self.now

    # ------------------------------- Executor: outputs of ``node``'s session
    def send_frame(self, peer: str, out: SendFrame) -> None:
        self.channels[(peer, self.other(peer))].append(encode(out.message))
        self.sent_at[(peer, self.other(peer))].append(self.now)

    def start_registration(self, peer: str, out: StartRegistration) -> None:
        self.registrations.add(peer)

    def start_write(self, peer: str, out: StartWrite) -> None:
        self._start_write(peer, out)

    def cancel_write(self, peer: str, out: CancelWrite) -> None:
        write = self.writes.get((peer, out.xfer))
        if write is not None:  # absent only after a SafetyViolation stopped its start
            write.cancelled = True

    def load_result(self, peer: str, out: LoadResult) -> None:
        self._on_load_result(self.hosts[peer], out)

    def destination_released(self, peer: str, out: DestinationReleased) -> None:
        host = self.hosts[peer]
        res = host.load_results.get(out.job_id)
        if res is None or res.released:
            raise SafetyViolation(f"{peer}: release notice for job {out.job_id}, whose "
                                  f"result did not hold its destination: {res}")
        if out.job_id in host.released_later:
            raise SafetyViolation(f"{peer}: second release notice for job {out.job_id}")
        host.released_later[out.job_id] = out
        host.release(host.loads[out.job_id].dest)

    def store_result(self, peer: str, out: StoreResult) -> None:
        self._on_store_result(peer, self.hosts[peer], out)

    def lookup_result(self, peer: str, out: LookupResult) -> None:
        self.hosts[peer].lookup_results.append(out)

    def lookup_request(self, peer: str, out: LookupRequest) -> None:
        self.hosts[peer].lookup_requests[out.token] = out
        self._answer_lookup(peer, out)

    def fetch_arrived(self, peer: str, out: FetchArrived) -> None:
        """The simulated host supplies only when a test or rule says so."""

    def protocol_violation(self, peer: str, out: ProtocolViolation) -> None:
        self.hosts[peer].violations.append(out)

    def session_dead(self, peer: str, out: SessionDead) -> None:
        self.hosts[peer].deaths.append(out)

    def lookup_closed(self, peer: str, out: LookupClosed) -> None:
        host = self.hosts[peer]
        if out.token in host.lookups_closed:
            raise SafetyViolation(f"{peer}: lookup {out.token} closed twice")
        host.lookups_closed.add(out.token)

    # --------------------------------------------------------- host actions
    def start(self) -> None:
        for n in self.NODES:
            self.feed(n, HostStart())

    def new_job(self) -> int:
        self._job += 1
        return self._job

    def fetch(self, node: str, kv_request_id: str, key_ids: Iterable[int]) -> int | None:
        """Load demo blocks ``key_ids`` from the peer into free blocks; None if no room."""
        host = self.hosts[node]
        key_ids = tuple(key_ids)
        if len(key_ids) > len(host.free):
            return None
        dest = tuple(host.free.pop(0) for _ in key_ids)
        job = self.new_job()
        for d in dest:
            host.owner[d] = job
        host.loads[job] = Load(job, kv_request_id, key_ids, dest)
        try:
            self.feed(node, HostFetch(job, kv_request_id, tuple(demo_key(k) for k in key_ids),
                                      dest))
        except LocalProtocolError:
            del host.loads[job]
            for d in dest:
                del host.owner[d]
            host.free[:0] = dest
            raise
        return job

    def supply(self, node: str, kv_request_id: str, key_ids: Iterable[int]) -> int | None:
        """Offer stored demo blocks (pinned until the job's StoreResult); None for a
        request this host finished (its session would refuse it: LocalProtocolError)."""
        host = self.hosts[node]
        if kv_request_id in host.finished:
            return None
        key_ids = tuple(k for k in key_ids if k in host.held)
        job = self.new_job()
        host.store_jobs[job] = key_ids
        try:
            self.feed(node, HostSupply(job, kv_request_id,
                                       tuple(demo_key(k) for k in key_ids), key_ids))
        except LocalProtocolError:
            del host.store_jobs[job]
            raise
        return job

    def lookup(self, node: str, kv_request_id: str, key_ids: Iterable[int]) -> None:
        self.hosts[node].lookups_sent += 1
        self.feed(node, HostLookup(kv_request_id, tuple(demo_key(k) for k in key_ids)))

    def finish(self, node: str, kv_request_id: str) -> None:
        self.hosts[node].finished.add(kv_request_id)
        self.feed(node, HostFinish(kv_request_id))
        self._flush_answers()

    def decline(self, node: str, kv_request_id: str, round_seq: int) -> None:
        """The host will not supply the rest of that fetched round (HostDecline)."""
        self.feed(node, HostDecline(kv_request_id, round_seq))
        self._flush_answers()

    def close(self, node: str) -> None:
        """The host closes its session (its disconnect is still delivered to the peer)."""
        self.feed(node, HostClose())
        self._flush_answers()

    def _answer_lookup(self, node: str, req: LookupRequest) -> None:
        host = self.hosts[node]
        by_key = {demo_key(i): i for i in host.held}
        hits = {k: by_key[k] for k in req.keys if k in by_key}
        job = None
        if hits:
            job = self.new_job()
            host.store_jobs[job] = tuple(hits.values())
        # Answered after this output batch, as a host would on its next step.
        self._pending_answers.append((node, HostAnswerLookup(req.token, hits, job)))

    # --------------------------------------------------- safety bookkeeping
    def _start_write(self, node: str, out: StartWrite) -> None:
        dst = self.hosts[self.other(node)]
        if not self.registered[node]:
            raise SafetyViolation(f"{node} wrote before registering its peer")
        for r in out.remote_indexes:
            if not 0 <= r < dst.num_blocks:
                raise SafetyViolation(f"{node} wrote outside the peer's region: {r}")
        owners = tuple(dst.owner.get(r) for r in out.remote_indexes)
        if None in owners and self.check_destinations:
            raise SafetyViolation(
                f"{node} started a write into unowned blocks {out.remote_indexes}")
        self.writes[(node, out.xfer)] = SimWrite(
            node, out.xfer, out.local_indexes, out.remote_indexes, owners)

    def _on_load_result(self, host: SimHost, res: LoadResult) -> None:
        if res.job_id in host.load_results:
            raise SafetyViolation(f"{host.name}: second result for load job {res.job_id}")
        host.load_results[res.job_id] = res
        load = host.loads[res.job_id]
        if res.success and self.check_destinations:
            for k, d in zip(load.key_ids, load.dest, strict=True):
                if host.block(d) != demo_block(k, host.block_len):
                    raise SafetyViolation(
                        f"{host.name}: job {res.job_id} block {d} has wrong bytes")
        if res.released:
            host.release(load.dest)

    def _on_store_result(self, node: str, host: SimHost, res: StoreResult) -> None:
        if res.job_id in host.store_results:
            raise SafetyViolation(f"{node}: second result for store job {res.job_id}")
        if res.job_id not in host.store_jobs:
            raise SafetyViolation(f"{node}: result for unknown store job {res.job_id}")
        host.store_results[res.job_id] = res
        # Pins are reference counts: a block stays pinned while any unreleased job holds it.
        still = {b for job, blocks in host.store_jobs.items()
                 if job not in host.store_results for b in blocks}
        unpinned = set(host.store_jobs[res.job_id]) - still
        for w in self.writes.values():
            if w.src == node and not w.landed and unpinned & set(w.local_indexes):
                raise SafetyViolation(
                    f"{node}: job {res.job_id} unpinned while write {w.xfer} reads it")

    # ------------------------------------------------------ world actions
    def deliver(self, src: str, index: int = 0) -> None:
        """Deliver the ``index``-th queued frame from ``src`` (index > 0 reorders)."""
        frame = self.channels[(src, self.other(src))].pop(index)
        self.sent_at[(src, self.other(src))].pop(index)
        self.feed(self.other(src), FrameReceived(frame))
        self._flush_answers()

    def drop(self, src: str, index: int = 0) -> None:
        self.channels[(src, self.other(src))].pop(index)
        self.sent_at[(src, self.other(src))].pop(index)

    def duplicate(self, src: str, index: int = 0) -> None:
        chan = self.channels[(src, self.other(src))]
        chan.insert(index, chan[index])
        times = self.sent_at[(src, self.other(src))]
        times.insert(index, times[index])

    def inject(self, dst: str, frame: bytes) -> None:
        """Hand ``dst`` an arbitrary frame as if its peer sent it."""
        self.feed(dst, FrameReceived(frame))
        self._flush_answers()

    def lose_queued_frames(self) -> None:
        """Every frame still on a channel is lost (no session is told)."""
        for chan in self.channels.values():
            chan.clear()
        for times in self.sent_at.values():
            times.clear()

    def cut(self) -> None:
        """The connection breaks: queued frames are lost and both sides learn it."""
        self.lose_queued_frames()
        for n in self.NODES:
            self.feed(n, TransportLost("simulated cut"))
        self._flush_answers()

    def link_down(self, node: str) -> None:
        """``node`` notices its peer's session is gone (heartbeats stop, the socket closes)."""
        self.feed(node, TransportLost("peer session ended"))
        self._flush_answers()

    def register(self, node: str, ok: bool = True) -> None:
        self.registrations.discard(node)
        self.registered[node] = ok
        self.feed(node, RegistrationFinished(ok, "" if ok else "simulated failure"))
        self._flush_answers()

    def land(self, src: str, xfer: int) -> None:
        """A write's bytes reach the destination (possible until it completes)."""
        w = self.writes[(src, xfer)]
        if w.landed:
            return
        w.landed = True
        dst = self.hosts[self.other(src)]
        srch = self.hosts[src]
        for local, remote, job in zip(w.local_indexes, w.remote_indexes, w.owner_jobs, strict=True):
            if dst.owner.get(remote) != job and self.check_destinations:
                raise SafetyViolation(
                    f"write {src}#{xfer} landed in block {remote} after job {job} released it")
            dst.region[remote * dst.block_len:(remote + 1) * dst.block_len] = srch.block(local)

    def complete(self, src: str, xfer: int, *, fail: bool = False) -> None:
        """The write ends: landed ones succeed (unless ``fail``), others report failure."""
        w = self.writes.pop((src, xfer))
        ok = w.landed and not fail
        self.feed(src, WriteFinished(xfer, ok))
        self._flush_answers()

    @property
    def timers(self) -> dict[str, Mapping[TimerId, float]]:
        """Each node's armed timers and their deadlines (read-only: its session's own)."""
        return {n: self.sessions[n].view.timers for n in self.NODES}

    def fire_timer(self, node: str, timer: TimerId) -> None:
        """Jump the clock to ``timer``'s deadline (KeyError: not armed) and fire it."""
        deadline = self.sessions[node].view.timers[timer]
        self.now = max(self.now, deadline)
        self.feed(node, TimerFired(timer))
        self._flush_answers()

    def next_deadline(self) -> tuple[float, str, TimerId] | None:
        """The earliest armed timer of either node (ties: node, then timer name)."""
        best: tuple[float, str, TimerId] | None = None
        for n in self.NODES:
            earliest = self.sessions[n].next_timer()
            if earliest is not None and (best is None or (earliest[0], n) < best[:2]):
                best = (earliest[0], n, earliest[1])
        return best

    def can_advance(self) -> bool:
        """A timer may fire: one is armed and no queued frame would outlive ``max_delay``."""
        nxt = self.next_deadline()
        if nxt is None:
            return False
        oldest = min((t for times in self.sent_at.values() for t in times), default=None)
        return oldest is None or nxt[0] <= oldest + self.max_delay

    def advance(self) -> bool:
        """Jump the clock to the next deadline and fire it; False when none may fire."""
        nxt = self.next_deadline()
        if nxt is None or not self.can_advance():
            return False
        self.fire_timer(nxt[1], nxt[2])
        return True

    def _flush_answers(self) -> None:
        while self._pending_answers:
            node, answer = self._pending_answers.pop(0)
            self.feed(node, answer)

    # ------------------------------------------------------------- running
    def enabled(self) -> list[tuple[str, Callable[[], None]]]:
        """Every fault-free step that can happen now, except timers."""
        steps: list[tuple[str, Callable[[], None]]] = []
        for (src, _dst), chan in self.channels.items():
            if chan:
                steps.append((f"deliver {src}", partial(self.deliver, src)))
        for n in sorted(self.registrations):
            steps.append((f"register {n}", partial(self.register, n)))
        for n in self.NODES:
            peer = self.other(n)
            if (not self.sessions[n].alive and self.sessions[peer].alive
                    and self.sessions[n].state not in _UNSTARTED
                    and not self.channels[(n, peer)]):
                steps.append((f"link down {peer}", partial(self.link_down, peer)))
        for (src, xfer), w in sorted(self.writes.items()):
            if not w.landed and (not w.cancelled or self.cancelled_writes_land):
                steps.append((f"land {src}#{xfer}", partial(self.land, src, xfer)))
            if w.landed or w.cancelled:
                steps.append((f"complete {src}#{xfer}", partial(self.complete, src, xfer)))
        return steps

    def run(self, max_steps: int = 10_000, *, timers: bool = True) -> int:
        """Take random enabled steps until nothing but timers is left (then fire them if
        ``timers``); returns the steps taken. Bounded by ``max_steps``."""
        for taken in range(max_steps):
            steps = self.enabled()
            if steps:
                self.rng.choice(steps)[1]()
            elif not (timers and self.advance()):
                return taken
        raise SafetyViolation(f"no quiescence after {max_steps} steps")

    def stabilize(self, max_steps: int = 10_000) -> int:
        """Deliver, register and complete everything in order (no timers, no randomness)."""
        for taken in range(max_steps):
            steps = self.enabled()
            if not steps:
                return taken
            steps[0][1]()
        raise SafetyViolation(f"no quiescence after {max_steps} steps")
