"""What a node hands the host for its jobs: futures that cannot lose a result.

A :class:`JobFuture` is a :class:`concurrent.futures.Future` with two changes:

* ``cancel()`` never cancels it. For a fetch it asks the node to finish the request
  (an in-flight round is aborted) and the future still resolves with the final
  :class:`~p2pfsm.session.LoadResult`, whose ``released`` says when the destination may
  be reused; for other jobs it does nothing. It always returns False, so the future is
  never marked cancelled and its result is never dropped.
* ``result()`` / ``exception()`` on an unfinished future raise
  :class:`~p2pfsm.errors.LocalProtocolError` when nothing drives the node (no thread in
  its loop, no asyncio driver) or when the caller is the thread that drives it: waiting
  there would hang forever.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from p2pfsm.errors import LocalProtocolError
from p2pfsm.session import HostFetch, LoadResult, LookupResult, StoreResult

T = TypeVar("T")


def copy_outcome(source: Future[Any], target: Future[Any] | asyncio.Future[Any],
                 value: Callable[[Any], Any] | None = None) -> None:
    """Copy a finished future's outcome (its exception, or its result mapped by
    ``value``) onto ``target``, unless ``target`` is done already: for chaining one
    job's future to another, e.g. from ``add_done_callback``."""
    if target.done():
        return
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        result = source.result()
        target.set_result(result if value is None else value(result))


class Driven:
    """What a future asks of its node: may a wait on this thread end?"""

    def wait_problem(self) -> str | None:  # pragma: no cover - overridden
        """None when a blocking wait here can end; else why not."""
        return None

    def request_cancel(self, action: Callable[[], None]) -> None:  # pragma: no cover
        """Run ``action`` on the node's thread (now, or on its next loop turn)."""
        action()


class JobFuture(Future[T], Generic[T]):
    """A job's one result; see the module docstring for ``cancel`` and waits."""

    def __init__(self, node: Driven, on_cancel: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._node = node
        self._on_cancel = on_cancel
        self.started = time.monotonic()
        """When the job was made (``time.monotonic()``), for its latency."""

    def cancel(self) -> bool:
        """Never cancels; a fetch's request is finished instead (its result still comes)."""
        action, self._on_cancel = self._on_cancel, None
        if action is not None and not self.done():
            self._node.request_cancel(action)
        return False

    def result(self, timeout: float | None = None) -> T:
        self._check_wait()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._check_wait()
        return super().exception(timeout)

    def _check_wait(self) -> None:
        if self.done():
            return
        problem = self._node.wait_problem()
        if problem is not None:
            raise LocalProtocolError(f"waiting for this result would hang: {problem}")


@dataclass(frozen=True, eq=False)
class LookupAsk:
    """A peer's lookup, as ``on_lookup`` sees it.

    ``token`` is the node's id for the lookup (unique across peers and sessions; pass it
    to :meth:`Node.resolve_lookup`). ``pins`` resolves once the blocks ``on_lookup``
    returned as hits are no longer read by any write: unpin them then. It resolves with
    ``StoreResult(0, False)`` when ``on_lookup`` returned no hits (nothing was pinned).
    """

    token: int
    kv_request_id: str
    round_seq: int
    keys: tuple[bytes, ...]
    pins: JobFuture[StoreResult]


LookupAnswer = tuple[Mapping[bytes, int], Iterable[bytes]]
"""What ``on_lookup`` returns: hit key -> local block index, and still-pending keys."""


@dataclass(eq=False, slots=True)
class OpenLoad:
    """A fetch the host waits on: its future, when it started, its bytes, and its input
    (fed again to a redialled session if its session died before sending it)."""

    future: JobFuture[LoadResult]
    started: float
    nbytes: int
    event: HostFetch


class OpenJobs:
    """A node's jobs that still owe the host a result: loads and stores by job id,
    lookups in the order asked per (peer, request), and waits for a session to be
    ready. Each future leaves the book with its result (or at :meth:`fail_all`). Job ids
    come from here (:meth:`new_id`)."""

    __slots__ = ("_last_id", "loads", "lookups", "ready_waiters", "stores")

    def __init__(self) -> None:
        self._last_id = 0
        self.loads: dict[int, OpenLoad] = {}
        self.stores: dict[int, JobFuture[StoreResult]] = {}
        self.lookups: dict[tuple[str, str], deque[JobFuture[LookupResult]]] = {}
        self.ready_waiters: dict[str, list[JobFuture[Any]]] = {}

    def new_id(self) -> int:
        """A job id not given before in this node."""
        self._last_id += 1
        return self._last_id

    def add_lookup(self, peer_id: str, kv_request_id: str,
                   fut: JobFuture[LookupResult]) -> None:
        self.lookups.setdefault((peer_id, kv_request_id), deque()).append(fut)

    def drop_last_lookup(self, peer_id: str, kv_request_id: str) -> None:
        """Take back the lookup just added (its host call was refused)."""
        queue = self.lookups[(peer_id, kv_request_id)]
        queue.pop()
        if not queue:
            del self.lookups[(peer_id, kv_request_id)]

    def take_lookup(self, peer_id: str, kv_request_id: str) -> JobFuture[LookupResult] | None:
        """The oldest lookup of the request still waiting (lookups are answered in the
        order they were asked), or None."""
        queue = self.lookups.get((peer_id, kv_request_id))
        fut = queue.popleft() if queue else None
        if queue is not None and not queue:
            del self.lookups[(peer_id, kv_request_id)]
        return fut

    def fail_all(self, error: BaseException) -> None:
        """Every future still open gets ``error``; the book is empty after."""
        pending: list[JobFuture[Any]] = [
            *(load.future for load in self.loads.values()), *self.stores.values(),
            *(f for queue in self.lookups.values() for f in queue),
            *(f for waiters in self.ready_waiters.values() for f in waiters)]
        for fut in pending:
            if not fut.done():
                fut.set_exception(error)
        self.loads.clear()
        self.stores.clear()
        self.lookups.clear()
        self.ready_waiters.clear()
