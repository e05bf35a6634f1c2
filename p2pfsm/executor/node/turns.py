"""One turn of a node's loop: what happened, fed to the sessions, and what is due next.

A turn runs the calls other threads submitted, polls the control plane (waiting at
most until :meth:`Turns.next_deadline`), hands its frames and lost peers to
:class:`~p2pfsm.executor.node.peers.Peers`, progresses the data plane, collects the writes
that ended, queues the due timers, redials and idle closes, handles every queued input
through the driver, and updates the gauges. ``Node.step`` runs one turn on the thread
that drives the node.

Each of those steps runs only when a check of plain attributes says it has work or is
due (the data plane progressed every turn while busy, else once per idle interval; the
gauges set again only after a session was fed, a job opened or closed, or a frame was
dropped for a rate), so a turn that finds nothing costs a few calls.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.executor.node.effects import NodeEffects
from p2pfsm.executor.node.jobs import OpenJobs, copy_outcome
from p2pfsm.executor.node.peers import Peers
from p2pfsm.executor.node.writes import Writes
from p2pfsm.executor.zmq.plane import ControlPlane, FrameIn, PeerLost
from p2pfsm.metrics import NodeMetrics
from p2pfsm.session import TransportLost, WriteFinished

INBOUND_GRACE_S = 0.05
"""How long the data plane stays at its busy progress interval after a load ends."""


class Turns:
    """The turns of one node's loop, and the calls other threads submit to them."""

    def __init__(self, control: ControlPlane, data: DataPlane, effects: NodeEffects,
                 peers: Peers, jobs: OpenJobs, writes: Writes, metrics: NodeMetrics) -> None:
        self._control = control
        self._effects = effects
        driver = effects.driver
        self._data = data
        self._driver = driver
        self._peers = peers
        self._jobs = jobs
        self._writes = writes
        self._metrics = metrics
        # Calls from other threads (cancels, node.threadsafe), run in order by the driver.
        self._submitted: deque[Callable[[], None]] = deque()
        self._rate_limited = 0  # control.rate_limited already in metrics
        # What each turn checks inline (attributes, not calls): the data plane's WRITEs
        # not reported yet, its pace, the sessions' deadline heap, the idle book, the
        # redial times, the intake's rate drops.
        self._xfers = data.writes
        self._pace = data.pace
        self._deadlines = driver.deadlines
        self._idle = peers.idle
        self._redials_at = peers.redials.at
        self._intake = control.intake
        self._progress_at = 0.0  # when an idle data plane is progressed next
        # The gauges were set for this many feeds and open jobs (-1: never set).
        self._fed = -1
        self._loads = self._stores = 0
        self.close_request: tuple[float, Future[None]] | None = None

    def request_close(self, timeout: float, done: Future[None]) -> None:
        """Close the node after the current turn (any thread; ``done`` resolves once
        closed; a second request is done when the first one is)."""
        if self.close_request is None:
            self.close_request = (timeout, done)
        else:
            first = self.close_request[1]
            first.add_done_callback(lambda f: copy_outcome(f, done))
        self._control.wake()

    def take_close_request(self) -> tuple[float, Future[None]] | None:
        """The close requested (its timeout and future), once; None without one."""
        request, self.close_request = self.close_request, None
        return request

    def submit(self, call: Callable[[], None]) -> None:
        """Run ``call`` at the start of the next turn (any thread), waking a loop that
        waits."""
        self._submitted.append(call)
        self._control.wake()

    def next_deadline(self) -> float:
        """The ``time.monotonic()`` by which the next turn must run (``Node.next_deadline``)."""
        now = time.monotonic()
        deadline = now + self._data.progress_interval_ms / 1000.0
        earliest = self._driver.next_deadline()
        if earliest is not None:
            deadline = min(deadline, earliest)
        redial = self._peers.redials.next_due()
        if redial is not None:
            deadline = min(deadline, redial)
        connect_ms = self._control.next_timeout_ms()
        if connect_ms is not None:
            deadline = min(deadline, now + connect_ms / 1000.0)
        if self._driver.busy or self._submitted:
            deadline = now
        return deadline

    def turn(self, max_wait: float) -> int:
        """One turn, waiting at most ``max_wait`` s for news; how many control-plane
        events it took in. Each sub-step runs only when a cheap check says it has work
        or is due: a turn that finds nothing costs a few calls. The frames the turn's
        sessions send are written together at its end (:meth:`NodeEffects.send_held`)."""
        effects = self._effects
        effects.holding = True
        try:
            driver, xfers, jobs, pace = self._driver, self._xfers, self._jobs, self._pace
            if self._submitted or driver.waiting or driver.deferred or xfers.inflight or xfers.done:
                self.handle_all()
            if jobs.loads:
                # Blocks may be arriving (a peer's first WRITE needs our UCX progress):
                # progress often while loads are open, and only then.
                pace.expect_inbound(INBOUND_GRACE_S, False)
            if max_wait > 0.0:
                wait = max(0.0, min(max_wait, self.next_deadline() - time.monotonic()))
                # Round up: truncating made every sub-ms remainder a poll(0), so the 1 ms
                # busy pace (always a hair under 1 ms away by now) was a spin.
                events = self._control.poll(math.ceil(wait * 1000))
            else:
                events = self._control.poll(0)
            peers = self._peers
            for event in events:
                if isinstance(event, FrameIn):
                    peers.on_frame(event.peer_id, event.frame, event.conn)
                elif isinstance(event, PeerLost):
                    peers.queue(event.peer_id, TransportLost(event.reason))
            now = time.monotonic()
            if (xfers.inflight or now >= self._progress_at or now < pace.busy_until
                    or now < pace.prompt_until):
                # Busy (loads open, WRITEs of ours in flight, a peer added lately): every
                # turn; idle: once per idle interval, as the loop's deadline wakes it.
                self._data.progress()
                self._progress_at = now + pace.idle_ms / 1000.0
            if xfers.inflight or xfers.done:
                self._collect_writes()
            now = time.monotonic()
            heap = self._deadlines.heap
            if heap and heap[0][0] <= now:
                driver.queue_due(now)
            idle = self._idle
            if idle.check_at <= now:
                peers.evict_idle(now)
            if self._redials_at:
                peers.redial_due(now)
            if self._submitted or driver.waiting or driver.deferred or xfers.inflight or xfers.done:
                self.handle_all()
            if (driver.fed != self._fed or len(jobs.loads) != self._loads
                    or len(jobs.stores) != self._stores
                    or self._intake.rate_drops != self._rate_limited):
                self._update_gauges()
            return len(events)
        finally:
            if effects.held:
                effects.send_held()
            else:
                effects.holding = False

    def handle_all(self) -> None:
        """Handle every queued event, and the writes that this finished at once: over
        CMA a WRITE usually completes inside ``transfer()``, and waiting for the next
        turn to notice would add a whole loop wait (up to the idle interval) to it."""
        while self._submitted:
            self._submitted.popleft()()
        self._driver.drain()
        while self._xfers and self._collect_writes():
            self._driver.drain()

    def _collect_writes(self) -> bool:
        """Queue WriteFinished for our finished writes; True when there were any."""
        found = False
        for write, ok in self._writes.finished():
            if ok:
                self._metrics.count("served_bytes", write.nbytes)
            self._driver.queue(write.peer_id, WriteFinished(write.xfer, ok), write.session)
            found = True
        return found

    def _update_gauges(self) -> None:
        """The loop's gauges, set again: only after a turn in which a session was fed,
        a job opened or closed, or a frame was dropped for a rate (nothing else moves
        them)."""
        limited = self._intake.rate_drops
        if limited != self._rate_limited:
            self._metrics.count("identities_rate_limited", limited - self._rate_limited)
            self._rate_limited = limited
        peers, jobs = self._peers, self._jobs
        self._fed = self._driver.fed
        self._loads, self._stores = len(jobs.loads), len(jobs.stores)
        alive, held = peers.loop_gauges()
        self._metrics.set_loop_gauges(alive, self._loads, self._stores, held)
