"""A node: sessions bound to a real ZeroMQ control plane and a real NIXL data plane.

Theory of operation. A :class:`Node` owns one :class:`ControlPlane` (bound ROUTER,
one DEALER per peer), one :class:`DataPlane` (the registered block region: the host's
own memory or one the node allocates) and one sans-IO :class:`~p2pfsm.session.Session`
per peer. Everything runs on the thread that drives it: :meth:`Node.run_until` /
:meth:`Node.serve`, or an event loop that waits on :meth:`Node.fileno` until
:meth:`Node.next_deadline` and calls ``step(0)`` (:mod:`p2pfsm.aio` does this for
asyncio). A turn feeds what happened to the sessions as input events and carries out
their outputs. There is no fixed-interval sleep and no NIXL progress thread.

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

import contextlib
import dataclasses
import logging
import math
import operator
import secrets
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from p2pfsm.errors import ConfigError, LocalProtocolError, RemoteProtocolError, TransportError
from p2pfsm.executor.admission import is_connect_from
from p2pfsm.executor.bindings import Bindings
from p2pfsm.executor.config import NodeConfig, fingerprint
from p2pfsm.executor.core import Executor, TimerTable
from p2pfsm.executor.driver import Driver
from p2pfsm.executor.jobs import Driven, JobFuture, LookupAsk, OpenJobs, OpenLoad, copy_outcome
from p2pfsm.executor.nixl_plane import DataPlane, WriteId
from p2pfsm.executor.peer_policy import EndedSessions, IdleInbound, ViolationBudget
from p2pfsm.executor.redial import Parked, Redials
from p2pfsm.executor.served_lookups import ServedLookup, ServedLookups
from p2pfsm.executor.threadsafe import ThreadSafeNode
from p2pfsm.executor.zmq_plane import ControlPlane, FrameIn, PeerLost
from p2pfsm.fsm import machine
from p2pfsm.logwindow import LogWindow
from p2pfsm.metrics import NodeMetrics
from p2pfsm.protocol import AbortFetch, Connect, decode, encode
from p2pfsm.session import (
    ArmTimer,
    CancelWrite,
    DisarmTimer,
    FailReason,
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
    ProtocolViolation,
    RegistrationFinished,
    RoundEnded,
    SendFrame,
    SendToLostPeer,
    Session,
    SessionConfig,
    SessionDead,
    StartRegistration,
    StartWrite,
    StoreResult,
    TimerFired,
    TimerId,
    TransportLost,
    WriteFinished,
)
from p2pfsm.spec_log import CallHook

__all__ = ["LookupAnswer", "LookupAsk", "Node", "NodeConfig", "fingerprint"]

log = logging.getLogger("p2pfsm.node")
# A library stays silent until its host configures logging (no lastResort output).
logging.getLogger("p2pfsm").addHandler(logging.NullHandler())

_INBOUND_GRACE_S = 0.05
"""How long the data plane stays at its busy progress interval after a load ends."""

_DRIVEN_RECENTLY_S = 1.0
"""A thread that stepped the node this recently counts as its driver."""

_HOST_CALLS: dict[type, str] = {HostFetch: "fetch", HostLookup: "lookup", HostSupply: "supply",
                                HostFinish: "finish", HostDecline: "decline"}
"""The host call each host input comes from (for the wrong-thread error)."""

_SESSION = machine("session")
_TERMINAL = _SESSION.terminal  # closed: nothing more to do
_UNSTARTED = _SESSION.state_set("unstarted")


def _as_int(value: Any) -> Any:
    """A block index as a plain int: numpy and torch integers (anything with
    ``__index__`` but bool) become ints; anything else is left for the session to refuse
    with the index named."""
    if type(value) is int or isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


LookupAnswer = tuple[Mapping[bytes, int], Iterable[bytes]]
"""What ``on_lookup`` returns: hit key -> local block index, and still-pending keys."""


@dataclass(eq=False, slots=True)
class _Write:
    """One of our WRITEs: its session, the session's id for it, and its size."""

    peer_id: str
    xfer: int
    nbytes: int
    session: Session

    @property
    def key(self) -> tuple[Session, int]:
        """Its id in ``Node._writes`` and in the data plane: (session, xfer)."""
        return (self.session, self.xfer)


def _is_connect(frame: bytes) -> bool:
    try:
        return isinstance(decode(frame), Connect)
    except RemoteProtocolError:
        return False


class Node(Driven, Executor):
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
        call_hook: CallHook | None = None,
    ) -> None:
        if not isinstance(config, NodeConfig):
            raise ConfigError(f"config: expected a NodeConfig, got {config!r}")
        self.config = config
        self.on_lookup = on_lookup
        self.on_fetch = on_fetch
        self.on_result = on_result
        self.on_round_ended = on_round_ended
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
        self.violations: deque[tuple[str, ProtocolViolation]] = deque(maxlen=config.history)
        self._ended = EndedSessions(config.history)  # peers whose session ended
        self._rate_limited = 0  # control.rate_limited already in metrics
        self._timer_owner: dict[tuple[str, TimerId], Session] = {}
        # Calls from other threads (cancels, node.threadsafe), run in order by the driver.
        self._submitted: deque[Callable[[], None]] = deque()
        self._timers: TimerTable[tuple[str, TimerId]] = TimerTable()
        # Our WRITEs by (session, its xfer id), the id the data plane reports them by.
        self._writes: dict[WriteId, _Write] = {}
        self._jobs = OpenJobs()  # every job that still owes the host a result
        self._started_at: dict[str, float] = {}
        self._served = ServedLookups()  # on_lookup's tokens, lookups with keys pending
        self._host_error_log = LogWindow()
        self._foreign_log = LogWindow()
        self._bindings = Bindings()
        self._violations = ViolationBudget(config.max_violations)  # of the live session
        self._live: set[str] = set()  # peers whose session is alive (O(1) gauges per turn)
        self._idle = IdleInbound(config.idle_timeout_s)  # inbound sessions' last frames
        self._job = 0
        self._closed = False
        self._loop_thread: int | None = None  # the thread inside step(), while it is
        self._driving_thread: int | None = None  # the thread inside serve / run_until / step
        self._last_step: tuple[int, float] | None = None
        self._aio_thread: int | None = None
        self._close_request: tuple[float, Future[None]] | None = None
        self._redials = Redials(config.reconnect_backoff_s)  # sessions opened again
        self._unsent_death: Session | None = None  # died before ready, being redialled
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
        # Queues inputs, carries out outputs through this node's Executor methods.
        self._driver = Driver(self, time.monotonic, self._hook)
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

    def new_job_id(self) -> int:
        self._job += 1
        return self._job

    def connect(self, peer_id: str) -> Session:
        """Open (or return) the session to ``peer_id`` ("host:port")."""
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
        self._feed_parked(peer_id, session)
        return session

    def when_ready(self, peer_id: str) -> JobFuture[Session]:
        """A future of the session to ``peer_id`` once it is ready; a
        :class:`TransportError` naming the reason if it dies first."""
        session = self.session(peer_id)
        fut: JobFuture[Session] = JobFuture(self)
        if session.ready:
            fut.set_result(session)
        elif not session.alive and session.state not in _UNSTARTED:
            fut.set_exception(TransportError(self._death_reason(peer_id)))
        else:
            self._jobs.ready_waiters.setdefault(peer_id, []).append(fut)
        return fut

    def session(self, peer_id: str) -> Session:
        try:
            return self.sessions[peer_id]
        except KeyError:
            raise LocalProtocolError(f"no session to {peer_id}; connect first") from None

    def fetch(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
              dest_indexes: Iterable[int]) -> JobFuture[LoadResult]:
        """Load ``keys`` from the peer into our blocks ``dest_indexes``; one result.

        ``cancel()`` on the future finishes the request (aborting a round in flight); the
        future still resolves with the final LoadResult.
        """
        self._check_thread("fetch")  # before anything changes
        keys = tuple(keys)
        job = self.new_job_id()
        fut: JobFuture[LoadResult] = JobFuture(
            self, lambda: self._finish_quietly(peer_id, kv_request_id))
        event = HostFetch(job, kv_request_id, keys, tuple(map(_as_int, dest_indexes)))
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
        self._check_thread("supply")
        job = self.new_job_id()
        fut: JobFuture[StoreResult] = JobFuture(self)
        self._jobs.stores[job] = fut
        try:
            self._host(peer_id, HostSupply(job, kv_request_id, tuple(keys),
                                           tuple(map(_as_int, local_indexes))))
        except BaseException:
            del self._jobs.stores[job]
            raise
        self.metrics.count("stores_started")
        return fut

    def finish(self, peer_id: str, kv_request_id: str) -> None:
        """The host is done with the request (both roles): a load in flight is aborted
        (its result still comes), a demand that cannot be met is answered."""
        self._host(peer_id, HostFinish(kv_request_id))

    def decline(self, peer_id: str, kv_request_id: str, round_seq: int) -> None:
        """Round ``round_seq`` of the request (a fetch ``on_fetch`` heard of) will get no
        more supply: it fails (transfer_done(false) once its writes have landed), and the
        request goes on: a later round of it is served as usual. A round that ended
        meanwhile takes nothing; one no fetch has named yet raises LocalProtocolError."""
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
        self._check_open()
        self._check_thread("resolve_lookup")
        hits = {k: _as_int(v) for k, v in (hits or {}).items()}
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
        with self._driving("run_until"):
            while not done():
                left = end - time.monotonic()
                if left <= 0 or self._closed:
                    return done()
                self.step(left)
        return True

    def serve(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Run the loop until ``stop()`` is true or the node is closed (by
        ``threadsafe.close()`` from another thread, say)."""
        with self._driving("serve"):
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
        earliest = self._timers.earliest()
        if earliest is not None:
            deadline = min(deadline, earliest[0])
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
        me = threading.get_ident()
        if self._loop_thread == me:
            raise LocalProtocolError("step() called from inside the node's own loop")
        with self._driving("step"):
            self._loop_thread = me
            try:
                taken = self._turn(max_wait)
            finally:
                self._loop_thread = None
                self._last_step = (me, time.monotonic())
            if self._close_request is not None:
                self._close_now()
        return taken

    @contextlib.contextmanager
    def _driving(self, what: str) -> Iterator[None]:
        """This thread drives the node for the block (nested calls keep the outer's)."""
        self._check_thread(what)
        outer = self._driving_thread is None
        if outer:
            self._driving_thread = threading.get_ident()
        try:
            yield
        finally:
            if outer:
                self._driving_thread = None

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
        for peer, timer in self._timers.pop_due(now):
            owner = self._timer_owner.pop((peer, timer), None)
            if owner is not None:
                self._driver.queue(peer, TimerFired(timer), owner)
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
        for peer in list(self.sessions):
            if self.sessions[peer].state not in _TERMINAL:
                self._queue(peer, HostClose())
        self._end_parked()
        self._drain()
        self.run_until(lambda: not self._writes, timeout)
        for write in list(self._writes.values()):
            self._forget_write(write)
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
        me = threading.get_ident()
        if self._closed:
            return "the node is closed"
        if self._loop_thread == me:
            return "called from inside the node's loop (a callback); let the loop finish it"
        if self._aio_thread is not None:
            if self._aio_thread == me:
                return "called on the event loop's thread; await it instead"
            return None
        if self._loop_thread is not None:
            return None
        if (self._last_step is not None and self._last_step[0] != me
                and time.monotonic() - self._last_step[1] < _DRIVEN_RECENTLY_S):
            return None
        return ("nothing drives the node: call node.run_until(future.done, timeout) here, "
                "run node.serve() on another thread, or await it through p2pfsm.aio")

    def request_cancel(self, action: Callable[[], None]) -> None:
        if self._closed:
            return
        me = threading.get_ident()
        driver = self._loop_thread or self._aio_thread
        if driver is None or (driver == me and self._loop_thread is None):
            action()
        else:
            self._submitted.append(action)  # run by the driver on its next turn
            self.control.wake()

    def attach_event_loop(self, thread_id: int | None) -> None:
        """Mark the thread of the asyncio loop driving the node (None: detach)."""
        self._aio_thread = thread_id

    # ------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise LocalProtocolError("the node is closed")

    def _check_thread(self, what: str) -> None:
        """Refuse a call from another thread than the one driving the node."""
        driver = (self._driving_thread if self._driving_thread is not None else self._aio_thread)
        if driver is not None and driver != threading.get_ident():
            if what in ("serve", "run_until", "step"):
                raise LocalProtocolError(
                    f"{what}(): another thread drives this node; one thread drives it")
            raise LocalProtocolError(
                f"{what}: called from another thread than the one driving this node; "
                f"submit it from here with node.threadsafe.{what}(...), which returns a "
                "future at once")

    def _check_local_indexes(self, what: str, indexes: Iterable[object]) -> None:
        outside = [i for i in indexes
                   if type(i) is not int or not 0 <= i < self.config.num_blocks]
        if outside:
            raise LocalProtocolError(f"{what}: index {outside[0]!r} outside our region")

    def _finish_quietly(self, peer_id: str, kv_request_id: str) -> None:
        """A cancelled fetch: finish its request unless the session is already over (a
        fetch still waiting for its session to open again fails at once)."""
        for ev in self._redials.take_request(peer_id, kv_request_id):
            self._fail_parked(peer_id, ev, FailReason.FINISHED,
                              "cancelled while it waited for the session to open again")
        session = self.sessions.get(peer_id)
        if self._closed or session is None or not session.alive:
            return
        with contextlib.suppress(LocalProtocolError):  # ended meanwhile: result on its way
            self.finish(peer_id, kv_request_id)
        log.info("fetch of %s from %s cancelled: request finished", kv_request_id, peer_id)

    def _host(self, peer_id: str, event: Input) -> None:
        self._check_open()
        self._check_thread(_HOST_CALLS.get(type(event), "a host call"))
        if self._redials.waiting(peer_id) and isinstance(event, HostFetch | HostLookup):
            # The session is dead and opens again soon: the call waits for it, up to
            # its own deadline.
            self.session(peer_id).check_host_call(event)  # bad arguments: refused now
            limit = (self.config.timeouts.load if isinstance(event, HostFetch)
                     else self.config.timeouts.lookup)
            self._redials.park(peer_id, time.monotonic() + limit, event)
            return
        self._feed(peer_id, event, session=self.session(peer_id))
        self._drain()

    def _new_session(self, peer_id: str) -> Session:
        cfg = self.config
        session = Session(SessionConfig(
            local_id=self.local_id,
            agent_metadata=self.data.metadata,
            base_addr=self.data.base_addr,
            num_blocks=cfg.num_blocks,
            block_len=cfg.block_len,
            hash_seed=cfg.hash_seed,
            config_fingerprint=cfg.config_fingerprint,
            expected_peer_id=peer_id,
            timeouts=cfg.timeouts,
            incarnation=self.incarnation,
            layout=self.data.layout.wire(),
            max_lookups_per_request=cfg.max_lookups_per_request,
            answer_lookups_in_parts=cfg.answer_lookups_in_parts,
        ), None if self._hook is None else self._hook.tracer)
        self.sessions[peer_id] = session
        self._live.add(peer_id)
        self._violations.new_session(peer_id)
        self._ended.reopened(peer_id)
        self.deaths.pop(peer_id, None)
        self._started_at[peer_id] = time.monotonic()
        self._feed(peer_id, HostStart(), session=session)
        return session

    def _on_frame(self, peer_id: str, frame: bytes, conn: int = -1) -> None:
        session = self.sessions.get(peer_id)
        if (session is not None and session.alive and not self._bindings.admits(peer_id, conn)
                and not _is_connect(frame)):
            # Not the session's connection (p2pfsm.executor.bindings): only a connect,
            # which the session judges as its peer's restart or reconnect, gets through.
            self._foreign_frame(peer_id, session)
            return
        if session is None or (not session.alive and not session.has_pending_work):
            # A new peer (or a restarted one) opens with its connect. Anything else is a
            # straggler of a session that is over (e.g. the disconnect that follows a
            # mismatch): restarting on it would make two incompatible peers restart
            # each other's sessions forever, so it goes to the old session (ignored).
            if not _is_connect(frame):
                if session is not None:
                    self._queue(peer_id, FrameReceived(frame))
                return
            self._new_session(peer_id)
            self._idle.opened_by_peer(peer_id)  # subject to idle eviction
            if self._redials.waiting(peer_id):
                self._opened_by_peer(peer_id)
        self._bindings.bind(peer_id, conn)
        self._idle.heard(peer_id, time.monotonic())
        self._queue(peer_id, FrameReceived(frame))

    def _foreign_frame(self, peer_id: str, session: Session) -> None:
        """A frame under ``peer_id`` from another connection than its live session's (one
        that took the id over: libzmq no longer reads the session's own). Dropped; the
        session is closed (its disconnect tells the real peer, over our own connection
        to it, to start over)."""
        self.metrics.count("foreign_frames")
        self._foreign_log.emit(
            log.warning, "frames from other connections", "peer %s: a frame came on another "
            "connection than its session's (its id taken over) and not as a connect: "
            "dropped, the session closed", peer_id)
        if session.state not in _TERMINAL:
            self._queue(peer_id, HostClose(), session)

    def _queue(self, peer_id: str, event: Input, session: Session | None = None) -> None:
        """Queue ``event`` for ``session`` (default: the peer's session now)."""
        self._driver.queue(peer_id, event, session or self.sessions.get(peer_id))

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
        for write_id, ok in self.data.poll():
            write = self._writes.pop(write_id, None)
            if write is not None:
                if ok:
                    self.metrics.count("served_bytes", write.nbytes)
                self._driver.queue(write.peer_id, WriteFinished(write.xfer, ok), write.session)
                found = True
        return found

    def _forget_write(self, write: _Write) -> None:
        del self._writes[write.key]

    def _drain(self) -> None:
        """Handle queued events, then the queued host callbacks (the driver's drain)."""
        self._driver.drain()

    def _feed(self, peer_id: str, event: Input, *, session: Session | None = None) -> None:
        self._driver.feed(peer_id, event, session or self.sessions[peer_id])

    def session_ready(self, peer: str, session: Session) -> None:
        self._on_ready(peer, session)

    def session_over(self, peer: str, session: Session) -> None:
        if peer in self._live and self.sessions.get(peer) is session:
            self._live.discard(peer)  # died or closed

    # ------------------------------------------- Executor: carrying out outputs
    def send_frame(self, peer: str, out: SendFrame) -> None:
        if not self.control.send(peer, encode(out.message)):
            self._queue(peer, TransportLost("send failed"), self._driver.applying)
        elif isinstance(out.message, AbortFetch):
            self.metrics.count("aborts_sent")
            log.info("peer %s: aborting %s round %d", peer, out.message.kv_request_id,
                     out.message.round_seq)

    def send_to_lost_peer(self, peer: str, out: SendToLostPeer) -> None:
        """A dead session tells a peer that may still hold it live that it is over: over
        our connection to it while it lasts, else the control plane dials it back."""
        if peer in self.control.peers:
            self.send_frame(peer, out)
            return
        if self.control.answer(peer, encode(out.message)):
            self.metrics.count("stale_answers")
            sender = self._driver.applying
            log.info("peer %s: told that its session is over (%s)", peer,
                     None if sender is None else sender.death_reason)

    def start_write(self, peer: str, out: StartWrite) -> None:
        assert self._driver.applying is not None  # outputs are applied only from _feed
        write = _Write(peer, out.xfer, len(out.local_indexes) * self.config.block_len,
                       self._driver.applying)
        key = write.key
        try:
            self.data.write(key, peer, out.local_indexes, out.remote_indexes)
        except TransportError as exc:
            log.warning("write to %s failed to start: %s", peer, exc)
            self._queue(peer, WriteFinished(out.xfer, False), self._driver.applying)
            return
        self._writes[key] = write

    def cancel_write(self, peer: str, out: CancelWrite) -> None:
        write = self._writes.get((self._driver.applying, out.xfer))
        if write is not None and self.data.cancel(write.key):
            self._forget_write(write)
            self._queue(peer, WriteFinished(out.xfer, False), write.session)

    def arm_timer(self, peer: str, out: ArmTimer) -> None:
        assert self._driver.applying is not None  # outputs are applied only from _feed
        self._timers.arm((peer, out.timer), out.deadline)  # sessions run on time.monotonic()
        self._timer_owner[(peer, out.timer)] = self._driver.applying

    def disarm_timer(self, peer: str, out: DisarmTimer) -> None:
        if self._timer_owner.get((peer, out.timer)) is self._driver.applying:
            self._timers.disarm((peer, out.timer))
            del self._timer_owner[(peer, out.timer)]

    def start_registration(self, peer: str, out: StartRegistration) -> None:
        c = out.connect
        try:
            self.data.add_peer(peer, c.agent_metadata, c.base_addr, c.num_blocks, c.block_len,
                               c.layout)
            result = RegistrationFinished(True)
        except (TransportError, ConfigError) as exc:
            log.warning("peer %s: cannot register its memory: %s", peer, exc)
            result = RegistrationFinished(False, str(exc))
        self._queue(peer, result, self._driver.applying)

    def load_result(self, peer: str, out: LoadResult) -> None:
        self._on_load_result(peer, out)

    def store_result(self, peer: str, out: StoreResult) -> None:
        self._deliver(peer, self._jobs.stores.pop(out.job_id, None), out)

    def lookup_result(self, peer: str, out: LookupResult) -> None:
        if out.reason is not None:
            out = dataclasses.replace(out, detail=self._fail_detail(peer, out))
        self._deliver(peer, self._jobs.take_lookup(peer, out.kv_request_id), out)

    def lookup_request(self, peer: str, out: LookupRequest) -> None:
        session = self._driver.applying
        assert session is not None  # outputs are applied only from _feed
        self._driver.defer(lambda: self._answer(peer, session, out))

    def lookup_closed(self, peer: str, out: LookupClosed) -> None:
        token = self._served.token_of(peer, out.token)
        if token is not None:
            self._served.forget(token)

    def fetch_arrived(self, peer: str, out: FetchArrived) -> None:
        on_fetch = self.on_fetch
        if on_fetch is not None:
            self._driver.defer(lambda: self._call_on_fetch(on_fetch, peer, out))

    def round_ended(self, peer: str, out: RoundEnded) -> None:
        on_round_ended = self.on_round_ended
        if on_round_ended is not None:
            self._driver.defer(lambda: self._call_on_round_ended(on_round_ended, peer, out))

    def session_dead(self, peer: str, out: SessionDead) -> None:
        self._on_death(peer, out)

    def protocol_violation(self, peer: str, out: ProtocolViolation) -> None:
        self._on_violation(peer, out)

    def _call_on_fetch(self, on_fetch: Callable[[str, FetchArrived], None], peer_id: str,
                       arrived: FetchArrived) -> None:
        if peer_id in self.sessions and self.sessions[peer_id].alive:
            try:
                on_fetch(peer_id, arrived)
            except Exception as exc:
                # The request fails: finishing it fails the round (transfer_done(false)
                # once its writes have landed) and any later round of it at once.
                rid = arrived.kv_request_id
                self._host_failed("on_fetch", peer_id, f"request {rid}", exc)
                session = self.sessions.get(peer_id)
                if session is not None and session.alive:
                    with contextlib.suppress(LocalProtocolError):  # finished already
                        self.finish(peer_id, rid)

    def _call_on_round_ended(self, on_round_ended: Callable[[str, RoundEnded], None],
                             peer_id: str, ended: RoundEnded) -> None:
        try:
            on_round_ended(peer_id, ended)
        except Exception as exc:  # logged and counted; nothing else depends on it
            self._host_failed("on_round_ended", peer_id,
                              f"round {ended.kv_request_id}/{ended.round_seq}", exc)

    def _on_load_result(self, peer_id: str, res: LoadResult) -> None:
        load = self._jobs.loads.get(res.job_id)
        if (load is not None and res.reason is FailReason.SESSION_ENDED
                and self._unsent_death is not None and self._driver.applying is self._unsent_death
                and self._redials.waiting(peer_id)):
            deadline = load.started + self.config.timeouts.load
            if deadline > time.monotonic():  # never sent: it waits for the next session
                self._redials.park(peer_id, deadline, load.event)
                return
        self._jobs.loads.pop(res.job_id, None)
        if not res.success:
            res = dataclasses.replace(res, detail=self._fail_detail(peer_id, res))
        if load is not None:
            self.metrics.observe("fetch_seconds", time.monotonic() - load.started)
            if res.success:
                self.metrics.count("fetches_succeeded")
                self.metrics.count("fetch_bytes", load.nbytes)
            else:
                self.metrics.count("fetches_failed")
                if res.reason is not None:
                    self.metrics.count(f"fetches_failed_{res.reason.value}")
                log.info("load job %d (%s) failed: %s; destination released: %s",
                         res.job_id, res.kv_request_id, res.detail, res.released)
        self._deliver(peer_id, None if load is None else load.future, res)

    def _fail_detail(self, peer_id: str, res: LoadResult | LookupResult) -> str:
        """The session's detail, naming the peer (and why its session ended)."""
        text = f"from {peer_id}: {res.detail or 'failed'}"
        session = self._driver.applying or self.sessions.get(peer_id)
        if (res.reason is FailReason.SESSION_ENDED and session is not None
                and session.death_reason):
            text += f" ({session.death_reason})"
        return text

    def _deliver(self, peer_id: str, fut: JobFuture[Any] | None,
                 value: LoadResult | StoreResult | LookupResult) -> None:
        """Hand a result to its future (and ``on_result``); count one nobody holds."""
        if fut is None:
            self.metrics.count("results_dropped")
            log.error("result with no job waiting for it (a bug): %r", value)
        elif not fut.done():
            fut.set_result(value)
        on_result = self.on_result
        if on_result is not None:
            self._driver.defer(lambda: self._call_on_result(on_result, peer_id, value))

    def _call_on_result(self, on_result: Callable[[str, Any], None], peer_id: str,
                        value: LoadResult | StoreResult | LookupResult) -> None:
        try:
            on_result(peer_id, value)
        except Exception as exc:  # the result is in its future already
            self._host_failed("on_result", peer_id, type(value).__name__, exc)

    def _on_ready(self, peer_id: str, session: Session) -> None:
        self.control.mark_ready(peer_id)  # out of the pending budget (or refused: full)
        started = self._started_at.pop(peer_id, None)
        if started is not None:
            self.metrics.observe("handshake_seconds", time.monotonic() - started)
        self.metrics.count("handshakes")
        self._redials.ready(peer_id)
        log.info("peer %s ready", peer_id)
        for fut in self._jobs.ready_waiters.pop(peer_id, ()):
            if not fut.done():
                fut.set_result(session)

    def _on_death(self, peer_id: str, dead: SessionDead) -> None:
        self.deaths[peer_id] = dead
        self.deaths.move_to_end(peer_id)
        while len(self.deaths) > self.config.history:
            self.deaths.popitem(last=False)
        self.metrics.count("deaths")
        never_ready = self._started_at.pop(peer_id, None) is not None
        if dead.mismatch is not None:
            self.metrics.count("handshakes_rejected")
            log.warning("peer %s rejected: handshake field %r differs (%s)", peer_id,
                        dead.mismatch.field, dead.mismatch)
        elif dead.reason == "closed":
            log.info("peer %s: session closed", peer_id)
        else:
            log.warning("peer %s down: %s", peer_id, dead.reason)
        error = TransportError(f"session to {peer_id} died: {dead.reason}")
        for fut in self._jobs.ready_waiters.pop(peer_id, ()):
            if not fut.done():
                fut.set_exception(error)
        if peer_id in self.data.peers:
            # A WRITE to the peer still running stays in flight until it ends (its
            # source may still be read); its WriteFinished then reaches the dead
            # session's draining round, which releases the pins only then.
            self.data.remove_peer(peer_id)
        if not self.control.closed:
            self.control.mark_done(peer_id)  # its connection gives up its slot
        self._ended.ended(peer_id)
        self._prune_ended()
        restart = dead.restarted_by
        if restart is not None:
            self.metrics.count("restarts" if dead.reason == "peer restarted" else "reconnects")
            old = self.sessions.get(peer_id)
            self._driver.defer(lambda: self._serve_restart(peer_id, old, restart))
        elif self._redials.may_redial(peer_id, dead, self._closed):
            wait = self._redials.schedule(peer_id, time.monotonic())
            log.info("peer %s: opening the session again in %.1f s", peer_id, wait)
            if never_ready:
                # Its fetches never left the queue: they wait for the next session.
                self._unsent_death = self._driver.applying

    def _redial_due(self, now: float) -> None:
        """Open the sessions whose redial is due; fail the calls that waited past their
        deadline for the others."""
        peers, expired = self._redials.due(now)
        for peer_id in peers:
            self._redial(peer_id)
        for peer_id, ev in expired:
            self._fail_parked(peer_id, ev, FailReason.SESSION_ENDED,
                              "no session to the peer within the deadline: it is being "
                              f"opened again ({self._death_reason(peer_id)})")

    def _redial(self, peer_id: str) -> None:
        if self._closed:
            return  # close() gave every parked call its result
        session = self.sessions.get(peer_id)
        if session is not None and session.alive:
            # A session opened meanwhile (_opened_by_peer has cancelled the redial then;
            # a guard): the calls that waited for one go to it.
            self._feed_parked(peer_id, session)
            return
        self.metrics.count("redials")
        self.connect(peer_id)  # feeds the calls parked for the peer

    def _opened_by_peer(self, peer_id: str) -> None:
        """The peer opened a session while ours waited to be opened again (it restarted
        and connected to us first): that session replaces the redial, at once. It is
        ours as the host dialled the peer (never evicted for idleness, opened again when
        it dies), and the calls that waited go to it now, not at the redial's time (up
        to the backoff's most later, or past their own deadline)."""
        self._redials.cancel(peer_id)
        self._idle.ours(peer_id)
        log.info("peer %s connected to us while its session waited to be opened again: "
                 "that session replaces the redial", peer_id)
        self._feed_parked(peer_id, self.sessions[peer_id])

    def _feed_parked(self, peer_id: str, session: Session) -> None:
        """The calls that waited for a session to the peer, to ``session`` (which
        queues them until it is ready)."""
        for ev in self._redials.take(peer_id):
            self._feed(peer_id, ev, session=session)

    def _end_parked(self) -> None:
        """The node closes: no session opens again, and the calls that waited for one
        fail as the jobs of a closed session do (SESSION_ENDED, saying why)."""
        for peer_id, ev in self._redials.end():
            self._fail_parked(peer_id, ev, FailReason.SESSION_ENDED,
                              "the node closed while it waited for the session to open "
                              "again")

    def _fail_parked(self, peer_id: str, ev: Parked, reason: FailReason,
                     why: str) -> None:
        if isinstance(ev, HostFetch):
            self._on_load_result(peer_id, LoadResult(
                ev.job_id, ev.kv_request_id, False, True, reason, why))
        else:
            self.lookup_result(peer_id, LookupResult(
                ev.kv_request_id, ev.keys, (False,) * len(ev.keys), False, reason, why))

    def _serve_restart(self, peer_id: str, old: Session | None, connect: Connect) -> None:
        """The connect that ended ``old`` (a new incarnation of the peer) opens a fresh
        session, once the old one has reported all its work and left the data plane."""
        if self._closed or self.control.closed or self.sessions.get(peer_id) is not old:
            return
        self._new_session(peer_id)
        self._idle.opened_by_peer(peer_id)
        self._idle.heard(peer_id, time.monotonic())
        self._queue(peer_id, FrameReceived(encode(connect)))

    def _prune_ended(self) -> None:
        """Drop ended sessions with nothing left to do beyond ``history`` of them."""
        for peer_id in self._ended.to_drop(self.sessions):
            del self.sessions[peer_id]
            self._bindings.forget(peer_id)

    def _on_violation(self, peer_id: str, violation: ProtocolViolation) -> None:
        self.violations.append((peer_id, violation))
        self.metrics.count("violations")
        count = self._violations.rejected(peer_id)
        session = self._driver.applying
        if self._violations.crossed(count) and session is not None:
            log.warning("peer %s: %d rejected frames (budget %d): closing the session",
                        peer_id, count, self._violations.budget)
            self.metrics.count("violation_closes")
            self._driver.defer(lambda: self._close_for_violations(peer_id, session))
        self._violations.log(peer_id, log, violation.error)

    def _host_failed(self, callback: str, peer_id: str, what: str, exc: Exception) -> None:
        """A host callback raised: counted and logged (with its traceback, rate-limited);
        the caller fails only what the callback was about, and the node serves on."""
        self.metrics.count("host_errors")
        self._host_error_log.emit(
            log.error, "host callback errors", "host callback %s raised on the %s from %s "
            "(%s: %s); it fails, the node serves on", callback, what, peer_id,
            type(exc).__name__, exc, exc_info=exc)

    def _evict_idle(self, now: float) -> None:
        """Close inbound sessions idle for ``idle_timeout_s`` (checked about once a second)."""
        for peer_id, idle_s in self._idle.idle(now, self.sessions):
            log.info("peer %s: idle for %.0f s, closing its session", peer_id, idle_s)
            self.metrics.count("idle_closes")
            self._queue(peer_id, HostClose(), self.sessions[peer_id])

    def _close_for_violations(self, peer_id: str, session: Session) -> None:
        if self.sessions.get(peer_id) is session and session.state not in _TERMINAL:
            self._feed(peer_id, HostClose(), session=session)

    def _holds_ended_session(self, peer_id: str) -> bool:
        """We keep a session of ``peer_id`` that is over: its peer's frames still reach
        it (a dead session answers a peer that holds it live, however long ago)."""
        session = self.sessions.get(peer_id)
        return session is not None and not session.alive

    def _death_reason(self, peer_id: str) -> str:
        dead = self.deaths.get(peer_id)
        return f"session to {peer_id} died: {dead.reason if dead else 'unknown'}"

    def _update_gauges(self) -> None:
        limited = self.control.rate_limited
        if limited != self._rate_limited:
            self.metrics.count("identities_rate_limited", limited - self._rate_limited)
            self._rate_limited = limited
        self.metrics.set_gauge("peers", len(self._live))
        self.metrics.set_gauge("open_loads", len(self._jobs.loads))
        self.metrics.set_gauge("open_stores", len(self._jobs.stores))

    def _answer(self, peer_id: str, session: Session, req: LookupRequest) -> None:
        """Ask ``on_lookup``, showing it our token for the lookup (unique in this node,
        unlike the session's, which restarts with each session) and the future of the
        pins it returns."""
        token = self._served.new_token()
        pins: JobFuture[StoreResult] = JobFuture(self)
        hits: dict[bytes, int] = {}
        pending: frozenset[bytes] = frozenset()
        self.metrics.count("lookups_served")
        if self.on_lookup is not None:
            ask = LookupAsk(token, req.kv_request_id, req.round_seq, req.keys, pins)
            self._served.asking = token
            try:
                answer_hits, answer_pending = self.on_lookup(peer_id, ask)
                hits = {k: _as_int(v) for k, v in answer_hits.items()}
                pending = frozenset(answer_pending)
                self._check_local_indexes("on_lookup", hits.values())
            except Exception as exc:  # answered all MISS: nothing was pinned for it
                self._host_failed("on_lookup", peer_id, f"lookup of {req.kv_request_id}", exc)
                hits, pending = {}, frozenset()
            finally:
                self._served.asking = None
        job = None
        if hits:
            job = self.new_job_id()
            self._jobs.stores[job] = pins
        else:
            pins.set_result(StoreResult(0, False, FailReason.NOT_SERVED, "nothing was pinned"))
        if pending - hits.keys():
            self._served.hold(token, ServedLookup(peer_id, session, req.token,
                                                  pending - hits.keys()))
        self._feed(peer_id, HostAnswerLookup(req.token, hits, job, pending), session=session)
