"""The sans-IO peer session: one object per peer, both roles, one entry point.

Theory of operation. :meth:`Session.handle` takes one input event and the current
time and returns the outputs it caused, in order. Nothing here touches a socket,
a clock, a thread or NIXL: the executor (real or simulated) turns outputs into
effects and feeds back the resulting events.

Every state change is a transition declared in ``models/``: the session machine
(handshake, gating, death, close) and one machine per load round, lookup, serve
round and served lookup (the session's children). A child never calls into the
session: its actions append to an outbox the session applies once the step has
committed; a child whose machine reaches a terminal state is retired; the models'
state-triggered ``settle`` transitions then run in one loop to a fixed point
(:mod:`~p2pfsm.session.steps`). Frames are decoded and validated completely before any
machine fires; a frame that is malformed, or that no declared transition accepts
in the current state, is rejected with a ProtocolViolation output and changes
nothing. Host misuse raises LocalProtocolError and changes nothing.

The parts live one job per module: :mod:`~p2pfsm.session.base` (state, output helpers,
host-call checks), :mod:`~p2pfsm.session.machine` (the session machine),
:mod:`~p2pfsm.session.child` (what children may produce), :mod:`~p2pfsm.session.steps`
(fire, apply, retire, cascade),
:mod:`~p2pfsm.session.consumer` and :mod:`~p2pfsm.session.producer` (the two roles),
:mod:`~p2pfsm.session.dispatch` (which machine each input reaches); this module
assembles them behind one entry point.
"""

from __future__ import annotations

from p2pfsm.errors import LocalProtocolError
from p2pfsm.session.base import LIVE_STATES
from p2pfsm.session.dispatch import HANDLERS, InputDispatch
from p2pfsm.session.inputs import Input
from p2pfsm.session.machine import SESSION
from p2pfsm.session.outputs import Output

__all__ = ["LIVE_STATES", "SESSION", "Session"]


class Session(InputDispatch):
    """A peer session (both roles) driven only by its declared machines.

    Args:
        config: our identity, layout and deadlines.
        tracer: when given, records every fired transition.
    """

    def handle(self, event: Input, now: float) -> list[Output]:
        """Consume one event at time ``now``; return the outputs it caused, in order.

        Raises:
            LocalProtocolError: the host call is not allowed now or is malformed;
                the session is unchanged.
        """
        self.now = now
        self._round_floor.purge(now)
        self._expired_lookups.purge(now)
        self._finished.purge(now)
        self._peer_finished.purge(now)
        handler = HANDLERS.get(type(event))
        if handler is None:
            raise LocalProtocolError(f"unknown input {type(event).__name__}")
        try:
            handler(self, event)
        except LocalProtocolError:
            self._out.clear()
            self._env.outbox.clear()
            raise
        out, self._out = self._out, []
        return out
