"""A node: sessions bound to a real ZeroMQ control plane and a real NIXL data plane.

Theory of operation. A :class:`Node` owns one :class:`ControlPlane` (bound ROUTER,
one DEALER per peer), one :class:`DataPlane` (the registered block region) and one
sans-IO :class:`~p2pfsm.session.Session` per peer. Everything runs on the thread
that calls :meth:`Node.run_until` / :meth:`Node.serve`: the loop waits on ZeroMQ
(never longer than the next timer deadline or the data plane's progress interval),
feeds what happened to the sessions as input events and carries out their outputs.
There is no fixed-interval sleep and no NIXL progress thread.

Host API: :meth:`connect`, :meth:`fetch` (a future of LoadResult), :meth:`lookup`
(a future of LookupResult), :meth:`supply` (a future of StoreResult), :meth:`finish`,
:meth:`close`. Lookups from peers are answered by the ``on_lookup`` callback, which may
leave keys pending and settle them later with :meth:`resolve_lookup`; the ``on_fetch``
callback hears of fetches (to supply blocks for them).

Trace log (off by default): with ``NodeConfig.trace`` set, every ``Session.handle`` call
that is a step of the TLA+ spec is written to that file as one JSON line, named by
:func:`p2pfsm.spec_calls.call_action` (the mapping trace validation uses for simulated
runs); :func:`p2pfsm.verify.traces.merge_logs` merges two nodes' logs into one trace.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import json
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import IO, Any

from p2pfsm.errors import ConfigError, LocalProtocolError, RemoteProtocolError, TransportError
from p2pfsm.executor.nixl_plane import DataPlane
from p2pfsm.executor.zmq_plane import ControlPlane, FrameIn, PeerLost
from p2pfsm.fsm import Tracer
from p2pfsm.protocol import Connect, decode, encode
from p2pfsm.session import (
    DEFAULT_HASH_SEED,
    ArmTimer,
    CancelWrite,
    DisarmTimer,
    FetchArrived,
    FrameReceived,
    HostAnswerLookup,
    HostClose,
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
from p2pfsm.spec_calls import call_action, steps_of

_INBOUND_GRACE_S = 0.05
"""How long the data plane stays at its busy progress interval after a load ends."""

LookupAnswer = tuple[Mapping[bytes, int], frozenset[bytes]]
"""What ``on_lookup`` returns: hit key -> local block index, and still-pending keys."""


@dataclass(eq=False)
class _ServedLookup:
    """A peer's lookup with keys the host left pending (see :meth:`Node.resolve_lookup`)."""

    peer_id: str
    session: Session
    session_token: int
    pending: frozenset[bytes]


def _is_connect(frame: bytes) -> bool:
    try:
        return isinstance(decode(frame), Connect)
    except RemoteProtocolError:
        return False


def fingerprint(model_config: Mapping[str, Any] | None) -> str:
    """vLLM's config fingerprint: sha256 of sorted-key compact JSON, first 16 hex chars."""
    if not model_config:
        return ""
    text = json.dumps(model_config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class NodeConfig:
    """Everything a node needs; see ``docs/api.md``.

    Args:
        bind: ``tcp://HOST:PORT`` of our ROUTER (port 0: any free port).
        num_blocks, block_len: our block region (``num_blocks * block_len`` bytes).
        hash_seed: prefix-cache hash seed; peers must match (vLLM's default).
        model_config: dict whose fingerprint peers must match (or pass ``fingerprint``).
        fingerprint: an explicit fingerprint string (overrides ``model_config``).
        timeouts: session deadlines.
        device: ``"cpu"`` or ``"cuda[:N]"`` for the region.
        heartbeat_ivl_ms, heartbeat_timeout_ms: ZMTP liveness of each peer connection.
        connect_timeout_ms: how long a peer connection may take to come up (TCP and ZMTP
            handshake) before its session dies with "transport lost: connect timeout".
            A refused connect does not wait: "transport lost: connection refused".
        trace: path of a trace log to write (None: no log); see :class:`CallLog`.
    """

    bind: str
    num_blocks: int
    block_len: int
    hash_seed: str = DEFAULT_HASH_SEED
    model_config: Mapping[str, Any] | None = None
    fingerprint: str | None = None
    timeouts: Timeouts = field(default_factory=Timeouts)
    device: str = "cpu"
    heartbeat_ivl_ms: int = 2000
    heartbeat_timeout_ms: int = 10_000
    connect_timeout_ms: int = 10_000
    trace: str | None = None

    def __post_init__(self) -> None:
        value = self.connect_timeout_ms
        if type(value) is not int or value <= 0:
            raise ConfigError(f"connect_timeout_ms: expected a positive int, got {value!r}")

    @property
    def config_fingerprint(self) -> str:
        return self.fingerprint if self.fingerprint is not None else fingerprint(self.model_config)


class CallLog:
    """A trace log: one JSON line per ``Session.handle`` call that is a spec action.

    Each line is ``{"t", "node", "peer", "action", "steps"}``: ``time.monotonic_ns()``
    when the call started, our id, the session's peer, the action
    (:func:`~p2pfsm.spec_calls.call_action`) and the (machine, trigger, source, dest)
    steps the call fired. Calls the spec takes no step for are left out (a stale timer,
    a registration result or transport loss after the session ended, a close of a
    closed session, an answer to an ended lookup: each fires no machine). The file is
    line-buffered, so a killed node leaves every finished line.
    """

    def __init__(self, path: str, local_id: str) -> None:
        self.tracer = Tracer()
        self.local_id = local_id
        self._file: IO[str] = open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115

    def handle(self, peer_id: str, session: Session, event: Input) -> list[Output]:
        """``session.handle(event)``, logged."""
        t = time.monotonic_ns()
        state = session.state
        try:
            outputs = session.handle(event, time.monotonic())
            records = list(self.tracer.records)
        finally:
            self.tracer.records.clear()
        action = call_action(state, event, records)
        if action is not None:
            self._file.write(json.dumps({"t": t, "node": self.local_id, "peer": peer_id,
                                         "action": action,
                                         "steps": sorted(steps_of(records))}) + "\n")
        return outputs

    def close(self) -> None:
        self._file.close()


class Node:
    """One process's endpoint: bind, connect to peers, move blocks. Not thread-safe."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        on_lookup: Callable[[str, LookupRequest], LookupAnswer] | None = None,
        on_fetch: Callable[[str, FetchArrived], None] | None = None,
    ) -> None:
        self.config = config
        self.on_lookup = on_lookup
        self.on_fetch = on_fetch
        self.control = ControlPlane(config.bind, heartbeat_ivl_ms=config.heartbeat_ivl_ms,
                                    heartbeat_timeout_ms=config.heartbeat_timeout_ms,
                                    heartbeat_ttl_ms=config.heartbeat_timeout_ms,
                                    connect_timeout_ms=config.connect_timeout_ms)
        try:
            self.data = DataPlane(f"p2pfsm-{uuid.uuid4()}", config.num_blocks, config.block_len,
                                  config.device)
        except BaseException:
            self.control.close()
            raise
        self.local_id = self.control.local_id
        self.sessions: dict[str, Session] = {}
        self.deaths: dict[str, SessionDead] = {}
        self.violations: list[tuple[str, ProtocolViolation]] = []
        self._events: deque[tuple[str, Input]] = deque()
        self._timers: dict[tuple[str, TimerId], float] = {}
        self._heap: list[tuple[float, str, TimerId]] = []
        self._xfers: dict[int, tuple[str, int]] = {}
        self._by_session_xfer: dict[tuple[str, int], int] = {}
        self._loads: dict[int, Future[LoadResult]] = {}
        self._stores: dict[int, Future[StoreResult]] = {}
        self._lookups: dict[tuple[str, str], deque[Future[LookupResult]]] = {}
        self._lookup_serial = 0  # the last token handed to on_lookup
        self._asking: int | None = None  # the token on_lookup is being asked about
        self._served: dict[int, _ServedLookup] = {}  # our token -> lookup with pending keys
        self._served_tokens: dict[tuple[str, int], int] = {}  # (peer, session token) -> ours
        self._job = 0
        self._closed = False
        self._log: CallLog | None = None
        if config.trace is not None:
            try:
                self._log = CallLog(config.trace, self.local_id)
            except OSError as exc:
                self.data.close()
                self.control.close()
                raise ConfigError(f"cannot write the trace log {config.trace}: {exc}") from exc

    # ------------------------------------------------------------- host API
    @property
    def region(self) -> Any:
        """Our block region (a torch uint8 tensor, one row per block)."""
        return self.data.region

    def new_job_id(self) -> int:
        self._job += 1
        return self._job

    def connect(self, peer_id: str) -> Session:
        """Open (or return) the session to ``peer_id`` ("host:port")."""
        self._check_open()
        session = self.sessions.get(peer_id)
        if session is not None and session.alive:
            return session
        self.control.connect(peer_id)
        return self._new_session(peer_id)

    def session(self, peer_id: str) -> Session:
        try:
            return self.sessions[peer_id]
        except KeyError:
            raise LocalProtocolError(f"no session to {peer_id}; connect first") from None

    def fetch(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
              dest_indexes: Iterable[int]) -> Future[LoadResult]:
        """Load ``keys`` from the peer into our blocks ``dest_indexes``; one result."""
        job = self.new_job_id()
        fut: Future[LoadResult] = Future()
        self._loads[job] = fut
        try:
            self._host(peer_id, HostFetch(job, kv_request_id, tuple(keys), tuple(dest_indexes)))
        except BaseException:
            del self._loads[job]
            raise
        self.data.expect_inbound(_INBOUND_GRACE_S)
        return fut

    def lookup(self, peer_id: str, kv_request_id: str,
               keys: Iterable[bytes]) -> Future[LookupResult]:
        """Ask the peer which keys it holds; one result."""
        fut: Future[LookupResult] = Future()
        queue = self._lookups.setdefault((peer_id, kv_request_id), deque())
        queue.append(fut)
        try:
            self._host(peer_id, HostLookup(kv_request_id, tuple(keys)))
        except BaseException:
            queue.pop()
            raise
        return fut

    def supply(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
               local_indexes: Iterable[int]) -> Future[StoreResult]:
        """Offer stored blocks to the peer; they stay pinned until the result."""
        job = self.new_job_id()
        fut: Future[StoreResult] = Future()
        self._stores[job] = fut
        try:
            self._host(peer_id, HostSupply(job, kv_request_id, tuple(keys),
                                           tuple(local_indexes)))
        except BaseException:
            del self._stores[job]
            raise
        return fut

    def finish(self, peer_id: str, kv_request_id: str) -> None:
        """The host is done with the request (both roles)."""
        self._host(peer_id, HostFinish(kv_request_id))

    def resolve_lookup(self, peer_id: str, token: int, hits: Mapping[bytes, int] | None = None,
                       pending: Iterable[bytes] = ()) -> Future[StoreResult] | None:
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
        hits = dict(hits or {})
        still = frozenset(pending)
        if type(token) is not int or not 0 < token <= self._lookup_serial:
            raise LocalProtocolError(f"resolve_lookup: no lookup {token!r} was asked")
        if token == self._asking:
            raise LocalProtocolError(
                f"resolve_lookup: lookup {token} is being asked; answer it from on_lookup")
        served = self._served.get(token)
        if served is not None and served.peer_id != peer_id:
            raise LocalProtocolError(f"resolve_lookup: lookup {token} is not from {peer_id}")
        outside = [i for i in hits.values()
                   if type(i) is not int or not 0 <= i < self.config.num_blocks]
        if outside:
            raise LocalProtocolError(f"resolve_lookup: index {outside[0]!r} outside our region")
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
            fut: Future[StoreResult] = Future()
            fut.set_result(StoreResult(self.new_job_id(), False))
            return fut
        job = self.new_job_id() if hits else None
        fut = Future()
        if job is not None:
            self._stores[job] = fut
        try:
            self._feed(peer_id, HostAnswerLookup(served.session_token, hits, job, still),
                       session=served.session)
        except BaseException:
            if job is not None:
                del self._stores[job]
            raise
        served.pending = still
        if not still:
            self._forget_served(token)
        self._drain()
        return fut if job is not None else None

    def run_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Run the loop until ``done()`` or ``timeout`` seconds; returns ``done()``."""
        end = time.monotonic() + timeout
        while not done():
            left = end - time.monotonic()
            if left <= 0:
                return done()
            self.step(left)
        return True

    def serve(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Run the loop until ``stop()`` is true."""
        while not stop():
            self.step(1.0)

    def step(self, max_wait: float) -> None:
        """One loop turn: wait for news (bounded), then handle it all."""
        self._check_open()
        self._handle_all()
        if self._loads:
            # Blocks may be arriving (a peer's first WRITE needs our UCX progress):
            # progress often while loads are open, and only then.
            self.data.expect_inbound(_INBOUND_GRACE_S)
        wait = min(max_wait, self.data.progress_interval_ms / 1000.0)
        if self._heap:
            wait = min(wait, max(0.0, self._heap[0][0] - time.monotonic()))
        for event in self.control.poll(max(0, int(wait * 1000))):
            if isinstance(event, FrameIn):
                self._on_frame(event.peer_id, event.frame)
            elif isinstance(event, PeerLost):
                self._events.append((event.peer_id, TransportLost(event.reason)))
        self.data.progress()
        self._collect_writes()
        now = time.monotonic()
        while self._heap and self._heap[0][0] <= now:
            deadline, peer, timer = heapq.heappop(self._heap)
            if self._timers.get((peer, timer)) == deadline:
                del self._timers[(peer, timer)]
                self._events.append((peer, TimerFired(timer)))
        self._handle_all()

    def close(self, timeout: float = 5.0) -> None:
        """Close every session, give writes ``timeout`` to drain, release the transports."""
        if self._closed:
            return
        for peer in list(self.sessions):
            if self.sessions[peer].state != "closed":
                self._events.append((peer, HostClose()))
        self._drain()
        self.run_until(lambda: not self._xfers, timeout)
        for peer_id, session_xfer in list(self._xfers.values()):
            self._feed(peer_id, WriteFinished(session_xfer, False))
        pending: list[Future[Any]] = [*self._loads.values(), *self._stores.values()]
        for fut in pending:
            if not fut.done():
                fut.set_exception(TransportError("node closed"))
        self._closed = True
        self.data.close()
        self.control.close()
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise LocalProtocolError("the node is closed")

    def _host(self, peer_id: str, event: Input) -> None:
        self._check_open()
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
        ), None if self._log is None else self._log.tracer)
        self.sessions[peer_id] = session
        self.deaths.pop(peer_id, None)
        self._feed(peer_id, HostStart(), session=session)
        return session

    def _on_frame(self, peer_id: str, frame: bytes) -> None:
        session = self.sessions.get(peer_id)
        if session is None or (not session.alive and not session.has_pending_work):
            # A new peer (or a restarted one) opens with its connect. Anything else is a
            # straggler of a session that is over (e.g. the disconnect that follows a
            # mismatch): restarting on it would make two incompatible peers restart
            # each other's sessions forever, so it goes to the old session (ignored).
            if not _is_connect(frame):
                if session is not None:
                    self._events.append((peer_id, FrameReceived(frame)))
                return
            self._new_session(peer_id)
        self._events.append((peer_id, FrameReceived(frame)))

    def _handle_all(self) -> None:
        """Handle every queued event, and the writes that this finished at once: over
        CMA a WRITE usually completes inside ``transfer()``, and waiting for the next
        turn to notice would add a whole loop wait (up to the idle interval) to it."""
        self._drain()
        while self._xfers and self._collect_writes():
            self._drain()

    def _collect_writes(self) -> bool:
        """Queue WriteFinished for our finished writes; True when there were any."""
        found = False
        for nixl_id, ok in self.data.poll():
            owner = self._xfers.pop(nixl_id, None)
            if owner is not None:
                self._by_session_xfer.pop(owner, None)
                self._events.append((owner[0], WriteFinished(owner[1], ok)))
                found = True
        return found

    def _drain(self) -> None:
        while self._events:
            peer_id, event = self._events.popleft()
            session = self.sessions.get(peer_id)
            if session is not None:
                self._feed(peer_id, event, session=session)

    def _feed(self, peer_id: str, event: Input, *, session: Session | None = None) -> None:
        session = session or self.sessions[peer_id]
        if self._log is None:
            outputs = session.handle(event, time.monotonic())
        else:
            outputs = self._log.handle(peer_id, session, event)
        for out in outputs:
            self._apply(peer_id, session, out)

    def _apply(self, peer_id: str, session: Session, out: Output) -> None:
        if isinstance(out, SendFrame):
            if not self.control.send(peer_id, encode(out.message)):
                self._events.append((peer_id, TransportLost("send failed")))
        elif isinstance(out, StartWrite):
            try:
                nixl_id = self.data.write(peer_id, out.local_indexes, out.remote_indexes)
            except TransportError:
                self._events.append((peer_id, WriteFinished(out.xfer, False)))
                return
            self._xfers[nixl_id] = (peer_id, out.xfer)
            self._by_session_xfer[(peer_id, out.xfer)] = nixl_id
        elif isinstance(out, CancelWrite):
            cancel_id = self._by_session_xfer.get((peer_id, out.xfer))
            if cancel_id is not None and self.data.cancel(cancel_id):
                del self._by_session_xfer[(peer_id, out.xfer)]
                del self._xfers[cancel_id]
                self._events.append((peer_id, WriteFinished(out.xfer, False)))
        elif isinstance(out, ArmTimer):
            deadline = out.deadline  # sessions run on time.monotonic()
            self._timers[(peer_id, out.timer)] = deadline
            heapq.heappush(self._heap, (deadline, peer_id, out.timer))
        elif isinstance(out, DisarmTimer):
            self._timers.pop((peer_id, out.timer), None)
        elif isinstance(out, StartRegistration):
            c = out.connect
            try:
                self.data.add_peer(peer_id, c.agent_metadata, c.base_addr, c.num_blocks,
                                   c.block_len)
                result = RegistrationFinished(True)
            except (TransportError, ConfigError) as exc:
                result = RegistrationFinished(False, str(exc))
            self._events.append((peer_id, result))
        elif isinstance(out, LoadResult):
            self._settle(self._loads.pop(out.job_id, None), out)
        elif isinstance(out, StoreResult):
            self._settle(self._stores.pop(out.job_id, None), out)
        elif isinstance(out, LookupResult):
            queue = self._lookups.get((peer_id, out.kv_request_id))
            if queue:
                self._settle(queue.popleft(), out)
                if not queue:
                    del self._lookups[(peer_id, out.kv_request_id)]
        elif isinstance(out, LookupRequest):
            self._answer(peer_id, session, out)
        elif isinstance(out, LookupClosed):
            token = self._served_tokens.get((peer_id, out.token))
            if token is not None:
                self._forget_served(token)
        elif isinstance(out, FetchArrived):
            if self.on_fetch is not None:
                self.on_fetch(peer_id, out)
        elif isinstance(out, SessionDead):
            self.deaths[peer_id] = out
            if peer_id in self.data.peers:
                # Writes to the peer may still be in flight; they fail on removal.
                self.data.remove_peer(peer_id)
        elif isinstance(out, ProtocolViolation):
            self.violations.append((peer_id, out))

    def _answer(self, peer_id: str, session: Session, req: LookupRequest) -> None:
        """Ask ``on_lookup``, showing it our token for the lookup (unique in this node,
        unlike the session's, which restarts with each session)."""
        hits: Mapping[bytes, int] = {}
        pending: frozenset[bytes] = frozenset()
        self._lookup_serial += 1
        token = self._lookup_serial
        if self.on_lookup is not None:
            self._asking = token
            try:
                hits, pending = self.on_lookup(peer_id, dataclasses.replace(req, token=token))
            finally:
                self._asking = None
            pending = frozenset(pending)
        job = None
        if hits:
            job = self.new_job_id()
            self._stores[job] = Future()
        if pending - hits.keys():
            self._served[token] = _ServedLookup(peer_id, session, req.token,
                                                pending - hits.keys())
            self._served_tokens[(peer_id, req.token)] = token
        self._events.append((peer_id, HostAnswerLookup(req.token, dict(hits), job, pending)))

    def _forget_served(self, token: int) -> None:
        served = self._served.pop(token, None)
        if served is not None:
            self._served_tokens.pop((served.peer_id, served.session_token), None)

    @staticmethod
    def _settle(fut: Future[Any] | None, value: object) -> None:
        if fut is not None and not fut.done():
            fut.set_result(value)
