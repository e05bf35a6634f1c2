"""How the session drives its children (load rounds, lookups, serve rounds, served lookups).

A child never calls into the session. One *step* of a child is:

1. fire: the child's machine takes one declared transition; its actions append to the
   outbox (:mod:`~p2pfsm.session.child`). Should an action raise, the dispatcher puts
   the child and the outbox back as they were, and nothing has reached the session.
2. apply: the session carries out the outbox in order (frames sent or queued, timers
   armed and disarmed, results and writes output, lookup hits pinned as a round's
   supply, which is itself a step of that round).
3. retire: a child whose new state is terminal in its model (``terminal = [...]`` in
   ``models/``) is dropped from the session's maps; nothing else retires a child.
4. cascade: the session then fires its state-triggered transitions (the models'
   ``settle``) until nothing more fires, in one loop (:meth:`ChildSteps._cascade`);
   which steps call for a cascade is the role's rule (``ProducerRole._note``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from p2pfsm.errors import P2PFSMError
from p2pfsm.fsm import CompiledMachine
from p2pfsm.session.child import (
    Arm,
    BindRound,
    Disarm,
    EndRoles,
    ExpireLookupRound,
    HoldJob,
    PinHits,
    Send,
)
from p2pfsm.session.machine import SessionMachine
from p2pfsm.session.outputs import StartWrite

CASCADE_LIMIT = 100_000
"""Most state-triggered steps one input may cause; more is a bug in the models."""


class CascadeDiverged(P2PFSMError):
    """The cascade of state-triggered transitions did not reach a fixed point."""


class ChildSteps(SessionMachine):
    """Fire a child, apply its outbox, retire it, run the cascade."""

    def _step(self, m: CompiledMachine, obj: Any, trigger: str, ev: object = None) -> str:
        """One step of a child caused by an input, then the cascade; the new state."""
        dest = m.fire(obj, trigger, ev, self._committed)
        if self._unsettled:
            self._cascade()
        return dest

    def _fire(self, m: CompiledMachine, obj: Any, trigger: str, ev: object = None) -> str:
        """Fire; once committed (:meth:`_committed`), the step is recorded."""
        return m.fire(obj, trigger, ev, self._committed)

    def _committed(self, m: CompiledMachine, obj: Any, trigger: str, dest: str) -> None:
        """Apply the outbox, retire the child if terminal, note what must cascade.

        Runs before the dispatcher records the step, so steps it causes (a lookup's hits
        pinned into a round) are recorded first, nested in it."""
        if self._env.outbox:
            self._apply_outbox(obj)
        if obj is self:  # the session machine itself: its owner is the host
            return
        if dest in m.spec.terminal:
            self._retire(obj)
        self._note(m, obj, trigger, dest)

    def _apply_outbox(self, obj: object) -> None:
        outbox = self._env.outbox
        todo = outbox[:]
        outbox.clear()
        for item in todo:
            kind = type(item)
            if kind is Send:  # the common requests first, without a table lookup
                self.send(item.message)  # type: ignore[union-attr]
            elif kind is Arm:
                self.arm(item.timer, item.delay, keep=item.keep)  # type: ignore[union-attr]
            elif kind is Disarm:
                self.disarm(item.timer)  # type: ignore[union-attr]
            else:
                apply = _APPLY.get(kind)
                if apply is None:
                    self._out.append(item)  # type: ignore[arg-type]  # an executor output
                else:
                    apply(self, obj, item)

    def _cascade(self) -> None:
        """Fire state-triggered transitions until none is due (a fixed point)."""
        due = self._unsettled
        for _ in range(CASCADE_LIMIT):
            if not due:
                return
            self._settle_one(due.pop(0))
        raise CascadeDiverged(f"no fixed point after {CASCADE_LIMIT} state-triggered steps; "
                              f"still due: {due[:5]!r}")

    # -------------------------------------------------- provided by the roles
    def _retire(self, obj: object) -> None:
        raise TypeError(f"no role retires a {type(obj).__name__}")

    def _note(self, m: CompiledMachine, obj: object, trigger: str, dest: str) -> None:
        """Queue in ``self._unsettled`` what the step makes due (the producer's rule)."""

    def _settle_one(self, item: object) -> None:
        raise TypeError(f"no role settles {item!r}")

    def _pin_hits(self, item: PinHits) -> None:
        raise TypeError("no role pins lookup hits")

    def _bind_round(self, rnd: object) -> None:
        raise TypeError("no role binds serve rounds")


def _start_write(s: ChildSteps, rnd: Any, out: StartWrite) -> None:
    s._writes[out.xfer] = rnd
    s._out.append(out)


def _expire(s: ChildSteps, _rnd: object, item: ExpireLookupRound) -> None:
    s._expired_lookups.put(item.kv_request_id, item.round_seq, s.now)


_APPLY: dict[type, Callable[[ChildSteps, Any, Any], None]] = {
    StartWrite: _start_write,
    HoldJob: lambda s, rnd, item: s._store_jobs.__setitem__(item.job_id, rnd),
    PinHits: lambda s, _o, item: s._pin_hits(item),
    ExpireLookupRound: _expire,
    BindRound: lambda s, rnd, _item: s._bind_round(rnd),
    EndRoles: lambda s, _o, item: s._end_roles(item.load_trigger),
}
"""Outbox item type -> how the session carries it out, beside Send, Arm and Disarm, which
:meth:`ChildSteps._apply_outbox` applies first (any other item is an executor output)."""
