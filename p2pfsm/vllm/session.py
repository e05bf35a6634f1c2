"""``P2PSession`` for vLLM's P2P tier, decided by p2pfsm's sans-IO :class:`Session`.

The class keeps vLLM's constructor and the public surface its tier manager uses, in
the release installed: what differs between releases is that release's
:class:`~p2pfsm.vllm.releases.Release` (its constants, retained transfers) and its
behaviour profile, which the Session runs (when a failed load is reported and its
destination released, what a missing abort_ack or an overdue lookup answer does, the
deadlines, the stall). Each call becomes one :class:`~p2pfsm.session.Input`, fed through
the shared :class:`~p2pfsm.executor.runtime.driver.Driver`; each :class:`~p2pfsm.session.Output`
is carried out on vLLM's own ``ControlConnection`` (dict frames) and ``DataTransport``
(NIXL writes) by the :class:`~p2pfsm.executor.runtime.effects.Executor` methods below and those of
the session's parts (:mod:`.writes`: our WRITEs; :mod:`.serving`: the peer's lookups
answered from the manager; :mod:`.probes`: the manager's probe cache; :mod:`.load_ends`),
or collected for the next :meth:`P2PSession.poll`. Nothing here decides protocol
questions: rounds, deadlines, aborts and pins are the Session's. Importing this module
imports vLLM.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from types import MappingProxyType
from typing import Any

from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.tiering.p2p.session.client import LoadResult as VllmLoadResult
from vllm.v1.kv_offload.tiering.p2p.session.server import StoreResult as VllmStoreResult

from p2pfsm.errors import LocalProtocolError
from p2pfsm.executor.runtime.driver import Driver
from p2pfsm.executor.runtime.effects import Executor
from p2pfsm.protocol.validate import to_dict
from p2pfsm.session import (
    ABORT_ACK_TIMED_OUT,
    DestinationReleased,
    FailReason,
    FetchArrived,
    FrameReceived,
    HostClose,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    Input,
    LoadResult,
    LookupResult,
    ProtocolViolation,
    RegistrationFinished,
    SendFrame,
    Session,
    SessionConfig,
    SessionDead,
    StartRegistration,
    StoreResult,
    TimerFired,
    TransportLost,
)
from p2pfsm.vllm import guard
from p2pfsm.vllm.aborts import Aborts
from p2pfsm.vllm.load_ends import LoadEnds
from p2pfsm.vllm.probes import Probes
from p2pfsm.vllm.serving import Serving
from p2pfsm.vllm.surface import (
    RELEASE,
    Served,
    ServerRoleView,
    SessionCloseResult,
    SessionPollResult,
    fetch_of,
    indexes_of,
    is_disconnect,
    is_terminal,
    keys_of,
    pack,
    stall_timeout,
    timeouts_from_vllm,
    vllm_load,
)
from p2pfsm.vllm.withdrawn import Withdrawn
from p2pfsm.vllm.writes import Writes

log = logging.getLogger(__name__)

CLOSE_DRAIN_S = 10.0
"""close() waits at most this long for writes it cancelled to stop reading our blocks."""
CONN_LOST = "control connection lost"
"""vLLM's own wording for a connection its transport marked dead (the death reason)."""
PEER_DISCONNECTED = "peer disconnected"
"""The death reason of the peer's disconnect frame (vLLM's wording and the Session's)."""


class P2PSession(LoadEnds, Serving, Writes, Executor):
    """One peer's session, both roles, with the installed vLLM's constructor and surface
    (``RELEASE``: the methods and result fields of every supported release exist; their
    behaviour is the installed release's)."""

    def __init__(self, peer_id: str, local_id: str, transport: Any, local_block_len: int,
                 local_hash_seed: str, conn: Any = None) -> None:
        self.peer_id = peer_id
        self._local_id = local_id
        self._transport = transport
        self._conn: Any = None
        self._agent_metadata = bytes(transport.get_agent_metadata())
        self._session = Session(SessionConfig(
            local_id=local_id,
            agent_metadata=self._agent_metadata,
            base_addr=int(transport.base_addr),
            num_blocks=int(transport.num_blocks),
            block_len=int(local_block_len),
            hash_seed=local_hash_seed,
            config_fingerprint=str(transport.config_fingerprint),
            timeouts=timeouts_from_vllm(),
            profile=RELEASE.profile,  # when a failed load is reported, a missing ack's end
            expected_peer_id=peer_id,  # the connect must name the peer the transport sees
            limits=guard.limits(),  # num_blocks bounded before vLLM's data plane registers
        ))
        self._registration: Future[None] | None = None
        self._writes: dict[int, int] = {}  # session xfer -> transport transfer id
        self._by_tid: dict[int, int] = {}  # transport transfer id -> session xfer
        self._server = ServerRoleView(self._by_tid)
        # Queues the Session's inputs and carries out its outputs through the methods below.
        self._driver = Driver(self, time.monotonic)
        self._loads: list[VllmLoadResult] = []
        self._lost: list[VllmLoadResult] = []  # loads of an ended session, for close()
        self._peer_ended = True  # False once the session itself ended the connection
        self._stores: list[VllmStoreResult] = []
        self._fetch_ids: list[str] = []
        self._load_reqs: dict[int, str] = {}  # open load job -> kv_request_id
        self._probes = Probes()  # vLLM's probe cache: register_lookup's answers
        self._served: dict[int, Served] = {}
        self._finished_ctxs: list[ReqContext] = []
        self._held: list[Input] = []  # host calls made before a connection is attached
        self._death_reason: str | None = None
        self._fault: str | None = None
        self._last_activity_at = time.monotonic()
        self._release = RELEASE
        self._stall_s = stall_timeout()
        self._stalled = False
        self._finished_jobs: set[int] = set()  # load jobs whose request the host finished
        self._aborts = Aborts()  # loads reported failed at abort send, not yet released
        self._write_at: dict[int, float] = {}  # session xfer -> when it was posted
        self._terminal: set[str] = set()
        self._withdrawn = Withdrawn()  # store jobs a cache reset failed early
        if conn is not None:
            self.attach_connection(conn)

    # ------------------------------------------------------------------ properties
    @property
    def alive(self) -> bool:
        if self._conn is None:
            return True
        return bool(self._conn.alive) and self._session.alive

    @property
    def connected(self) -> bool:
        return self._conn is not None

    @property
    def ready(self) -> bool:
        return self._session.ready

    @property
    def has_pending_work(self) -> bool:
        """As vLLM's: a registration running, a load not yet released (reported or not),
        or a write in flight. Open lookups and pinned supply are not pending work."""
        return (self._registration is not None or bool(self._writes)
                or bool(self._load_reqs) or self._aborts.waiting)

    @property
    def death_reason(self) -> str:
        return self._death_reason or self._session.death_reason or CONN_LOST

    @property
    def data_plane_fault(self) -> str | None:
        return self._fault

    @property
    def last_activity_at(self) -> float:
        return self._last_activity_at

    # ------------------------------------------------------------------ host calls
    def attach_connection(self, conn: Any) -> None:
        """Attach the control connection and open the handshake."""
        if self._conn is not None:
            raise ValueError(f"P2PSession {self.peer_id}: already connected")
        self._conn = conn
        self._last_activity_at = time.monotonic()
        self._feed(HostStart())
        held, self._held = self._held, []
        for event in held:
            self._host(event)

    def request_blocks(self, job_id: int, kv_request_id: str, keys: Sequence[bytes],
                       block_ids: Sequence[int]) -> None:
        """Load ``keys`` into our blocks ``block_ids`` (one LoadResult in a later poll)."""
        self._probes.drop(kv_request_id)  # a fetch ends the request's probing
        self._load_reqs[job_id] = kv_request_id
        self._host(HostFetch(job_id, kv_request_id, keys_of(keys), indexes_of(block_ids)))

    def add_stored_blocks(self, kv_request_id: str, keys: Sequence[bytes],
                          block_ids: Sequence[int], job_id: int) -> None:
        """Offer stored blocks to the peer (one StoreResult in a later poll)."""
        self._host(HostSupply(job_id, kv_request_id, keys_of(keys), indexes_of(block_ids)))

    def finish_request(self, kv_request_id: str) -> None:
        """The request is over here, in both roles (no-op for an unknown id)."""
        self._probes.drop(kv_request_id)
        self._finished_jobs.update(j for j, kv in self._load_reqs.items() if kv == kv_request_id)
        self._aborts.finish(kv_request_id)
        if self._release.early_load_failure:  # results not yet given say so too
            self._loads, self._lost = ([r._replace(request_finished=True)
                                        if r.kv_request_id == kv_request_id else r
                                        for r in results] for results in (self._loads, self._lost))
        self._host(HostFinish(kv_request_id))

    def register_lookup(self, kv_request_id: str, key: bytes) -> bool | None:
        """The peer's answer for ``key`` once known; None (and the key queued) before."""
        return self._probes.register(kv_request_id, bytes(key))

    def flush_pending_lookups(self) -> None:
        """Send one lookup per request for the keys registered since the last flush; as
        vLLM's, none before the handshake completes (they wait for a later flush, and so
        does their answer's deadline)."""
        if not self.ready:
            return
        for kv_request_id, batch in self._probes.take_unsent():
            self._host(HostLookup(kv_request_id, batch))

    def poll(self) -> SessionPollResult:
        """Frames in, registration, finished writes, due timers; then this poll's results."""
        conn = self._conn
        if conn is not None:
            messages = conn.recv()
            if messages:
                self._last_activity_at = time.monotonic()
            self._dispatch(conn, messages)
            if messages:
                self._probes.take_parts(self._lookup_parts)
            self._poll_registration()
            self._poll_writes()
            now = time.monotonic()
            for timer in self._session.due_timers(now):
                self._feed(TimerFired(timer))
            self._note_conn_lost()
        loads, self._loads = self._loads, []
        stores, self._stores = self._stores, []
        fetch_ids, self._fetch_ids = self._fetch_ids, []
        terminal, self._terminal = frozenset(self._terminal), set()
        return SessionPollResult(loads, stores, fetch_ids, terminal)

    def _lookup_parts(self, kv_request_id: str) -> list[Mapping[bytes, bool]]:
        """What the peer answered so far of each open lookup of the request."""
        return [lk.answers for lk in self._session.client.lookups.get(kv_request_id, ())]

    def _note_conn_lost(self) -> None:
        """The transport marked the connection dead: the Session learns it now."""
        if self._conn is not None and not self._conn.alive and self._session.alive:
            self._death_reason = self._death_reason or CONN_LOST
            self._feed(TransportLost(CONN_LOST))

    def _dispatch(self, conn: Any, messages: list[Any]) -> None:
        """One recv's frames, in order, while the connection lives; the peer's disconnect
        frame takes effect after the batch. Once the connection is over (the peer's
        disconnect, the transport's loss), only the transfer_done and abort_ack frames
        still settle their loads, where the release takes them (its profile's
        ``buffered_terminals``) and the session did not end the connection itself (a
        frame it rejected); every other frame is dropped, as vLLM's session drops it."""
        held = None
        for msg in messages:
            if held is None and conn.alive and self._session.alive:
                if is_disconnect(msg):
                    held = msg  # the session ends after the batch, with this reason
                    self._death_reason = self._death_reason or PEER_DISCONNECTED
                    continue
                self._note_fetch(msg)
                self._feed(FrameReceived(pack(msg)))
            elif (self._release.buffered_terminals and self._peer_ended
                  and self._session.alive and is_terminal(msg)):
                self._feed(FrameReceived(pack(msg)))
        if held is not None:
            self._feed(FrameReceived(pack(held)))

    def _note_fetch(self, msg: object) -> None:
        """A terminal fetch (the Session answers it without the host) is among the
        poll's new fetch ids and its terminal ones; a later full fetch of the id is not."""
        fetch = fetch_of(msg)
        if fetch is not None and fetch[1]:
            self._terminal.add(fetch[0])
            self._fetch_ids.append(fetch[0])
        elif fetch is not None:
            self._terminal.discard(fetch[0])

    def close(self) -> SessionCloseResult:
        """End the session: every open job's result, and what the manager must release.

        As vLLM's: a request with a load in flight or a probe not yet answered is listed
        in ``failed_req_ids`` (the manager falls back to local compute for it), and the
        work of a session that never connected fails, its store pins included."""
        unanswered = self._probes.unanswered()
        unanswered += self._aborts.unfinished_requests()  # as vLLM's: it still holds them
        held, self._held = self._held, []
        for event in held:  # calls made on a session that never connected
            if isinstance(event, HostFetch):
                self.load_result(self.peer_id, LoadResult(event.job_id, event.kv_request_id,
                                                          False, True))
            elif isinstance(event, HostSupply):
                self._stores.append(VllmStoreResult(event.job_id, False))
        if self._registration is not None:
            self._registration.cancel()
            self._registration = None
        retained: dict[int, frozenset[int]] = {}
        if self._conn is not None:
            reads = self._write_jobs()
            self._feed(HostClose())
            if self._release.retains_transfers:  # the manager holds them, pins and all
                retained = {tid: reads.get(xfer, frozenset())
                            for xfer, tid in self._writes.items()}
                self._writes.clear()
                self._by_tid.clear()
                self._write_at.clear()
            end = time.monotonic() + CLOSE_DRAIN_S
            while self._writes and time.monotonic() < end:
                self._poll_writes()  # a pin is released only once its writes stopped
                time.sleep(0.001)
            for xfer in list(self._writes):
                log.warning("P2PSession %s: write %d still running at close", self.peer_id,
                            xfer)
                self._finish_write(xfer, False)
        if self._release.close_releases_destinations:
            for job in self._aborts.release_all():  # vLLM's rule; see _release_notice
                log.debug("P2PSession %s: load %d released at close", self.peer_id, job)
        # Results not yet polled are given here, as failures: the manager reads no poll
        # after close(), and a failure is always safe for it (fall back, release pins).
        loads, self._loads, self._lost = self._loads + self._lost, [], []
        stores, self._stores = self._stores, []
        failed_jobs = [r.job_id for r in loads]
        # A request the host finished is not failed again (a release whose results say so).
        open_reqs = [r.kv_request_id for r in loads if not getattr(r, "request_finished", False)]
        failed_reqs = list(dict.fromkeys(open_reqs + unanswered))
        failed_stores = [r.job_id for r in stores]
        serves = self._close_serves()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        return SessionCloseResult(failed_jobs, failed_reqs, failed_stores, serves,
                                  MappingProxyType(retained))

    def _release_notice(self, job_id: int) -> None:
        """The destination of load ``job_id``, reported failed at its abort's sending, is
        free now (the Session's DestinationReleased: its abort_ack, a racing transfer_done,
        or a proof the peer can no longer write). Close is the release's other release
        point (vLLM 0.34.0's rule): there every event still waiting is set."""
        self._aborts.release(job_id)

    # ------------------------------------------------------------------ plumbing
    def _host(self, event: Input) -> None:
        """A host call; one the Session refuses ends its job at once, as a failure."""
        if self._conn is None:
            self._held.append(event)
            return
        if isinstance(event, HostFetch):
            self._note_conn_lost()  # as vLLM's, no fetch goes out on a dead connection
        try:
            self._feed(event)
        except LocalProtocolError as exc:
            log.warning("P2PSession %s: %s refused: %s", self.peer_id, type(event).__name__,
                        exc)
            if isinstance(event, HostFetch):
                self.load_result(self.peer_id, LoadResult(event.job_id, event.kv_request_id,
                                                          False, True))
            elif isinstance(event, HostSupply):
                self._stores.append(VllmStoreResult(event.job_id, False))

    def _feed(self, event: Input) -> None:
        """Handle ``event`` and everything its outputs cause, in order (one called while
        outputs are carried out is queued: the drain further up handles it)."""
        driver = self._driver
        if driver.draining:
            driver.queue(self.peer_id, event, self._session)
            return
        driver.post(self.peer_id, event, self._session)

    def _queue(self, event: Input) -> None:
        """An input an output caused: handled after the current one's outputs."""
        self._driver.queue(self.peer_id, event, self._session)

    def _poll_registration(self) -> None:
        fut = self._registration
        if fut is None or not fut.done():
            return
        self._registration = None
        try:
            fut.result()
        except Exception as exc:
            self._registration_failed(exc)
            self._feed(RegistrationFinished(False, str(exc)))
            return
        self._feed(RegistrationFinished(True))

    def _registration_failed(self, exc: Exception) -> None:
        """Where the release does so, a failed registration is the session's data-plane
        fault (the manager counts it and backs off before it reconnects)."""
        if self._release.registration_fault and self._fault is None:
            self._fault = f"peer registration failed: {exc}"

    # ------------------------------------------------------- Executor: the outputs
    def send_frame(self, peer: str, out: SendFrame) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            conn.send(to_dict(out.message))
            self._last_activity_at = time.monotonic()
        except Exception as exc:
            self._queue(TransportLost(f"send failed: {exc}"))

    def start_registration(self, peer: str, out: StartRegistration) -> None:
        c = out.connect  # which metadata is acceptable is the transport's decision
        try:
            self._registration = self._transport.add_remote_peer_async(
                self.peer_id, agent_metadata=c.agent_metadata, base_addr=c.base_addr,
                num_blocks=c.num_blocks, block_len=c.block_len)
        except Exception as exc:
            self._registration_failed(exc)
            self._queue(RegistrationFinished(False, str(exc)))
            return
        self._poll_registration()  # transports that register inline have finished

    def load_result(self, peer: str, out: LoadResult) -> None:
        kv_request_id = self._load_reqs.pop(out.job_id, None)
        if kv_request_id is None:
            return
        if out.reason is FailReason.TIMEOUT:
            log.warning("P2PSession %s: load %d: %s", self.peer_id, out.job_id, out.detail)
        release = None
        if not out.released and out.reason is not FailReason.SESSION_ENDED:
            # The profile reports an aborted load at its abort's sending: the manager keeps
            # the blocks until this event is set (destination_released, or close).
            release = self._aborts.defer(out.job_id, kv_request_id,
                                         out.job_id in self._finished_jobs)
        result = self._vllm_load(out.job_id, kv_request_id, out.success, release)
        if (out.reason is FailReason.SESSION_ENDED and not out.released
                and self._release.lost_loads_at_close):
            self._lost.append(result)  # sent, then the session ended: vLLM's close() has it
        else:
            self._loads.append(result)
        self._finished_jobs.discard(out.job_id)

    def destination_released(self, peer: str, out: DestinationReleased) -> None:
        self._release_notice(out.job_id)

    def _vllm_load(self, job_id: int, kv_request_id: str, success: bool,
                   release: threading.Event | None = None) -> VllmLoadResult:
        return vllm_load(job_id, kv_request_id, success, release,
                         job_id in self._finished_jobs)

    def store_result(self, peer: str, out: StoreResult) -> None:
        if self._withdrawn.settled(out.job_id):
            return  # failed already, by the cache reset that withdrew it
        self._stores.append(VllmStoreResult(out.job_id, out.success))

    def lookup_result(self, peer: str, out: LookupResult) -> None:
        self._probes.answer(out)

    def fetch_arrived(self, peer: str, out: FetchArrived) -> None:
        self._fetch_ids.append(out.kv_request_id)

    def protocol_violation(self, peer: str, out: ProtocolViolation) -> None:
        # vLLM ends a session on its first malformed frame: so does the adapter.
        if self._death_reason is None:
            self._death_reason = f"protocol error: {out.error}"
        self._peer_ended = False  # no frame after a rejected one settles anything
        self._queue(HostClose())

    def session_dead(self, peer: str, out: SessionDead) -> None:
        if self._death_reason is None:
            self._death_reason = out.reason
        if out.reason != PEER_DISCONNECTED:
            self._peer_ended = False
        if out.reason == ABORT_ACK_TIMED_OUT and self._fault is None:
            self._fault = ABORT_ACK_TIMED_OUT  # as vLLM 0.34.0: a data-plane fault (back-off)
        if self._conn is not None:
            self._conn.mark_dead()
