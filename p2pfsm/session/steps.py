"""How the session drives its children (load rounds, lookups, serve rounds, served lookups).

A child never calls into the session. One *step* of a child is:

1. fire: the child's machine takes one declared transition; its actions append to the
   outbox (:mod:`~p2pfsm.session.child`). Should an action raise, the dispatcher puts
   the child and the outbox back as they were, and nothing has reached the session.
2. apply: the session carries out the outbox in order (frames sent or queued, timers
   armed and disarmed, results and writes output, lookup hits pinned as a round's
   supply, which is itself a step of that round); what belongs to a part's tables
   (write ids, store jobs, pins, bound rounds) is handed to that part.
3. retire: a child whose new state is terminal in its model (``terminal = [...]`` in
   ``models/``) is dropped from its part's tables; nothing else retires a child.
4. cascade: the session then fires its state-triggered transitions (the models'
   ``settle``) until nothing more fires, in one loop (:func:`run_cascade`); which steps
   call for a cascade is the producer's rule (``ServerPart.note``).

The session (:class:`~p2pfsm.session.core.Session`) does all four; this module holds
the cascade's loop and its bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from p2pfsm.errors import P2PFSMError

CASCADE_LIMIT = 100_000
"""Most state-triggered steps one input may cause; more is a bug in the models."""

Item = TypeVar("Item")


class CascadeDiverged(P2PFSMError):
    """The cascade of state-triggered transitions did not reach a fixed point."""


def run_cascade(due: list[Item], settle_one: Callable[[Item], None]) -> None:
    """Settle the oldest due item until none is due (a fixed point); ``settle_one``
    may append to ``due``.

    Raises:
        CascadeDiverged: still not settled after :data:`CASCADE_LIMIT` steps.
    """
    for _ in range(CASCADE_LIMIT):
        if not due:
            return
        settle_one(due.pop(0))
    raise CascadeDiverged(f"no fixed point after {CASCADE_LIMIT} state-triggered steps; "
                          f"still due: {due[:5]!r}")
