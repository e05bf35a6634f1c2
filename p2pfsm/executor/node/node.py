"""A node: sessions bound to a real ZeroMQ control plane and a real NIXL data plane.

Theory of operation. A :class:`Node` owns one :class:`ControlPlane` (bound ROUTER,
one DEALER per peer), one :class:`DataPlane` (the registered block region: the host's
own memory or one the node allocates) and one sans-IO :class:`~p2pfsm.session.Session`
per peer. Everything runs on the thread that drives it: :meth:`Node.run_until` /
:meth:`Node.serve`, or an event loop that waits on :meth:`Node.fileno` until
:meth:`Node.next_deadline` and calls ``step(0)`` (:mod:`p2pfsm.aio` does this for
asyncio). There is no fixed-interval sleep and no NIXL progress thread.

This module holds the host API and the wiring of the node's parts (modules of
:mod:`p2pfsm.executor.node`), each owning its fields: ``Peers`` (the peer/session table),
``NodeEffects`` (outputs carried out, results and callbacks handed to the host through the
driver it owns), ``Turns`` (the loop's turns), ``OpenJobs``, ``Writes``, ``DrivingThreads``.

Host API: :meth:`connect` (and :meth:`when_ready`), :meth:`fetch` (a
:class:`~p2pfsm.executor.node.jobs.JobFuture` of LoadResult), :meth:`lookup`, :meth:`supply`,
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
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from p2pfsm.errors import ConfigError, LocalProtocolError, TransportError
from p2pfsm.executor.node.config import NodeConfig
from p2pfsm.executor.node.effects import NodeEffects, OnEffects
from p2pfsm.executor.node.host_args import as_ints
from p2pfsm.executor.node.jobs import (
    Driven,
    JobFuture,
    LookupAnswer,
    LookupAsk,
    OpenJobs,
    OpenLoad,
)
from p2pfsm.executor.node.peers import Peers
from p2pfsm.executor.node.planes import open_planes, trace_hook
from p2pfsm.executor.node.threads import DrivingThreads
from p2pfsm.executor.node.threadsafe import ThreadSafeNode
from p2pfsm.executor.node.turns import INBOUND_GRACE_S, Turns
from p2pfsm.executor.node.writes import Writes
from p2pfsm.executor.zmq.peer_ids import peer_address
from p2pfsm.fsm import machine
from p2pfsm.metrics import NodeMetrics
from p2pfsm.session import (
    DestinationReleased,
    FetchArrived,
    HostDecline,
    HostFetch,
    HostFinish,
    HostLookup,
    HostSupply,
    Input,
    LoadResult,
    LookupResult,
    ProtocolViolation,
    RoundEnded,
    Session,
    SessionDead,
    StoreResult,
    WriteFinished,
)
from p2pfsm.spec_log import CallHook

__all__ = ["Node"]

log = logging.getLogger("p2pfsm.node")

_UNSTARTED = machine("session").state_set("unstarted")


_HOST_CALLS: dict[type, str] = {HostFetch: "fetch", HostLookup: "lookup", HostSupply: "supply",
                                HostFinish: "finish", HostDecline: "decline"}
"""The host call each host input comes from (for the wrong-thread error)."""

class Node(Driven):
    """One process's endpoint: bind, connect to peers, move blocks.

    One thread drives it (``serve``, ``run_until``, ``step``, or an asyncio loop through
    :class:`p2pfsm.aio.AsyncNode`) and makes its host calls; other threads submit theirs
    through :attr:`threadsafe`. A direct host call from another thread while one drives
    the node is refused with a :class:`LocalProtocolError` saying so.
    """

    # The host callbacks: set at construction or later; the node's effects call them.
    on_lookup: OnEffects[Callable[[str, LookupAsk], LookupAnswer] | None] = OnEffects()
    on_fetch: OnEffects[Callable[[str, FetchArrived], None] | None] = OnEffects()
    on_result: OnEffects[Callable[[str, LoadResult | StoreResult | LookupResult],
                                  None] | None] = OnEffects()
    on_round_ended: OnEffects[Callable[[str, RoundEnded], None] | None] = OnEffects()
    on_released: OnEffects[Callable[[str, DestinationReleased], None] | None] = OnEffects()
    on_peer_state: OnEffects[Callable[[str, str, str], None] | None] = OnEffects()

    _effects_part: type[NodeEffects] = NodeEffects
    """The class of the node's effects (a subclass may record what they carry out)."""

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
        self.metrics = NodeMetrics()
        self.control, self.data = open_planes(
            config, holds_session=lambda p: self._peers.holds_ended_session(p))
        self.local_id = self.control.local_id
        # Drawn per process and sent in every connect: a peer that sees a new one on a
        # live session knows we restarted (vLLM peers ignore the field).
        self.incarnation = secrets.randbits(63)
        try:
            self._writes = Writes(self.data, config.block_len)  # ours, by (session, xfer)
            self._jobs = OpenJobs()  # every job that still owes the host a result
            self._closed = False
            self._threads = DrivingThreads()
            self._threadsafe: ThreadSafeNode | None = None
            self._hook = trace_hook(config, self.local_id) if call_hook is None else call_hook
            self._effects = effects = self._effects_part(
                self, config, self.metrics, self.control, self.data, self._jobs, self._writes,
                self.finish, self._hook)
            effects.on_lookup, effects.on_fetch, effects.on_result = on_lookup, on_fetch, on_result
            effects.on_round_ended, effects.on_released = on_round_ended, on_released
            effects.on_peer_state = on_peer_state
            self._driver = effects.driver
            self._peers = effects.peers = Peers(
                config, self.local_id, self.incarnation, self.control, self.data, self.metrics,
                self._driver, self._jobs, self._hook, lambda: self._closed, effects.peer_state,
                effects.fail_parked)
            self._turns = Turns(self.control, self.data, effects, self._peers, self._jobs,
                                self._writes, self.metrics)
        except BaseException:
            self.data.close()
            self.control.close()
            raise
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

    @property
    def sessions(self) -> dict[str, Session]:
        """The session of each peer (a dead one stays until it has nothing left to do)."""
        return self._peers.sessions

    @property
    def deaths(self) -> OrderedDict[str, SessionDead]:
        """How each peer's last session ended (the last ``history`` peers)."""
        return self._peers.deaths

    @property
    def violations(self) -> deque[tuple[str, ProtocolViolation]]:
        """The last ``history`` frames our sessions rejected, with their peers."""
        return self._peers.violations

    def session(self, peer_id: str) -> Session:
        """The session to ``peer_id``; a :class:`LocalProtocolError` without one."""
        return self._peers.session(peer_id)

    def connect(self, peer_id: str) -> Session:
        """Open (or return) the session to ``peer_id`` ("host:port"; "tcp://host:port" is
        the same peer, as is every host call's ``peer_id``)."""
        peer_id = peer_address(peer_id)
        self._check_open()
        self._threads.check("connect")
        return self._peers.dial(peer_id)

    def disconnect(self, peer_id: str) -> None:
        """Close the session to ``peer_id`` and forget the peer: it is not opened again,
        and the calls that waited for it fail (SESSION_ENDED), as do the open jobs of
        the session it closes. ``connect`` opens it again. A peer with no session is
        only forgotten."""
        peer_id = peer_address(peer_id)
        self._check_open()
        self._threads.check("disconnect")
        self._peers.disconnect(peer_id)
        self._driver.drain()

    def redial_now(self, peer_id: str) -> bool:
        """Open the session to ``peer_id`` again at the next turn instead of after its
        backoff (the host knows the peer is back); False when no redial of it waits."""
        peer_id = peer_address(peer_id)
        self._check_open()
        self._threads.check("redial_now")
        return self._peers.redials.now(peer_id, time.monotonic())

    def release_held(self, peer_id: str, cause: str = "data_plane") -> int:
        """The host (its data plane) proves that ``peer_id`` can no longer write into our
        memory (its agent is gone and every transfer of it ended): each session of the
        peer that is over releases what it holds; a DestinationReleased follows for each.
        Returns how many destinations were released."""
        self._threads.check("release_held")
        return self._peers.release_held(peer_id, cause)

    def held_destinations(self) -> dict[str, int]:
        """Per peer, destinations whose failed load said ``released=False`` and whose
        DestinationReleased has not come yet."""
        return self._peers.held_destinations()

    def release_of(self, job_id: int) -> JobFuture[DestinationReleased]:
        """The release of load job ``job_id``'s destination, whose LoadResult said
        ``released=False``: the future resolves with its DestinationReleased (the cause
        says what proved the peer's writes over), exactly once. Ask for it once the
        result came (resolved ones are kept for ``history`` more).

        Raises:
            LocalProtocolError: no such result of this node held its destination.
        """
        return self._effects.release_of(job_id)

    def when_ready(self, peer_id: str) -> JobFuture[Session]:
        """A future of the session to ``peer_id`` once it is ready; a
        :class:`TransportError` naming the reason if it dies first."""
        peer_id = peer_address(peer_id)
        session = self.session(peer_id)
        fut: JobFuture[Session] = JobFuture(self)
        if session.ready:
            fut.set_result(session)
        elif not session.alive and session.state not in _UNSTARTED:
            fut.set_exception(TransportError(self._peers.death_reason(peer_id)))
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
        self._threads.check("fetch")  # before anything changes
        keys = tuple(keys)
        job = self._jobs.new_id()
        fut: JobFuture[LoadResult] = JobFuture(
            self, lambda: self._peers.cancel_fetch(peer_id, kv_request_id, self.finish))
        event = HostFetch(job, kv_request_id, keys, as_ints(dest_indexes))
        loads = self._jobs.loads
        loads[job] = OpenLoad(fut, time.monotonic(), len(keys) * self.config.block_len, event)
        try:
            self._host(peer_id, event, checked=True)
        except BaseException:
            del loads[job]
            raise
        self.metrics.count("fetches_started")
        self.data.expect_inbound(INBOUND_GRACE_S, prompt=True)
        return fut

    def lookup(self, peer_id: str, kv_request_id: str,
               keys: Iterable[bytes]) -> JobFuture[LookupResult]:
        """Ask the peer which keys it holds; one result."""
        peer_id = peer_address(peer_id)
        self._threads.check("lookup")
        fut: JobFuture[LookupResult] = JobFuture(self)
        self._jobs.add_lookup(peer_id, kv_request_id, fut)
        try:
            self._host(peer_id, HostLookup(kv_request_id, tuple(keys)), checked=True)
        except BaseException:
            self._jobs.drop_last_lookup(peer_id, kv_request_id)
            raise
        self.metrics.count("lookups_started")
        return fut

    def supply(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
               local_indexes: Iterable[int]) -> JobFuture[StoreResult]:
        """Offer stored blocks to the peer; they stay pinned until the result."""
        peer_id = peer_address(peer_id)
        self._threads.check("supply")
        job = self._jobs.new_id()
        fut: JobFuture[StoreResult] = JobFuture(self)
        self._jobs.stores[job] = fut
        try:
            self._host(peer_id, HostSupply(job, kv_request_id, tuple(keys),
                                           as_ints(local_indexes)), checked=True)
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
        self._threads.check("resolve_lookup")
        return self._effects.resolve_lookup(peer_id, token, hits or {}, frozenset(pending))

    def _check_open(self) -> None:
        if self._closed:
            raise LocalProtocolError("the node is closed")

    def _host(self, peer_id: str, event: Input, checked: bool = False) -> None:
        self._check_open()
        if not checked:  # fetch, lookup, supply: checked before anything changed
            self._threads.check(_HOST_CALLS.get(type(event), "a host call"))
        redials = self._peers.redials
        if redials.waiting(peer_id) and isinstance(event, HostFetch | HostLookup):
            # The session is dead and opens again soon: the call waits for it, up to
            # its own deadline.
            self.session(peer_id).check_host_call(event)  # bad arguments: refused now
            limit = (self.config.timeouts.load if isinstance(event, HostFetch)
                     else self.config.timeouts.lookup)
            redials.park(peer_id, time.monotonic() + limit, event)
            return
        self._driver.feed(peer_id, event, self.session(peer_id))
        self._driver.drain()

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
        return self._turns.next_deadline()

    def step(self, max_wait: float) -> int:
        """One loop turn: wait for news (at most ``max_wait`` s), then handle it all;
        how many control-plane events it took in. The hot path: no context managers."""
        if self._closed:
            raise LocalProtocolError("the node is closed")
        threads, turns = self._threads, self._turns
        me, outer = threads.begin_step()
        try:
            try:
                taken = turns.turn(max_wait)
            finally:
                threads.loop, threads.last_step = None, (me, time.monotonic())  # turn over
            if turns.close_request is not None and (
                    request := turns.take_close_request()) is not None:
                self._close_now(*request)
        finally:
            if outer:
                threads.driving = None
        return taken

    def _close_now(self, timeout: float, done: Future[None]) -> None:
        """Carry out ``threadsafe.close()`` on the driving thread, after a turn."""
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
        self._turns.submit(call)

    def request_close(self, timeout: float, done: Future[None]) -> None:
        """Close the node from the driving thread after its current turn (any thread;
        ``done`` resolves once closed). Used by ``threadsafe.close()``."""
        self._check_open()
        self._turns.request_close(timeout, done)

    def close(self, timeout: float = 5.0) -> None:
        """Close every session, give writes ``timeout`` to drain, release the transports.

        Closing a session gives each of its open jobs its result, as a session's end
        does (a failed LoadResult with ``reason`` SESSION_ENDED, ``released`` False
        where the peer could still have written; failed StoreResults; unanswered
        lookups). A future that still has none after that (a job no session held, a
        ``when_ready`` wait) gets a :class:`TransportError` "node closed"."""
        if self._closed:
            return
        self._threads.check("close")
        self._turns.handle_all()  # calls submitted before the close are carried out first
        self._peers.close_all()
        self._driver.drain()
        self.run_until(lambda: not self._writes, timeout)
        for write in self._writes.running():
            self._writes.forget(write)
            self._driver.feed(write.peer_id, WriteFinished(write.xfer, False), write.session)
        self._driver.drain()
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
            self._turns.submit(action)  # run by the driver on its next turn

    def attach_event_loop(self, thread_id: int | None) -> None:
        """Mark the thread of the asyncio loop driving the node (None: detach)."""
        self._threads.aio = thread_id
