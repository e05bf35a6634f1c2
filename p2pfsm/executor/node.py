"""A node: sessions bound to a real ZeroMQ control plane and a real NIXL data plane.

Theory of operation. A :class:`Node` owns one :class:`ControlPlane` (bound ROUTER,
one DEALER per peer), one :class:`DataPlane` (the registered block region: the host's
own memory or one the node allocates) and one sans-IO :class:`~p2pfsm.session.Session`
per peer. Everything runs on the thread that drives it: :meth:`Node.run_until` /
:meth:`Node.serve`, or an event loop that waits on :meth:`Node.fileno` until
:meth:`Node.next_deadline` and calls ``step(0)`` (:mod:`p2pfsm.aio` does this for
asyncio). A turn feeds what happened to the sessions as input events through the
node's :class:`~p2pfsm.executor.driver.Driver`, which hands their outputs to the node's
effects. There is no fixed-interval sleep and no NIXL progress thread.

This module holds the host API, the loop and the wiring; the rest of the node lives in
rooms with one job each: :mod:`~p2pfsm.executor.node_state` (its fields and the way
into the driver), :mod:`~p2pfsm.executor.node_sessions` (the peer/session table),
:mod:`~p2pfsm.executor.node_effects` (outputs carried out, results handed to the host),
:mod:`~p2pfsm.executor.node_threads` (which thread drives it),
:mod:`~p2pfsm.executor.writes`; the sessions' deadlines are the driver's.

Host API: :meth:`connect` (and :meth:`when_ready`), :meth:`fetch` (a
:class:`~p2pfsm.executor.jobs.JobFuture` of LoadResult), :meth:`lookup`, :meth:`supply`,
:meth:`finish`, :meth:`resolve_lookup`, :meth:`close`. Host callbacks (``on_lookup``,
``on_fetch``, ``on_result``) are queued and run after the outputs of the call that
produced them are carried out: never from inside a session step, so they may call the
host API freely.

Observability: :attr:`Node.metrics` (:class:`~p2pfsm.metrics.NodeMetrics`), stdlib
logging under ``p2pfsm.node``, and an optional :class:`~p2pfsm.spec_log.CallHook` around
every ``Session.handle`` call (``NodeConfig.trace`` installs the spec trace log).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from p2pfsm.errors import ConfigError, LocalProtocolError, TransportError
from p2pfsm.executor.admission import NewPeerRate, is_connect_from
from p2pfsm.executor.bindings import Bindings
from p2pfsm.executor.config import NodeConfig, fingerprint
from p2pfsm.executor.driver import Driver
from p2pfsm.executor.jobs import JobFuture, LookupAsk, OpenJobs, OpenLoad, copy_outcome
from p2pfsm.executor.nixl_plane import DataPlane
from p2pfsm.executor.node_effects import NodeEffects, NodeOutputs
from p2pfsm.executor.node_sessions import RESTART_BURST, RESTART_PERIOD_S, NodeSessions
from p2pfsm.executor.node_state import LookupAnswer, as_int, as_ints
from p2pfsm.executor.node_threads import DrivingThreads
from p2pfsm.executor.peer_control import PeerControl
from p2pfsm.executor.peer_ids import peer_address
from p2pfsm.executor.peer_policy import EndedSessions, IdleInbound, ViolationBudget
from p2pfsm.executor.redial import Redials
from p2pfsm.executor.served_lookups import ServedLookups
from p2pfsm.executor.threadsafe import ThreadSafeNode
from p2pfsm.executor.writes import Writes
from p2pfsm.executor.zmq_plane import ControlPlane, FrameIn, PeerLost
from p2pfsm.fsm import machine
from p2pfsm.logwindow import LogWindow
from p2pfsm.metrics import NodeMetrics
from p2pfsm.session import (
    DestinationReleased,
    FailReason,
    FetchArrived,
    HostAnswerLookup,
    HostClose,
    HostDecline,
    HostFetch,
    HostFinish,
    HostLookup,
    HostSupply,
    LoadResult,
    LookupResult,
    ProtocolViolation,
    RoundEnded,
    Session,
    SessionDead,
    StoreResult,
    TransportLost,
    WriteFinished,
)
from p2pfsm.session.tombstones import TombstoneBudget
from p2pfsm.spec_log import CallHook

__all__ = ["LookupAnswer", "LookupAsk", "Node", "NodeConfig", "fingerprint"]

log = logging.getLogger("p2pfsm.node")
# A library stays silent until its host configures logging (no lastResort output).
logging.getLogger("p2pfsm").addHandler(logging.NullHandler())

_INBOUND_GRACE_S = 0.05
"""How long the data plane stays at its busy progress interval after a load ends."""

_TERMINAL = machine("session").terminal  # closed: nothing more to do
_UNSTARTED = machine("session").state_set("unstarted")


class Node(PeerControl, NodeSessions, NodeEffects):
    """One process's endpoint: bind, connect to peers, move blocks.

    One thread drives it (``serve``, ``run_until``, ``step``, or an asyncio loop through
    :class:`p2pfsm.aio.AsyncNode`) and makes its host calls; other threads submit theirs
    through :attr:`threadsafe`. A direct host call from another thread while one drives
    the node is refused with a :class:`LocalProtocolError` saying so.
    """

    def __init__(
        self,
        config: NodeConfig,
        *,
        on_lookup: Callable[[str, LookupAsk], LookupAnswer] | None = None,
        on_fetch: Callable[[str, FetchArrived], None] | None = None,
        on_result: Callable[[str, LoadResult | StoreResult | LookupResult], None] | None = None,
        on_round_ended: Callable[[str, RoundEnded], None] | None = None,
        on_peer_state: Callable[[str, str, str], None] | None = None,
        call_hook: CallHook | None = None,
        on_released: Callable[[str, DestinationReleased], None] | None = None,
    ) -> None:
        if not isinstance(config, NodeConfig):
            raise ConfigError(f"config: expected a NodeConfig, got {config!r}")
        self.config = config
        self.on_lookup = on_lookup
        self.on_fetch = on_fetch
        self.on_result = on_result
        self.on_round_ended = on_round_ended
        self.on_released = on_released
        self.on_peer_state = on_peer_state
        self.metrics = NodeMetrics()
        self.control = ControlPlane(config.bind, heartbeat_ivl_ms=config.heartbeat_ivl_ms,
                                    heartbeat_timeout_ms=config.heartbeat_timeout_ms,
                                    heartbeat_ttl_ms=config.heartbeat_timeout_ms,
                                    connect_timeout_ms=config.connect_timeout_ms,
                                    max_peers=config.max_peers,
                                    advertise_host=config.advertise_host,
                                    dial_back_check=is_connect_from,
                                    holds_session=self._holds_ended_session,
                                    dial_back_any_host=config.dial_back_any_host,
                                    max_pending=config.max_pending_peers,
                                    max_new_peers_per_s=config.max_new_peers_per_s,
                                    curve=config.curve_keys())
        try:
            name = f"p2pfsm-{uuid.uuid4()}"
            self.data = DataPlane(name, config.num_blocks, config.block_len, config.device,
                                  memory=config.memory)
        except BaseException:
            self.control.close()
            raise
        self.local_id = self.control.local_id
        # Drawn per process and sent in every connect: a peer that sees a new one on a
        # live session knows we restarted (vLLM peers ignore the field).
        self.incarnation = secrets.randbits(63)
        self.sessions: dict[str, Session] = {}
        self.deaths: OrderedDict[str, SessionDead] = OrderedDict()
        self._holders: dict[str, list[Session]] = {}  # replaced sessions holding destinations
        # Each held destination's release, by job (kept a while after it resolves).
        self._releases: OrderedDict[int, JobFuture[DestinationReleased]] = OrderedDict()
        self.violations: deque[tuple[str, ProtocolViolation]] = deque(maxlen=config.history)
        self._ended = EndedSessions(config.history)  # peers whose session ended
        # Every session's tombstones together (SessionConfig.tombstone_budget).
        self._tombstones = TombstoneBudget(
            config.max_node_tombstones, lambda: self.metrics.count("tombstones_dropped"))
        self._rate_limited = 0  # control.rate_limited already in metrics
        # Calls from other threads (cancels, node.threadsafe), run in order by the driver.
        self._submitted: deque[Callable[[], None]] = deque()
        self._writes = Writes(self.data, config.block_len)  # ours, by (session, xfer)
        self._jobs = OpenJobs()  # every job that still owes the host a result
        self._started_at: dict[str, float] = {}
        self._served = ServedLookups()  # on_lookup's tokens, lookups with keys pending
        self._host_error_log = LogWindow()
        self._foreign_log = LogWindow()
        # Lines a peer can make fire at will (refused handshakes and registrations,
        # sessions that die before their handshake): one window for them all.
        self._hostile_log = LogWindow(10, 10.0)
        # New sessions of an identity whose last one ended (NodeSessions._may_come_back).
        self._restarts = NewPeerRate(RESTART_BURST, refill=1.0 / RESTART_PERIOD_S)
        self._bindings = Bindings()
        self._violations = ViolationBudget(config.max_violations)  # of the live session
        self._live: set[str] = set()  # peers whose session is alive (O(1) gauges per turn)
        self._idle = IdleInbound(config.idle_timeout_s)  # inbound sessions' last frames
        self._job = 0
        self._closed = False
        self._threads = DrivingThreads()
        self._close_request: tuple[float, Future[None]] | None = None
        self._redials = Redials(config.reconnect_backoff_s,  # sessions opened again
                                config.reconnect_max_attempts)
        self._unsent_death: Session | None = None  # died before ready, being redialled
        self._incarnations: OrderedDict[str, int | None] = OrderedDict()  # peers' last seen
        self._threadsafe: ThreadSafeNode | None = None
        self._hook = call_hook
        if call_hook is None and config.trace is not None:
            from p2pfsm.spec_log import CallLog

            try:
                self._hook = CallLog(config.trace, self.local_id)
            except OSError as exc:
                self.data.close()
                self.control.close()
                raise ConfigError(f"cannot write the trace log {config.trace}: {exc}") from exc
        # Queues inputs, carries out outputs through this node's (private) Executor methods.
        self._driver = Driver(NodeOutputs(self), time.monotonic, self._hook)
        log.info("node %s up: %d blocks of %d bytes", self.local_id, config.num_blocks,
                 config.block_len)

    # ------------------------------------------------------------- host API
    @property
    def region(self) -> Any:
        """Our block region: the host's tensor, the one the node allocated (a uint8
        tensor, one row per block), or None for raw host memory."""
        return self.data.region

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run (here or through ``threadsafe.close()``)."""
        return self._closed

    def connect(self, peer_id: str) -> Session:
        """Open (or return) the session to ``peer_id`` ("host:port"; "tcp://host:port" is
        the same peer, as is every host call's ``peer_id``)."""
        peer_id = peer_address(peer_id)
        self._check_open()
        self._check_thread("connect")
        session = self.sessions.get(peer_id)
        if session is not None and session.alive:
            return session
        self._redials.host_dialled(peer_id)
        self.control.connect(peer_id)
        self._bindings.forget(peer_id)  # a new session: bound by the peer's first frame
        session = self._new_session(peer_id)
        self._idle.ours(peer_id)  # never evicted for idleness
        self._peer_state(peer_id, "connecting", "")
        self._feed_parked(peer_id, session)
        return session

    def when_ready(self, peer_id: str) -> JobFuture[Session]:
        """A future of the session to ``peer_id`` once it is ready; a
        :class:`TransportError` naming the reason if it dies first."""
        peer_id = peer_address(peer_id)
        session = self.session(peer_id)
        fut: JobFuture[Session] = JobFuture(self)
        if session.ready:
            fut.set_result(session)
        elif not session.alive and session.state not in _UNSTARTED:
            fut.set_exception(TransportError(self._death_reason(peer_id)))
        else:
            self._jobs.ready_waiters.setdefault(peer_id, []).append(fut)
        return fut

    def fetch(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
              dest_indexes: Iterable[int]) -> JobFuture[LoadResult]:
        """Load ``keys`` from the peer into our blocks ``dest_indexes``; one result.

        ``cancel()`` on the future finishes the request (aborting a round in flight); the
        future still resolves with the final LoadResult.
        """
        peer_id = peer_address(peer_id)
        self._check_thread("fetch")  # before anything changes
        keys = tuple(keys)
        job = self.new_job_id()
        fut: JobFuture[LoadResult] = JobFuture(
            self, lambda: self._finish_quietly(peer_id, kv_request_id))
        event = HostFetch(job, kv_request_id, keys, as_ints(dest_indexes))
        loads = self._jobs.loads
        loads[job] = OpenLoad(fut, time.monotonic(), len(keys) * self.config.block_len, event)
        try:
            self._host(peer_id, event)
        except BaseException:
            del loads[job]
            raise
        self.metrics.count("fetches_started")
        self.data.expect_inbound(_INBOUND_GRACE_S, prompt=True)
        return fut

    def lookup(self, peer_id: str, kv_request_id: str,
               keys: Iterable[bytes]) -> JobFuture[LookupResult]:
        """Ask the peer which keys it holds; one result."""
        peer_id = peer_address(peer_id)
        self._check_thread("lookup")
        fut: JobFuture[LookupResult] = JobFuture(self)
        self._jobs.add_lookup(peer_id, kv_request_id, fut)
        try:
            self._host(peer_id, HostLookup(kv_request_id, tuple(keys)))
        except BaseException:
            self._jobs.drop_last_lookup(peer_id, kv_request_id)
            raise
        self.metrics.count("lookups_started")
        return fut

    def supply(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
               local_indexes: Iterable[int]) -> JobFuture[StoreResult]:
        """Offer stored blocks to the peer; they stay pinned until the result."""
        peer_id = peer_address(peer_id)
        self._check_thread("supply")
        job = self.new_job_id()
        fut: JobFuture[StoreResult] = JobFuture(self)
        self._jobs.stores[job] = fut
        try:
            self._host(peer_id, HostSupply(job, kv_request_id, tuple(keys),
                                           as_ints(local_indexes)))
        except BaseException:
            del self._jobs.stores[job]
            raise
        self.metrics.count("stores_started")
        return fut

    def finish(self, peer_id: str, kv_request_id: str) -> None:
        """The host is done with the request (both roles): a load in flight is aborted
        (its result still comes), a demand that cannot be met is answered."""
        peer_id = peer_address(peer_id)
        self._host(peer_id, HostFinish(kv_request_id))

    def decline(self, peer_id: str, kv_request_id: str, round_seq: int) -> None:
        """Round ``round_seq`` of the request (a fetch ``on_fetch`` heard of) will get no
        more supply: it fails (transfer_done(false) once its writes have landed), and the
        request goes on: a later round of it is served as usual. A round that ended
        meanwhile takes nothing; one no fetch has named yet raises LocalProtocolError."""
        peer_id = peer_address(peer_id)
        self._host(peer_id, HostDecline(kv_request_id, round_seq))

    def resolve_lookup(self, peer_id: str, token: int, hits: Mapping[bytes, int] | None = None,
                       pending: Iterable[bytes] = ()) -> JobFuture[StoreResult] | None:
        """Settle keys that ``on_lookup`` left pending in the peer's lookup ``token``.

        ``hits`` maps a key to the local block now pinned for it; keys in ``pending``
        stay pending (resolve again later); every other still-pending key is a miss.
        Returns the future StoreResult of the new pins (None without hits): release
        them then. A lookup with nothing pending any more (all settled, its
        ``lookup_pending`` deadline passed, or the request or session ended) takes
        nothing: the future is already done with ``success=False``. Raises
        :class:`LocalProtocolError`, changing nothing, for a token never given to
        ``on_lookup``, one of another peer, a key both hit and pending, a key not
        pending, or an index outside our region.
        """
        peer_id = peer_address(peer_id)
        self._check_open()
        self._check_thread("resolve_lookup")
        hits = {k: as_int(v) for k, v in (hits or {}).items()}
        still = frozenset(pending)
        served = self._served.checked(token, peer_id)
        self._check_local_indexes("resolve_lookup", hits.values())
        both = hits.keys() & still
        if both:
            raise LocalProtocolError(f"resolve_lookup: {len(both)} key(s) both hit and pending")
        if served is not None:
            stray = [k for k in (*hits, *still) if k not in served.pending]
            if stray:
                raise LocalProtocolError(
                    f"resolve_lookup: {len(stray)} key(s) not pending in lookup {token}")
            # Called from a callback, on_lookup's first answer may still be queued.
            self._drain()
        if served is None or self._served.get(token) is not served:
            if not hits:
                return None
            done: JobFuture[StoreResult] = JobFuture(self)
            done.set_result(StoreResult(self.new_job_id(), False, FailReason.NOT_SERVED,
                                        f"lookup {token} has nothing pending any more"))
            return done
        job = self.new_job_id() if hits else None
        fut: JobFuture[StoreResult] = JobFuture(self)
        if job is not None:
            self._jobs.stores[job] = fut
        try:
            self._feed(peer_id, HostAnswerLookup(served.session_token, hits, job, still),
                       session=served.session)
        except BaseException:
            if job is not None:
                del self._jobs.stores[job]
            raise
        served.pending = still
        if not still:
            self._served.forget(token)
        self._drain()
        return fut if job is not None else None

    # ------------------------------------------------------------- the loop
    def run_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Run the loop until ``done()`` or ``timeout`` seconds; returns ``done()``."""
        end = time.monotonic() + timeout
        with self._threads.driving_block("run_until"):
            while not done():
                left = end - time.monotonic()
                if left <= 0 or self._closed:
                    return done()
                self.step(left)
        return True

    def serve(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Run the loop until ``stop()`` is true or the node is closed (by
        ``threadsafe.close()`` from another thread, say)."""
        with self._threads.driving_block("serve"):
            while not stop() and not self._closed:
                self.step(1.0)

    def fileno(self) -> int:
        """A descriptor that turns readable when the control plane has news.

        For a host's own event loop: wait on it (readable) or until
        :meth:`next_deadline`, whichever comes first, then call ``step(0)``. It is edge
        triggered underneath: after it turns readable, ``step(0)`` before waiting again.
        """
        return self.control.fileno()

    def next_deadline(self) -> float:
        """The ``time.monotonic()`` by which ``step`` must run again: the earliest armed
        timer, connect deadline or data-plane progress tick."""
        now = time.monotonic()
        deadline = now + self.data.progress_interval_ms / 1000.0
        earliest = self._driver.next_deadline()
        if earliest is not None:
            deadline = min(deadline, earliest)
        redial = self._redials.next_due()
        if redial is not None:
            deadline = min(deadline, redial)
        connect_ms = self.control.next_timeout_ms()
        if connect_ms is not None:
            deadline = min(deadline, now + connect_ms / 1000.0)
        if self._driver.busy or self._submitted:
            deadline = now
        return deadline

    def step(self, max_wait: float) -> int:
        """One loop turn: wait for news (at most ``max_wait`` s), then handle it all.
        Returns how many control-plane events it took in."""
        self._check_open()
        threads = self._threads
        if threads.in_turn_here():
            raise LocalProtocolError("step() called from inside the node's own loop")
        with threads.driving_block("step"):
            with threads.turn():
                taken = self._turn(max_wait)
            if self._close_request is not None:
                self._close_now()
        return taken

    def _close_now(self) -> None:
        """Carry out ``threadsafe.close()`` on the driving thread, after a turn."""
        assert self._close_request is not None
        timeout, done = self._close_request
        self._close_request = None
        try:
            self.close(timeout)
        except BaseException as exc:
            done.set_exception(exc)
            raise
        done.set_result(None)

    # ------------------------------------------------- calls from other threads
    @property
    def threadsafe(self) -> ThreadSafeNode:
        """Host calls from any thread: each returns a future at once and is carried
        out by the thread that drives the node (:class:`ThreadSafeNode`)."""
        if self._threadsafe is None:
            self._threadsafe = ThreadSafeNode(self)
        return self._threadsafe

    def call_soon_threadsafe(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the driving thread at the start of its next turn, waking a
        loop that waits. Calls run in the order they were submitted; one that raises
        ends that turn's step with its error (wrap what may fail). Safe from any
        thread; raises :class:`LocalProtocolError` once the node is closed."""
        self._check_open()
        self._submitted.append(call)
        self.control.wake()

    def request_close(self, timeout: float, done: Future[None]) -> None:
        """Close the node from the driving thread after its current turn (any thread;
        ``done`` resolves once closed). Used by ``threadsafe.close()``."""
        self._check_open()
        if self._close_request is None:
            self._close_request = (timeout, done)
        else:  # a second request: done when the first one is
            first = self._close_request[1]
            first.add_done_callback(lambda f: copy_outcome(f, done))
        self.control.wake()

    def _turn(self, max_wait: float) -> int:
        self._handle_all()
        if self._jobs.loads:
            # Blocks may be arriving (a peer's first WRITE needs our UCX progress):
            # progress often while loads are open, and only then.
            self.data.expect_inbound(_INBOUND_GRACE_S)
        wait = max(0.0, min(max_wait, self.next_deadline() - time.monotonic()))
        # Round up: truncating made every sub-ms remainder a poll(0), so the 1 ms busy
        # pace (always a hair under 1 ms away by now) was a spin.
        events = self.control.poll(math.ceil(wait * 1000))
        for event in events:
            if isinstance(event, FrameIn):
                self._on_frame(event.peer_id, event.frame, event.conn)
            elif isinstance(event, PeerLost):
                self._queue(event.peer_id, TransportLost(event.reason))
        self.data.progress()
        self._collect_writes()
        now = time.monotonic()
        self._driver.queue_due(now)
        if self._idle.due(now):
            self._evict_idle(now)
        if self._redials:
            self._redial_due(now)
        self._handle_all()
        self._update_gauges()
        return len(events)

    def close(self, timeout: float = 5.0) -> None:
        """Close every session, give writes ``timeout`` to drain, release the transports.

        Closing a session gives each of its open jobs its result, as a session's end
        does (a failed LoadResult with ``reason`` SESSION_ENDED, ``released`` False
        where the peer could still have written; failed StoreResults; unanswered
        lookups). A future that still has none after that (a job no session held, a
        ``when_ready`` wait) gets a :class:`TransportError` "node closed"."""
        if self._closed:
            return
        self._check_thread("close")
        self._handle_all()  # calls submitted before the close are carried out first
        for peer in list(self.sessions):
            if self.sessions[peer].state not in _TERMINAL:
                self._queue(peer, HostClose())
        self._end_parked()
        self._drain()
        self.run_until(lambda: not self._writes, timeout)
        for write in self._writes.running():
            self._writes.forget(write)
            self._feed(write.peer_id, WriteFinished(write.xfer, False), session=write.session)
        self._drain()
        self._jobs.fail_all(TransportError("node closed"))
        self._closed = True
        self.data.close()
        self.control.close()
        if self._hook is not None:
            self._hook.close()
        log.info("node %s closed", self.local_id)

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------- Driven (futures)
    def wait_problem(self) -> str | None:
        if self._closed:
            return "the node is closed"
        return self._threads.wait_problem()

    def request_cancel(self, action: Callable[[], None]) -> None:
        if self._closed:
            return
        if self._threads.may_run_here():
            action()
        else:
            self._submitted.append(action)  # run by the driver on its next turn
            self.control.wake()

    def attach_event_loop(self, thread_id: int | None) -> None:
        """Mark the thread of the asyncio loop driving the node (None: detach)."""
        self._threads.aio = thread_id

    # ------------------------------------------------------------ the loop's parts
    def _handle_all(self) -> None:
        """Handle every queued event, and the writes that this finished at once: over
        CMA a WRITE usually completes inside ``transfer()``, and waiting for the next
        turn to notice would add a whole loop wait (up to the idle interval) to it."""
        while self._submitted:
            self._submitted.popleft()()
        self._drain()
        while self._writes and self._collect_writes():
            self._drain()

    def _collect_writes(self) -> bool:
        """Queue WriteFinished for our finished writes; True when there were any."""
        found = False
        for write, ok in self._writes.finished():
            if ok:
                self.metrics.count("served_bytes", write.nbytes)
            self._driver.queue(write.peer_id, WriteFinished(write.xfer, ok), write.session)
            found = True
        return found

    def _update_gauges(self) -> None:
        limited = self.control.rate_limited
        if limited != self._rate_limited:
            self.metrics.count("identities_rate_limited", limited - self._rate_limited)
            self._rate_limited = limited
        self.metrics.set_gauge("peers", len(self._live))
        self.metrics.set_gauge("open_loads", len(self._jobs.loads))
        self.metrics.set_gauge("open_stores", len(self._jobs.stores))
        self.metrics.set_gauge("destinations_held", sum(self.held_destinations().values()))
