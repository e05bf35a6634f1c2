"""The one driver of sessions: what every executor used to spell out for itself.

A :class:`Driver` feeds inputs to sans-IO :class:`~p2pfsm.session.Session` objects and
hands each output, in order, to its executor's effects (an
:class:`~p2pfsm.executor.runtime.effects.Executor`: send a frame, start a registration, start or
cancel a write, deliver a result). It owns:

* the input queue: an input produced while outputs are carried out (a failed send's
  ``TransportLost``, a registration that finished inline, a due timer) is queued with the
  session it belongs to, and handled after the call that produced it, never recursed
  into; an input whose session is gone (None) is dropped;
* re-entrancy: :attr:`Driver.applying` says whose outputs are being carried out (nested
  calls keep and restore the outer's), and :attr:`Driver.draining` tells a nested caller
  that an outer :meth:`Driver.drain` will reach what it queued;
* deferred host work (:meth:`Driver.defer`): callbacks that run after the queue is empty,
  from the outermost drain only, so host code never runs inside a session step;
* the call hook around every ``Session.handle`` call (the spec trace log);
* the sessions' deadlines (:class:`~p2pfsm.executor.runtime.deadlines.SessionDeadlines`): after
  each call it notes when that session next needs the clock; :meth:`Driver.next_deadline`
  is the earliest of all, and :meth:`Driver.queue_due` queues a ``TimerFired`` for each
  timer that is due (sessions own their timers; no executor keeps a copy);
* telling the executor when a call made a session ready or left it over
  (:meth:`Executor.session_ready`, :meth:`Executor.session_over`).

Executors then only carry out effects: :class:`~p2pfsm.executor.node.Node` (ZeroMQ +
NIXL), the vLLM adapter (:mod:`p2pfsm.vllm.session`),
:class:`~p2pfsm.sim.world.SimWorld` and the conformance tester
(:mod:`p2pfsm.tools.conform.tester_effects`). The driver does no I/O; its clock is given.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from p2pfsm.executor.runtime.deadlines import SessionDeadlines
from p2pfsm.executor.runtime.effects import Executor, bound_handlers
from p2pfsm.session import Input, Output, Session, TimerFired


class CallRecorder(Protocol):
    """Told of every ``Session.handle`` call (:class:`p2pfsm.spec_log.CallHook` is one)."""

    def record(self, peer_id: str, state_before: str, event: Input, started_ns: int,
               outputs: Sequence[Output]) -> None:
        """A call returned with ``outputs`` (not carried out yet)."""

    def discard(self) -> None:
        """A call raised (it changed nothing)."""


class Driver:
    """Feeds one executor's sessions and carries out their outputs through its effects.

    Args:
        effects: carries out each output (``effects.apply``) and hears of sessions that
            turned ready or ended.
        clock: the ``now`` given to each ``Session.handle`` call.
        hook: told of every call (None: no hook).
    """

    __slots__ = ("_clock", "_draining", "_handlers", "applying", "deadlines", "deferred",
                 "effects", "fed", "hook", "waiting")

    def __init__(self, effects: Executor, clock: Callable[[], float],
                 hook: CallRecorder | None = None) -> None:
        self.effects = effects
        # Output type -> the bound method that carries it out, looked up once here
        # rather than per output (None: the executor overrides ``apply``).
        self._handlers = bound_handlers(effects)
        self.hook = hook
        self._clock = clock
        # Each input is bound to its session when it is queued (a frame to the session
        # current when it arrived, a write's or timer's result to the session that
        # started it), so a session that replaces another never sees the old one's.
        self.waiting: deque[tuple[str, Input, Session | None]] = deque()
        """The inputs waiting for :meth:`drain` (read it; :meth:`queue` adds)."""
        self.deferred: deque[Callable[[], None]] = deque()
        """The calls waiting for the outermost drain (read it; :meth:`defer` adds)."""
        self._draining = False
        self.deadlines = SessionDeadlines()
        """Each session's next deadline (read it; the driver notes them)."""
        self.fed = 0
        """How many calls :meth:`feed` has made (a loop skips work when it has not moved)."""
        self.applying: Session | None = None
        """The session whose outputs are being carried out (None between calls)."""

    @property
    def busy(self) -> bool:
        """Inputs or deferred calls are waiting for :meth:`drain`."""
        return bool(self.waiting or self.deferred)

    @property
    def draining(self) -> bool:
        """A :meth:`drain` is running further up the stack."""
        return self._draining

    def next_deadline(self) -> float | None:
        """The earliest deadline of any session fed here, or None when none is armed."""
        return self.deadlines.earliest()

    def queue_due(self, now: float) -> int:
        """Queue ``TimerFired`` for every timer due by ``now`` (each session's in its
        order); :meth:`drain` feeds them. Returns how many were queued."""
        queued = 0
        for peer, session in self.deadlines.pop_due(now):
            timers = session.due_timers(now)
            if not timers:  # changed by a call made around the driver: note it again
                self.deadlines.note(peer, session)
            for timer in timers:
                self.waiting.append((peer, TimerFired(timer), session))
            queued += len(timers)
        return queued

    def queue(self, peer: str, event: Input, session: Session | None) -> None:
        """Queue ``event`` for ``session`` (None: dropped when its turn comes)."""
        self.waiting.append((peer, event, session))

    def defer(self, call: Callable[[], None]) -> None:
        """Run ``call`` once the queue is empty, from the outermost :meth:`drain`."""
        self.deferred.append(call)

    def feed(self, peer: str, event: Input, session: Session) -> list[Output]:
        """Give ``event`` to ``session`` now and carry out its outputs in order."""
        was_ready = session.ready
        self.fed += 1
        hook = self.hook
        if hook is None:
            outputs = session.handle(event, self._clock())
        else:
            started, state = time.monotonic_ns(), session.state
            try:
                outputs = session.handle(event, self._clock())
            except BaseException:
                hook.discard()
                raise
            hook.record(peer, state, event, started, outputs)
        self.deadlines.note(peer, session)
        effects = self.effects
        handlers = self._handlers
        outer, self.applying = self.applying, session
        try:
            if handlers is None:
                for out in outputs:
                    effects.apply(peer, out)
            else:
                for out in outputs:
                    handlers[type(out)](peer, out)
        finally:
            self.applying = outer
        if not was_ready and session.ready:
            effects.session_ready(peer, session)
        elif not session.alive:
            effects.session_over(peer, session)
        return outputs

    def drain(self) -> None:
        """Handle queued inputs; then (unless this is a nested drain) run the deferred
        calls, until both queues are empty."""
        nested = self._draining
        self._draining = True
        events = self.waiting
        try:
            while True:
                while events:
                    peer, event, session = events.popleft()
                    if session is not None:
                        self.feed(peer, event, session)
                if nested or not self.deferred:
                    return
                self.deferred.popleft()()
        finally:
            self._draining = nested

    def post(self, peer: str, event: Input, session: Session) -> None:
        """Queue ``event`` and, unless a drain is running further up (which reaches it),
        drain now. If handling raises, whatever is still queued is dropped."""
        self.waiting.append((peer, event, session))
        if self._draining:
            return
        try:
            self.drain()
        except BaseException:
            self.waiting.clear()
            raise
