"""How a node carries out its sessions' outputs, and hands results to the host.

:class:`NodeEffects` is the :class:`~p2pfsm.executor.runtime.effects.Executor` of a
:class:`~p2pfsm.executor.node.Node`, and owns the :class:`~p2pfsm.executor.runtime.driver.Driver`
that hands it each output: frames go to the control plane, writes and registrations to
the data plane (:mod:`p2pfsm.executor.node.writes`); results resolve their
:class:`~p2pfsm.executor.node.jobs.JobFuture`; host callbacks (``on_lookup``, ``on_fetch``,
``on_result``, ``on_round_ended``, ``on_released``, ``on_peer_state``) are its fields and
are deferred through the driver, so they run after the session step, never inside it.
Which session an output came from is the driver's
:attr:`~p2pfsm.executor.runtime.driver.Driver.applying`; what an output means for the session
table (ready, dead, a rejected frame) goes to :class:`~p2pfsm.executor.node.peers.Peers`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, overload

from p2pfsm.errors import ConfigError, LocalProtocolError, TransportError
from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.executor.node.config import NodeConfig
from p2pfsm.executor.node.host_args import as_int, check_local_indexes
from p2pfsm.executor.node.jobs import Driven, JobFuture, LookupAnswer, LookupAsk, OpenJobs
from p2pfsm.executor.node.peers import HOSTILE_LINES, Peers
from p2pfsm.executor.node.redials import Parked
from p2pfsm.executor.node.served_lookups import ServedLookup, ServedLookups
from p2pfsm.executor.node.writes import Writes
from p2pfsm.executor.runtime.driver import Driver
from p2pfsm.executor.runtime.effects import Executor
from p2pfsm.executor.zmq.plane import ControlPlane
from p2pfsm.logwindow import LogWindow, clip
from p2pfsm.metrics import NodeMetrics
from p2pfsm.protocol import AbortFetch, encode
from p2pfsm.session import (
    CancelWrite,
    DestinationReleased,
    FailReason,
    FetchArrived,
    HostAnswerLookup,
    HostFetch,
    HostLookup,
    LoadResult,
    LookupClosed,
    LookupRequest,
    LookupResult,
    ProtocolViolation,
    RegistrationFinished,
    RoundEnded,
    SendFrame,
    SendToLostPeer,
    Session,
    SessionDead,
    StartRegistration,
    StartWrite,
    StoreResult,
    TransportLost,
    WriteFinished,
)
from p2pfsm.spec_log import CallHook

log = logging.getLogger("p2pfsm.node")


T = TypeVar("T")


class OnEffects(Generic[T]):
    """A host callback of a node (``on_fetch``, ...): the field of the same name of the
    node's effects (its ``_effects``), which call it."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, node: None, owner: type) -> OnEffects[T]: ...
    @overload
    def __get__(self, node: Any, owner: type) -> T: ...
    def __get__(self, node: Any, owner: type) -> T | OnEffects[T]:
        if node is None:
            return self
        value: T = getattr(node._effects, self._name)
        return value

    def __set__(self, node: Any, value: T) -> None:
        setattr(node._effects, self._name, value)


class NodeEffects(Executor):
    """The node's effects: each output of a session, carried out.

    Args:
        owner: the node, as the futures it hands out know it.
        config, metrics, control, data: the node's configuration, counters and planes.
        jobs, writes: the node's open jobs and writes in flight.
        finish: the node's ``finish`` host call (a failing ``on_fetch`` finishes the
            request).
        hook: the call hook around every session call (None: none).

    :attr:`peers` (the session table) is set by the node once it has made it: the
    table's sessions send their outputs here, and what they mean for the table goes
    back to it.
    """

    peers: Peers

    def __init__(self, owner: Driven, config: NodeConfig, metrics: NodeMetrics,
                 control: ControlPlane, data: DataPlane, jobs: OpenJobs, writes: Writes,
                 finish: Callable[[str, str], None],
                 hook: CallHook | None) -> None:
        self._owner = owner
        self._config = config
        self._metrics = metrics
        self._control = control
        self._data = data
        self._jobs = jobs
        self._writes = writes
        self._served = ServedLookups()  # on_lookup's tokens, lookups with keys pending
        self._finish = finish
        self.on_lookup: Callable[[str, LookupAsk], LookupAnswer] | None = None
        self.on_fetch: Callable[[str, FetchArrived], None] | None = None
        self.on_result: Callable[[str, LoadResult | StoreResult | LookupResult],
                                 None] | None = None
        self.on_round_ended: Callable[[str, RoundEnded], None] | None = None
        self.on_released: Callable[[str, DestinationReleased], None] | None = None
        self.on_peer_state: Callable[[str, str, str], None] | None = None
        self._host_error_log = LogWindow()
        self.holding = False
        """Frames are held for :meth:`send_held` (set by the node's turn while it runs)."""
        self.held = False  # a frame was held since the last send_held
        # Each held destination's release, by job (kept a while after it resolves).
        self._releases: OrderedDict[int, JobFuture[DestinationReleased]] = OrderedDict()
        # Queues inputs, carries out their outputs through the methods below.
        self.driver = Driver(self, time.monotonic, hook)

    def peer_state(self, peer_id: str, state: str, detail: str) -> None:
        """Tell ``on_peer_state`` that a peer the host connected to is ``state``
        (``"connecting"``, ``"ready"``, ``"lost"``: a redial follows, ``"given up"``:
        none does), after the current step."""
        callback = self.on_peer_state
        if callback is None:
            return

        def call() -> None:
            try:
                callback(peer_id, state, detail)
            except Exception as exc:  # logged and counted; nothing depends on it
                self.host_failed("on_peer_state", peer_id, f"state {state!r}", exc)
        self.driver.defer(call)

    def host_failed(self, callback: str, peer_id: str, what: str, exc: Exception) -> None:
        """A host callback raised: counted and logged (with its traceback, rate-limited);
        the caller fails only what the callback was about, and the node serves on."""
        self._metrics.count("host_errors")
        self._host_error_log.emit(
            log.error, "host callback errors", "host callback %s raised on the %s from %s "
            "(%s: %s); it fails, the node serves on", callback, what, peer_id,
            type(exc).__name__, exc, exc_info=exc)

    def session_ready(self, peer: str, session: Session) -> None:
        self.peers.on_ready(peer, session)

    def send_frame(self, peer: str, out: SendFrame) -> None:
        session, frame = self.driver.applying, encode(out.message)
        # In a turn, a ready session's frames are written with the turn's others at its
        # end. A handshake's go at once: under a flood of connects, holding the replies
        # of dial-backs about to be evicted only adds churn.
        if self.holding and session is not None and session.ready:
            self.held = True
            failed = self._control.hold(peer, frame, session)
        else:
            failed = self._control.try_send(peer, frame)
        if failed is not None:  # reported here only: the plane queues no PeerLost for it
            self.driver.queue(peer, TransportLost(failed), session)
        elif isinstance(out.message, AbortFetch):
            self._metrics.count("aborts_sent")
            log.info("peer %s: aborting %s round %d", peer, out.message.kv_request_id,
                     out.message.round_seq)

    def send_held(self) -> None:
        """Write the frames held in this turn, and stop holding; a frame that fails is
        reported to the session that sent it, as :meth:`send_frame` reports one."""
        self.holding = self.held = False
        for peer, failed, session in self._control.send_held():
            assert session is None or isinstance(session, Session)
            self.driver.queue(peer, TransportLost(failed), session)

    def send_to_lost_peer(self, peer: str, out: SendToLostPeer) -> None:
        """A dead session tells a peer that may still hold it live that it is over: over
        our connection to it while it lasts, else the control plane dials it back."""
        if peer in self._control.peers:
            self.send_frame(peer, out)
            return
        if self._control.answer(peer, encode(out.message)):
            self._metrics.count("stale_answers")
            sender = self.driver.applying
            log.info("peer %s: told that its session is over (%s)", peer,
                     None if sender is None else sender.death_reason)

    def start_write(self, peer: str, out: StartWrite) -> None:
        session = self.driver.applying
        assert session is not None  # outputs are applied only from the driver's feed
        try:
            self._writes.start(peer, out, session)
        except TransportError as exc:
            log.warning("write to %s failed to start: %s", peer, clip(exc))
            self.driver.queue(peer, WriteFinished(out.xfer, False), session)

    def cancel_write(self, peer: str, out: CancelWrite) -> None:
        session = self.driver.applying
        if session is not None and self._writes.cancel(session, out.xfer):
            self.driver.queue(peer, WriteFinished(out.xfer, False), session)

    def start_registration(self, peer: str, out: StartRegistration) -> None:
        c = out.connect
        try:
            self._data.add_peer(peer, c.agent_metadata, c.base_addr, c.num_blocks, c.block_len,
                                c.layout, c.layout_names)
            result = RegistrationFinished(True)
        except (TransportError, ConfigError) as exc:
            self.peers.hostile_log.emit(log.warning, HOSTILE_LINES,
                                        "peer %s: cannot register its memory: %s", peer, clip(exc))
            result = RegistrationFinished(False, clip(exc))
        self.driver.queue(peer, result, self.driver.applying)

    def load_result(self, peer: str, out: LoadResult) -> None:
        self._load(peer, out)

    def store_result(self, peer: str, out: StoreResult) -> None:
        self._deliver(peer, self._jobs.stores.pop(out.job_id, None), out)

    def lookup_result(self, peer: str, out: LookupResult) -> None:
        if out.never_sent:
            # The session says the peer never saw it: it waits for the next session, as
            # a fetch does, until the deadline it had when the host asked (each failed
            # attempt must not start it anew).
            waiting = self._jobs.lookups.get((peer, out.kv_request_id))
            asked = waiting[0].started if waiting else time.monotonic()
            if self._park(peer, asked + self._config.timeouts.lookup,
                          HostLookup(out.kv_request_id, out.keys)):
                return
        if out.reason is not None:
            out = dataclasses.replace(out, detail=self._fail_detail(peer, out))
        fut = self._jobs.take_lookup(peer, out.kv_request_id)
        if fut is not None:
            self._metrics.observe("lookup_seconds", time.monotonic() - fut.started)
            hits = sum(out.hits)
            self._metrics.count("lookup_keys_hit", hits)
            self._metrics.count("lookup_keys_missed", len(out.hits) - hits)
            self._metrics.count("lookups_answered" if out.answered else "lookups_failed")
        self._deliver(peer, fut, out)

    def lookup_request(self, peer: str, out: LookupRequest) -> None:
        session = self.driver.applying
        assert session is not None  # outputs are applied only from _feed
        self.driver.defer(lambda: self._answer(peer, session, out))

    def lookup_closed(self, peer: str, out: LookupClosed) -> None:
        token = self._served.token_of(peer, out.token)
        if token is not None:
            self._served.forget(token)

    def fetch_arrived(self, peer: str, out: FetchArrived) -> None:
        on_fetch = self.on_fetch
        if on_fetch is not None:
            self.driver.defer(lambda: self._call_on_fetch(on_fetch, peer, out))

    def round_ended(self, peer: str, out: RoundEnded) -> None:
        on_round_ended = self.on_round_ended
        if on_round_ended is not None:
            self.driver.defer(lambda: self._call_on_round_ended(on_round_ended, peer, out))

    def session_dead(self, peer: str, out: SessionDead) -> None:
        self.peers.on_death(peer, out)

    def release_of(self, job_id: int) -> JobFuture[DestinationReleased]:
        """The future behind :meth:`p2pfsm.executor.node.Node.release_of`."""
        fut = self._releases.get(job_id)
        if fut is None:
            raise LocalProtocolError(f"release_of: load job {job_id} has no held destination "
                                     "(its result said released=True, is not in yet, or is "
                                     "too old)")
        return fut

    def destination_released(self, peer: str, out: DestinationReleased) -> None:
        self._metrics.count("destinations_released")
        log.info("load job %d (%s): destination released (%s)", out.job_id,
                 out.kv_request_id, out.cause.value)
        fut = self._release_future(out.job_id)
        if not fut.done():
            fut.set_result(out)
        on_released = self.on_released
        if on_released is not None:
            self.driver.defer(lambda: self._call_on_released(on_released, peer, out))

    def _release_future(self, job_id: int) -> JobFuture[DestinationReleased]:
        """The future of a held destination's release (made at its failed result, or at
        the notice); the oldest resolved ones are forgotten past ``history``."""
        fut = self._releases.get(job_id)
        if fut is None:
            fut = self._releases[job_id] = JobFuture(self._owner)
            done = [j for j, f in self._releases.items() if f.done()]
            for old in done[:max(0, len(done) - self._config.history)]:
                del self._releases[old]
        return fut

    def _call_on_released(self, on_released: Callable[[str, DestinationReleased], None],
                          peer_id: str, out: DestinationReleased) -> None:
        try:
            on_released(peer_id, out)
        except Exception as exc:  # the notice is in its future already
            self.host_failed("on_released", peer_id, f"job {out.job_id}", exc)

    def protocol_violation(self, peer: str, out: ProtocolViolation) -> None:
        self.peers.on_violation(peer, out)

    def _call_on_fetch(self, on_fetch: Callable[[str, FetchArrived], None], peer_id: str,
                       arrived: FetchArrived) -> None:
        if peer_id in self.peers.sessions and self.peers.sessions[peer_id].alive:
            try:
                on_fetch(peer_id, arrived)
            except Exception as exc:
                # The request fails: finishing it fails the round (transfer_done(false)
                # once its writes have landed) and any later round of it at once.
                rid = arrived.kv_request_id
                self.host_failed("on_fetch", peer_id, f"request {rid}", exc)
                session = self.peers.sessions.get(peer_id)
                if session is not None and session.alive:
                    with contextlib.suppress(LocalProtocolError):  # finished already
                        self._finish(peer_id, rid)

    def _call_on_round_ended(self, on_round_ended: Callable[[str, RoundEnded], None],
                             peer_id: str, ended: RoundEnded) -> None:
        try:
            on_round_ended(peer_id, ended)
        except Exception as exc:  # logged and counted; nothing else depends on it
            self.host_failed("on_round_ended", peer_id,
                             f"round {ended.kv_request_id}/{ended.round_seq}", exc)

    def _park(self, peer_id: str, deadline: float, call: Parked) -> bool:
        """A job the peer never saw (its result says ``never_sent``) waits for the peer's
        next session, when one opens again (the redial book) and ``deadline`` has not
        passed; False: it gets its result now."""
        if self.peers.redials.waiting(peer_id) and deadline > time.monotonic():
            self.peers.redials.park(peer_id, deadline, call)
            return True
        return False

    def _load(self, peer_id: str, res: LoadResult) -> None:
        load = self._jobs.loads.get(res.job_id)
        if (load is not None and res.never_sent
                and self._park(peer_id, load.started + self._config.timeouts.load, load.event)):
            return
        self._jobs.loads.pop(res.job_id, None)
        if not res.success:
            res = dataclasses.replace(res, detail=self._fail_detail(peer_id, res))
        if load is not None:
            self._metrics.observe("fetch_seconds", time.monotonic() - load.started)
            if res.success:
                self._metrics.count("fetches_succeeded")
                self._metrics.count("fetch_bytes", load.nbytes)
            else:
                self._metrics.count("fetches_failed")
                if res.reason is not None:
                    self._metrics.count(f"fetches_failed_{res.reason.value}")
                log.info("load job %d (%s) failed: %s; destination released: %s",
                         res.job_id, res.kv_request_id, res.detail, res.released)
            if not res.released:
                self._release_future(res.job_id)  # what Node.release_of hands out
        self._deliver(peer_id, None if load is None else load.future, res)

    def _fail_detail(self, peer_id: str, res: LoadResult | LookupResult) -> str:
        """The session's detail, naming the peer (and why its session ended)."""
        text = f"from {peer_id}: {res.detail or 'failed'}"
        session = self.driver.applying or self.peers.sessions.get(peer_id)
        if (res.reason is FailReason.SESSION_ENDED and session is not None
                and session.death_reason):
            text += f" ({session.death_reason})"
        return text

    def _deliver(self, peer_id: str, fut: JobFuture[Any] | None,
                 value: LoadResult | StoreResult | LookupResult) -> None:
        """Hand a result to its future (and ``on_result``); count one nobody holds."""
        if fut is None:
            self._metrics.count("results_dropped")
            log.error("result with no job waiting for it (a bug): %r", value)
        elif not fut.done():
            fut.set_result(value)
        on_result = self.on_result
        if on_result is not None:
            self.driver.defer(lambda: self._call_on_result(on_result, peer_id, value))

    def _call_on_result(self, on_result: Callable[[str, Any], None], peer_id: str,
                        value: LoadResult | StoreResult | LookupResult) -> None:
        try:
            on_result(peer_id, value)
        except Exception as exc:  # the result is in its future already
            self.host_failed("on_result", peer_id, type(value).__name__, exc)

    def fail_parked(self, peer_id: str, ev: Parked, reason: FailReason,
                    why: str) -> None:
        if isinstance(ev, HostFetch):
            self._load(peer_id, LoadResult(
                ev.job_id, ev.kv_request_id, False, True, reason, why))
        else:
            self.lookup_result(peer_id, LookupResult(
                ev.kv_request_id, ev.keys, (False,) * len(ev.keys), False, reason, why))

    def resolve_lookup(self, peer_id: str, token: int, found: Mapping[bytes, int],
                       still: frozenset[bytes]) -> JobFuture[StoreResult] | None:
        """The host settles keys of lookup ``token`` (``Node.resolve_lookup``): ``found``
        pinned, ``still`` pending, the rest missed."""
        hits = {k: as_int(v) for k, v in found.items()}
        served = self._served.checked(token, peer_id)
        check_local_indexes("resolve_lookup", hits.values(), self._config.num_blocks)
        both = hits.keys() & still
        if both:
            raise LocalProtocolError(f"resolve_lookup: {len(both)} key(s) both hit and pending")
        if served is not None:
            stray = [k for k in (*hits, *still) if k not in served.pending]
            if stray:
                raise LocalProtocolError(
                    f"resolve_lookup: {len(stray)} key(s) not pending in lookup {token}")
            # Called from a callback, on_lookup's first answer may still be queued.
            self.driver.drain()
        if served is None or self._served.get(token) is not served:
            if not hits:
                return None
            done: JobFuture[StoreResult] = JobFuture(self._owner)
            done.set_result(StoreResult(self._jobs.new_id(), False, FailReason.NOT_SERVED,
                                        f"lookup {token} has nothing pending any more"))
            return done
        job = self._jobs.new_id() if hits else None
        fut: JobFuture[StoreResult] = JobFuture(self._owner)
        if job is not None:
            self._jobs.stores[job] = fut
        try:
            self.driver.feed(peer_id, HostAnswerLookup(served.session_token, hits, job, still),
                             served.session)
        except BaseException:
            if job is not None:
                del self._jobs.stores[job]
            raise
        served.pending = still
        if not still:
            self._served.forget(token)
        self.driver.drain()
        return fut if job is not None else None

    def _answer(self, peer_id: str, session: Session, req: LookupRequest) -> None:
        """Ask ``on_lookup``, showing it our token for the lookup (unique in this node,
        unlike the session's, which restarts with each session) and the future of the
        pins it returns."""
        token = self._served.new_token()
        pins: JobFuture[StoreResult] = JobFuture(self._owner)
        hits: dict[bytes, int] = {}
        pending: frozenset[bytes] = frozenset()
        self._metrics.count("lookups_served")
        if self.on_lookup is not None:
            ask = LookupAsk(token, req.kv_request_id, req.round_seq, req.keys, pins)
            self._served.asking = token
            try:
                answer_hits, answer_pending = self.on_lookup(peer_id, ask)
                hits = {k: as_int(v) for k, v in answer_hits.items()}
                pending = frozenset(answer_pending)
                check_local_indexes("on_lookup", hits.values(), self._config.num_blocks)
            except Exception as exc:  # answered all MISS: nothing was pinned for it
                self.host_failed("on_lookup", peer_id, f"lookup of {req.kv_request_id}", exc)
                hits, pending = {}, frozenset()
            finally:
                self._served.asking = None
        job = None
        if hits:
            job = self._jobs.new_id()
            self._jobs.stores[job] = pins
        else:
            pins.set_result(StoreResult(0, False, FailReason.NOT_SERVED, "nothing was pinned"))
        if pending - hits.keys():
            self._served.hold(token, ServedLookup(peer_id, session, req.token,
                                                  pending - hits.keys()))
        self.driver.feed(peer_id, HostAnswerLookup(req.token, hits, job, pending), session)
