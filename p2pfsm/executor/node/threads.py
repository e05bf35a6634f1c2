"""Which thread drives a node: the one rule of who may call it, and from where.

One thread drives a :class:`~p2pfsm.executor.node.Node` (``serve``, ``run_until``,
``step``, or an asyncio loop through :class:`p2pfsm.aio.AsyncNode`) and makes its host
calls; a direct call from another thread while one drives it is refused, naming
``node.threadsafe`` as the way. :class:`DrivingThreads` is that book: the thread inside
``serve`` / ``run_until`` / ``step``, the one inside a loop turn, the last thread that
stepped, and an attached asyncio loop's thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from p2pfsm.errors import LocalProtocolError

_DRIVEN_RECENTLY_S = 1.0
"""A thread that stepped the node this recently counts as its driver."""


class DrivingThreads:
    """The threads that drive one node, and the checks made against them."""

    __slots__ = ("aio", "driving", "last_step", "loop")

    def __init__(self) -> None:
        self.loop: int | None = None
        """The thread inside a loop turn (``step``), while it is."""
        self.driving: int | None = None
        """The thread inside ``serve`` / ``run_until`` / ``step``."""
        self.last_step: tuple[int, float] | None = None
        """The thread that stepped last, and when it finished."""
        self.aio: int | None = None
        """The thread of an attached asyncio loop."""

    def check(self, what: str) -> None:
        """Refuse a call from another thread than the one driving the node."""
        driver = self.driving if self.driving is not None else self.aio
        if driver is not None and driver != threading.get_ident():
            if what in ("serve", "run_until", "step"):
                raise LocalProtocolError(
                    f"{what}(): another thread drives this node; one thread drives it")
            raise LocalProtocolError(
                f"{what}: called from another thread than the one driving this node; "
                f"submit it from here with node.threadsafe.{what}(...), which returns a "
                "future at once")

    @contextlib.contextmanager
    def driving_block(self, what: str) -> Iterator[None]:
        """This thread drives the node for the block (nested calls keep the outer's)."""
        self.check(what)
        outer = self.driving is None
        if outer:
            self.driving = threading.get_ident()
        try:
            yield
        finally:
            if outer:
                self.driving = None

    def begin_step(self) -> tuple[int, bool]:
        """``step``: this thread drives the node and is inside a loop turn from now
        (refused inside a turn, and as :meth:`check` refuses); its id and whether it is
        the outermost driving call, for :meth:`end_step`. One call, one thread lookup:
        a step is the hot path. The caller ends the turn (:attr:`loop` None,
        :attr:`last_step` its id and the clock) and sets :attr:`driving` back to None
        when it was the outermost."""
        me = threading.get_ident()
        if self.loop == me:
            raise LocalProtocolError("step() called from inside the node's own loop")
        driving = self.driving
        if driving is None:
            if self.aio is not None and self.aio != me:
                self.check("step")
            self.driving = self.loop = me
            return me, True
        if driving != me:
            self.check("step")
        self.loop = me
        return me, False

    def wait_problem(self) -> str | None:
        """Why a blocking wait on this thread would never end (None: something drives)."""
        me = threading.get_ident()
        if self.loop == me:
            return "called from inside the node's loop (a callback); let the loop finish it"
        if self.aio is not None:
            if self.aio == me:
                return "called on the event loop's thread; await it instead"
            return None
        if self.loop is not None:
            return None
        if (self.last_step is not None and self.last_step[0] != me
                and time.monotonic() - self.last_step[1] < _DRIVEN_RECENTLY_S):
            return None
        return ("nothing drives the node: call node.run_until(future.done, timeout) here, "
                "run node.serve() on another thread, or await it through p2pfsm.aio")

    def may_run_here(self) -> bool:
        """A cancel may run on the calling thread now (nothing drives the node, or this
        thread's event loop does, outside a turn); else the driver runs it next turn."""
        driver = self.loop or self.aio
        return driver is None or (driver == threading.get_ident() and self.loop is None)
