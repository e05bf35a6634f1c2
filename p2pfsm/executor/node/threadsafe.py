"""Host calls from any thread, carried out by the thread that drives a :class:`Node`.

An engine's scheduler and its I/O loop are different threads. The node is driven by
one thread (``serve()``, ``run_until()``, a host's own loop calling ``step()``, or an
asyncio loop through :class:`p2pfsm.aio.AsyncNode`); every other thread reaches it
through ``node.threadsafe``. Each call here copies its arguments, queues the real call
for the driving thread (:meth:`Node.call_soon_threadsafe`, which wakes a loop that is
waiting) and returns a future at once:

* ``fetch``, ``lookup``, ``supply`` resolve with the job's one result (``LoadResult``,
  ``LookupResult``, ``StoreResult``), or with the error the node's call raised (a bad
  argument, no session);
* ``resolve_lookup`` with the future of the new pins' ``StoreResult`` (None without hits);
* ``connect`` with None once the session is ready (a ``TransportError`` if it dies
  first); ``finish``, ``decline`` with None once carried out; ``close`` once the node
  is closed (the driving loop then returns).

The futures are :class:`SubmittedFuture` (a ``concurrent.futures.Future``): wait on
them from any thread, with a timeout; they resolve only while some thread drives the
node. ``cancel()`` on a fetch's future does what it does on ``Node.fetch``'s: the
request is finished and the future still resolves with the final ``LoadResult``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from p2pfsm.executor.node.jobs import copy_outcome
from p2pfsm.session import LoadResult, LookupResult, StoreResult

T = TypeVar("T")


class HostApi(Protocol):
    """The calls of a :class:`~p2pfsm.executor.node.Node` that :class:`ThreadSafeNode`
    carries to its driving thread (and the one its futures ask why a wait timed out)."""

    def wait_problem(self) -> str | None: ...

    def fetch(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
              dest_indexes: Iterable[int]) -> Future[LoadResult]: ...
    def lookup(self, peer_id: str, kv_request_id: str,
               keys: Iterable[bytes]) -> Future[LookupResult]: ...
    def supply(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
               local_indexes: Iterable[int]) -> Future[StoreResult]: ...
    def resolve_lookup(self, peer_id: str, token: int, hits: Mapping[bytes, int] | None = None,
                       pending: Iterable[bytes] = ()) -> Future[StoreResult] | None: ...
    def finish(self, peer_id: str, kv_request_id: str) -> None: ...
    def decline(self, peer_id: str, kv_request_id: str, round_seq: int) -> None: ...
    def connect(self, peer_id: str) -> Any: ...
    def when_ready(self, peer_id: str) -> Future[Any]: ...
    def disconnect(self, peer_id: str) -> None: ...
    def redial_now(self, peer_id: str) -> bool: ...
    def request_close(self, timeout: float, done: Future[None]) -> None: ...
    def call_soon_threadsafe(self, call: Callable[[], None]) -> None: ...


class SubmittedFuture(Future[T]):
    """The future of a submitted call; ``cancel()`` never cancels it (a fetch's
    request is finished instead, and its result still comes). A wait that times out
    raises a ``TimeoutError`` saying why, when the node can tell (nothing drives it, or
    the wait is on the thread that should)."""

    def __init__(self, on_cancel: Callable[[], None] | None = None,
                 node: HostApi | None = None) -> None:
        super().__init__()
        self._on_cancel = on_cancel
        self._node = node

    def result(self, timeout: float | None = None) -> T:
        try:
            return super().result(timeout)
        except TimeoutError:
            raise self._timed_out(timeout) from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            return super().exception(timeout)
        except TimeoutError:
            raise self._timed_out(timeout) from None

    def _timed_out(self, timeout: float | None) -> TimeoutError:
        problem = None if self._node is None else self._node.wait_problem()
        return TimeoutError(f"no result within {timeout} s: "
                            f"{problem or 'the node has not finished the call yet'}")

    def cancel(self) -> bool:
        action, self._on_cancel = self._on_cancel, None
        if action is not None and not self.done():
            action()
        return False


class ThreadSafeNode:
    """``node.threadsafe``: the host API for threads that do not drive the node."""

    def __init__(self, node: HostApi) -> None:
        self._node = node

    def fetch(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
              dest_indexes: Iterable[int]) -> SubmittedFuture[LoadResult]:
        """:meth:`Node.fetch` on the driving thread; the future of its LoadResult."""
        keys, dest = tuple(keys), tuple(dest_indexes)
        return self._job(lambda: self._node.fetch(peer_id, kv_request_id, keys, dest),
                         cancellable=True)

    def lookup(self, peer_id: str, kv_request_id: str,
               keys: Iterable[bytes]) -> SubmittedFuture[LookupResult]:
        """:meth:`Node.lookup` on the driving thread; the future of its LookupResult."""
        keys = tuple(keys)
        return self._job(lambda: self._node.lookup(peer_id, kv_request_id, keys))

    def supply(self, peer_id: str, kv_request_id: str, keys: Iterable[bytes],
               local_indexes: Iterable[int]) -> SubmittedFuture[StoreResult]:
        """:meth:`Node.supply` on the driving thread; the future of its StoreResult."""
        keys, idxs = tuple(keys), tuple(local_indexes)
        return self._job(lambda: self._node.supply(peer_id, kv_request_id, keys, idxs))

    def resolve_lookup(self, peer_id: str, token: int,
                       hits: Mapping[bytes, int] | None = None, pending: Iterable[bytes] = (),
                       ) -> SubmittedFuture[Future[StoreResult] | None]:
        """:meth:`Node.resolve_lookup` on the driving thread; resolves with what it
        returns (the future of the new pins' StoreResult, or None)."""
        found, still = dict(hits or {}), tuple(pending)
        return self._call(lambda: self._node.resolve_lookup(peer_id, token, found, still))

    def finish(self, peer_id: str, kv_request_id: str) -> SubmittedFuture[None]:
        """:meth:`Node.finish` on the driving thread."""
        return self._call(lambda: self._node.finish(peer_id, kv_request_id))

    def decline(self, peer_id: str, kv_request_id: str, round_seq: int) -> SubmittedFuture[None]:
        """:meth:`Node.decline` on the driving thread."""
        return self._call(lambda: self._node.decline(peer_id, kv_request_id, round_seq))

    def connect(self, peer_id: str) -> SubmittedFuture[None]:
        """:meth:`Node.connect` on the driving thread; resolves once the session is
        ready, with the TransportError that ended it otherwise."""
        def start() -> SubmittedFuture[None]:
            self._node.connect(peer_id)
            ready = self._node.when_ready(peer_id)
            done: SubmittedFuture[None] = SubmittedFuture(node=self._node)
            ready.add_done_callback(lambda f: copy_outcome(f, done, lambda _session: None))
            return done
        return self._job(start)

    def disconnect(self, peer_id: str) -> SubmittedFuture[None]:
        """:meth:`Node.disconnect` on the driving thread (no more redials of the peer)."""
        return self._call(lambda: self._node.disconnect(peer_id))

    def redial_now(self, peer_id: str) -> SubmittedFuture[bool]:
        """:meth:`Node.redial_now` on the driving thread; resolves with what it returns."""
        return self._call(lambda: self._node.redial_now(peer_id))

    def close(self, timeout: float = 5.0) -> SubmittedFuture[None]:
        """Close the node on the driving thread after its current turn; the loop that
        drives it (``serve``, ``run_until``) then returns."""
        done: SubmittedFuture[None] = SubmittedFuture(node=self._node)
        self._node.request_close(timeout, done)
        return done

    # ------------------------------------------------------------ internals
    def _call(self, call: Callable[[], T]) -> SubmittedFuture[T]:
        """Run ``call`` on the driving thread; the future of what it returns."""
        out: SubmittedFuture[T] = SubmittedFuture(node=self._node)

        def run() -> None:
            try:
                value = call()
            except BaseException as exc:  # the caller's error, given to the caller
                out.set_exception(exc)
            else:
                out.set_result(value)

        self._node.call_soon_threadsafe(run)
        return out

    def _job(self, start: Callable[[], Future[T]], *,
             cancellable: bool = False) -> SubmittedFuture[T]:
        """Run ``start`` on the driving thread; the future of the job future's result."""
        inner: list[Future[T]] = []
        asked = [False]  # cancel() came before the job started: cancel it once it has

        def cancel() -> None:  # on the driving thread
            asked[0] = True
            if inner:
                inner[0].cancel()

        out: SubmittedFuture[T] = SubmittedFuture(
            (lambda: self._node.call_soon_threadsafe(cancel)) if cancellable else None,
            self._node)

        def run() -> None:
            try:
                job = start()
            except BaseException as exc:
                out.set_exception(exc)
                return
            inner.append(job)
            job.add_done_callback(lambda f: copy_outcome(f, out))
            if asked[0]:
                job.cancel()

        self._node.call_soon_threadsafe(run)
        return out

