"""asyncio: a :class:`~p2pfsm.executor.node.Node` driven by the running event loop.

No polling task and no thread: the loop watches the node's descriptor
(:meth:`Node.fileno`, with ``loop.add_reader``) and a single timer at
:meth:`Node.next_deadline`; each wake-up runs one ``node.step(0)`` and re-arms the
timer. Every host call made through :class:`AsyncNode` re-arms it too.

Cancellation has one meaning: cancelling a task awaiting a :class:`FetchHandle` finishes
the request (a round in flight is aborted) and the final
:class:`~p2pfsm.session.LoadResult` still arrives, in :attr:`FetchHandle.final`::

    async with AsyncNode(cfg) as node:
        await node.connect(peer, timeout=30)
        handle = node.fetch(peer, "req-1", keys, range(len(keys)))
        result = await handle                     # LoadResult
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, TypeVar

from p2pfsm.errors import LocalProtocolError
from p2pfsm.executor.node import LookupAnswer, Node
from p2pfsm.executor.node.config import NodeConfig
from p2pfsm.executor.node.jobs import JobFuture, LookupAsk, copy_outcome
from p2pfsm.executor.node.threadsafe import ThreadSafeNode
from p2pfsm.metrics import NodeMetrics
from p2pfsm.session import (
    DestinationReleased,
    FetchArrived,
    LoadResult,
    LookupResult,
    RoundEnded,
    Session,
    StoreResult,
)

__all__ = ["AsyncNode", "FetchHandle"]

T = TypeVar("T")

_MAX_STEPS_PER_WAKE = 64
"""Bound on back-to-back steps in one wake-up (a step that took a full batch of frames
may have left more behind the edge-triggered descriptor)."""

_FULL_BATCH = 1000  # ControlPlane's default max_batch


class FetchHandle:
    """One fetch. ``await handle`` gives its LoadResult; cancelling that await finishes
    the request, and the final LoadResult is still set on :attr:`final`."""

    def __init__(self, job: JobFuture[LoadResult], final: asyncio.Future[LoadResult],
                 wake: Callable[[], None]) -> None:
        self.job = job
        """The node's future of the result (never cancelled, never dropped)."""
        self.final = final
        """An asyncio future of the one LoadResult; it survives cancelled awaits."""
        self._wake = wake

    def __await__(self) -> Generator[Any, None, LoadResult]:
        return self._wait().__await__()

    async def _wait(self) -> LoadResult:
        try:
            return await asyncio.shield(self.final)
        except asyncio.CancelledError:
            self.job.cancel()  # finishes the request; the result still comes to final
            self._wake()
            raise


class AsyncNode:
    """A node owned by the running asyncio loop; use ``async with`` (or :meth:`start`
    and :meth:`aclose`). Every method must be called on the loop's thread."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        on_lookup: Callable[[str, LookupAsk], LookupAnswer] | None = None,
        on_fetch: Callable[[str, FetchArrived], None] | None = None,
        on_result: Callable[[str, LoadResult | StoreResult | LookupResult], None] | None = None,
        on_round_ended: Callable[[str, RoundEnded], None] | None = None,
        on_released: Callable[[str, DestinationReleased], None] | None = None,
        on_peer_state: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.node = Node(config, on_lookup=on_lookup, on_fetch=on_fetch, on_result=on_result,
                         on_round_ended=on_round_ended, on_released=on_released,
                         on_peer_state=on_peer_state)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._fd: int | None = None
        self.wakeups = 0
        """How many times the loop ran the node (a measure of idle cost)."""

    @property
    def local_id(self) -> str:
        return self.node.local_id

    @property
    def metrics(self) -> NodeMetrics:
        """The node's counters and gauges (``Node.metrics``)."""
        return self.node.metrics

    @property
    def threadsafe(self) -> ThreadSafeNode:
        """Host calls from threads other than the event loop's (``Node.threadsafe``):
        each returns a ``concurrent.futures.Future`` at once and wakes the loop."""
        return self.node.threadsafe

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Hook the node into the running loop."""
        if self._loop is not None:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._fd = self.node.fileno()
        loop.add_reader(self._fd, self._run)
        self.node.attach_event_loop(threading.get_ident())
        self._run()

    async def aclose(self, timeout: float = 5.0) -> None:
        """Unhook from the loop and close the node (writes get ``timeout`` to drain)."""
        self._detach()
        self.node.close(timeout)

    async def __aenter__(self) -> AsyncNode:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------- host API
    async def connect(self, peer_id: str, timeout: float = 30.0) -> Session:
        """Open the session to ``peer_id`` and wait until it is ready.

        Raises :class:`~p2pfsm.errors.TransportError` (the death reason) if it dies first, and
        :class:`TimeoutError` if it is not ready within ``timeout`` seconds (the session
        stays open: it may still become ready).
        """
        loop = self._require_loop()
        self.node.connect(peer_id)
        ready = self.node.when_ready(peer_id)
        self._wake()
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(ready, loop=loop)),
                                      timeout)

    def fetch(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
              dest_indexes: Iterable[int]) -> FetchHandle:
        """Start a fetch; await the handle for its LoadResult."""
        loop = self._require_loop()
        job = self.node.fetch(peer_id, kv_request_id, keys, dest_indexes)
        final: asyncio.Future[LoadResult] = loop.create_future()
        # Copies the node's result onto the asyncio future (the node runs on the loop).
        job.add_done_callback(lambda f: copy_outcome(f, final))
        self._wake()
        return FetchHandle(job, final, self._wake)

    async def released(self, job_id: int) -> DestinationReleased:
        """Wait for the release of a load's destination its result held
        (``released=False``; ``Node.release_of``)."""
        notice: DestinationReleased = await self._await(self.node.release_of(job_id))
        return notice

    def held_destinations(self) -> dict[str, int]:
        """Per peer, destinations held until their release notice (``Node``'s)."""
        return self.node.held_destinations()

    async def lookup(self, peer_id: str, kv_request_id: str,
                     keys: Iterable[bytes]) -> LookupResult:
        """Ask the peer which keys it holds."""
        result: LookupResult = await self._await(self.node.lookup(peer_id, kv_request_id, keys))
        return result

    async def supply(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
                     local_indexes: Iterable[int]) -> StoreResult:
        """Offer stored blocks; returns once no write reads them (unpin then)."""
        result: StoreResult = await self._await(
            self.node.supply(peer_id, kv_request_id, keys, local_indexes))
        return result

    def disconnect(self, peer_id: str) -> None:
        """Close the session to the peer and stop redialling it (``Node.disconnect``)."""
        self.node.disconnect(peer_id)
        self._wake()

    def redial_now(self, peer_id: str) -> bool:
        """Open the peer's session again without waiting out its backoff
        (``Node.redial_now``); False when no redial of it waits."""
        due = self.node.redial_now(peer_id)
        self._wake()
        return due

    def finish(self, peer_id: str, kv_request_id: str) -> None:
        """The host is done with the request (``Node.finish``)."""
        self.node.finish(peer_id, kv_request_id)
        self._wake()

    def decline(self, peer_id: str, kv_request_id: str, round_seq: int) -> None:
        """Decline a round the host cannot serve (``Node.decline``)."""
        self.node.decline(peer_id, kv_request_id, round_seq)
        self._wake()

    def resolve_lookup(self, peer_id: str, token: int, hits: Mapping[bytes, int] | None = None,
                       pending: Iterable[bytes] = ()) -> JobFuture[StoreResult] | None:
        """Answer a served lookup's pending keys (``Node.resolve_lookup``)."""
        result = self.node.resolve_lookup(peer_id, token, hits, pending)
        self._wake()
        return result

    # ------------------------------------------------------------ internals
    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self.node.closed:
            raise LocalProtocolError("AsyncNode is closed")
        if self._loop is None:
            raise LocalProtocolError("AsyncNode is not started: use 'async with' or start()")
        return self._loop

    async def _await(self, job: JobFuture[T]) -> T:
        loop = self._require_loop()
        self._wake()
        return await asyncio.shield(asyncio.wrap_future(job, loop=loop))

    def _wake(self) -> None:
        """Run the node soon (a host call may have armed timers or queued work)."""
        if self._loop is not None:
            self._reschedule(0.0)

    def _run(self) -> None:
        if self._loop is None:
            return
        self.wakeups += 1
        for _ in range(_MAX_STEPS_PER_WAKE):
            taken = self.node.step(0)
            if taken < _FULL_BATCH:
                break
        self._reschedule(max(0.0, self.node.next_deadline() - time.monotonic()))

    def _reschedule(self, delay: float) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(delay, self._run)

    def _detach(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._loop is not None and self._fd is not None:
            self._loop.remove_reader(self._fd)
        self._fd = None
        self._loop = None
        self.node.attach_event_loop(None)

