"""The WRITEs a data plane runs, from post to report: the one table of writes in flight.

Each WRITE is named by its caller's own id (:data:`WriteId`): the node's is its
:class:`~p2pfsm.executor.node.writes.Write` (the session, the session's ``xfer``, the peer and
the bytes), so nothing else keeps a table of them. A WRITE is in flight while NIXL holds
its handle, then done (ended, released) until :meth:`Transfers.poll` reports it, once,
in the order WRITEs were posted. A running WRITE is never released early: releasing it
does not stop bytes already handed to the transport.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias

from p2pfsm.errors import TransportError
from p2pfsm.executor.nixl.layout import Layout
from p2pfsm.executor.nixl.pace import ProgressPace

WriteId: TypeAlias = Hashable
"""The caller's name for one WRITE (the node's: its :class:`~p2pfsm.executor.node.writes.Write`)."""


@dataclass(eq=False)
class NixlPeer:
    """A peer registered with the data plane: its agent and its prepped block-slices."""

    peer_id: str
    agent_name: str
    metadata: bytes  # its agent's NIXL metadata, as the peer announced it
    layout: Layout
    dlist: Any  # nixl_prepped_dlist_handle of the peer's block-slices
    faulted: bool = False
    removed: bool = False  # forgotten; dlist released once its last transfer ends


@dataclass(eq=False)
class _Xfer:
    write_id: WriteId
    posted: int  # this plane's count of WRITEs posted: poll reports in this order
    peer: NixlPeer
    handle: Any  # nixl_xfer_handle
    outcome: bool | None = None  # set once terminal; reported when the handle is released
    abandoned: bool = False  # the caller stopped waiting for it: never reported


class Transfers:
    """A data plane's WRITEs by the caller's id (see the module docstring).

    Args:
        pace: the plane's progress pace (told of each WRITE posted).
        retire_peer: called when the last transfer of a removed peer is released.
    """

    def __init__(self, pace: ProgressPace, retire_peer: Callable[[NixlPeer], None]) -> None:
        self._pace = pace
        self._retire_peer = retire_peer
        self.inflight: dict[WriteId, _Xfer] = {}
        self.done: dict[WriteId, _Xfer] = {}  # ended and released, not yet reported
        self._posted = itertools.count()
        self._abandoned = 0  # abandoned WRITEs still in the two tables

    def __len__(self) -> int:
        """How many WRITEs are not reported yet (nor abandoned)."""
        return len(self.inflight) + len(self.done) - self._abandoned

    @property
    def in_flight(self) -> int:
        """Transfers whose NIXL handle is still held (posted, or awaiting release)."""
        return len(self.inflight)

    def unreported(self) -> list[WriteId]:
        """The WRITEs not reported yet (running, or ended and not polled), in the order
        they were posted."""
        xfers = [x for x in (*self.inflight.values(), *self.done.values())
                 if not x.abandoned]
        return [x.write_id for x in sorted(xfers, key=operator.attrgetter("posted"))]

    def holds(self, write_id: WriteId) -> bool:
        """``write_id`` names a WRITE not reported yet (nor abandoned)."""
        xfer = self.inflight.get(write_id) or self.done.get(write_id)
        return xfer is not None and not xfer.abandoned

    def check_free(self, write_id: WriteId) -> None:
        """Refuse (TransportError) an id that is unhashable or names a WRITE not yet
        reported."""
        try:
            taken = write_id in self.inflight or write_id in self.done
        except TypeError:
            raise TransportError(f"write id {write_id!r} is not hashable") from None
        if taken:
            raise TransportError(f"write id {write_id!r} names a WRITE not yet reported")

    def post(self, agent: Any, write_id: WriteId, peer: NixlPeer, local: Any,
             local_descs: Any, remote_descs: Any) -> None:
        """Post one prepped WRITE; a post that fails is reported failed by :meth:`poll`."""
        xfer = _Xfer(write_id, next(self._posted), peer, None)
        try:
            xfer.handle = agent.make_prepped_xfer("WRITE", local, local_descs, peer.dlist,
                                                  remote_descs)
            state = agent.transfer(xfer.handle)
        except Exception:
            state = "ERR"
        if xfer.handle is None:
            peer.faulted = True
            xfer.outcome = False
            self.done[write_id] = xfer
            return
        self.inflight[write_id] = xfer
        if state != "PROC":
            self._settle(xfer, state)
        else:
            self._pace.posted()

    def poll(self, agent: Any) -> list[tuple[WriteId, bool]]:
        """Finished transfers as ``(write id, ok)``, each reported once, in the order
        they were posted."""
        for xfer in list(self.inflight.values()):
            self._advance(agent, xfer)
        if not self.done:
            return []
        done, self.done = self.done, {}
        out = [(x.write_id, bool(x.outcome))
               for x in sorted(done.values(), key=operator.attrgetter("posted"))
               if not x.abandoned]
        self._abandoned -= len(done) - len(out)
        return out

    def cancel(self, agent: Any, write_id: WriteId) -> bool:
        """``DataPlane.cancel``: True when the WRITE is over and released (or unknown),
        False while it runs."""
        ended = self.done.pop(write_id, None)
        if ended is not None:
            self._abandoned -= ended.abandoned
            return True
        xfer = self.inflight.get(write_id)
        if xfer is None:
            return True
        if xfer.outcome is None:
            state = _state(agent, xfer)
            if state == "PROC":
                return False
            xfer.outcome = state == "DONE"
        if _release(xfer):
            del self.inflight[write_id]
            self._abandoned -= xfer.abandoned
            return True
        return False

    def abandon(self, write_id: WriteId) -> None:
        """Stop reporting ``write_id``: one that ended is forgotten, one still running is
        left to end (released then, or at :meth:`close`)."""
        ended = self.done.pop(write_id, None)
        if ended is not None:
            self._abandoned -= ended.abandoned
            return
        xfer = self.inflight.get(write_id)
        if xfer is not None and not xfer.abandoned:
            xfer.abandoned = True
            self._abandoned += 1

    def advance_peer(self, agent: Any, peer: NixlPeer) -> None:
        """Settle or release what of ``peer``'s transfers has ended."""
        for xfer in [x for x in self.inflight.values() if x.peer is peer]:
            self._advance(agent, xfer)

    def runs_for(self, peer: NixlPeer) -> bool:
        """A transfer of ``peer`` still holds its handle."""
        return any(x.peer is peer for x in self.inflight.values())

    def agent_names(self) -> Iterator[str]:
        """The agents of the peers transfers still run to."""
        return (x.peer.agent_name for x in self.inflight.values())

    def close(self) -> list[NixlPeer]:
        """Release every transfer; the removed peers they held (their descriptors are
        the caller's to release)."""
        removed = {id(x.peer): x.peer for x in self.inflight.values() if x.peer.removed}
        for xfer in self.inflight.values():
            _release(xfer)
        self.inflight.clear()
        self.done.clear()
        self._abandoned = 0
        return list(removed.values())

    def _advance(self, agent: Any, xfer: _Xfer) -> None:
        """Settle a transfer that has ended, or retry releasing one that has; leave a
        running one running."""
        if xfer.outcome is not None:
            self._try_retire(xfer)
            return
        state = _state(agent, xfer)
        if state != "PROC":
            self._settle(xfer, state)

    def _settle(self, xfer: _Xfer, state: str) -> None:
        """Record a terminal state and report the transfer if its handle releases."""
        xfer.outcome = state == "DONE"
        if not xfer.outcome:
            xfer.peer.faulted = True
        self._try_retire(xfer)

    def _try_retire(self, xfer: _Xfer) -> None:
        if _release(xfer):
            del self.inflight[xfer.write_id]
            self.done[xfer.write_id] = xfer
            if xfer.peer.removed:
                self._retire_peer(xfer.peer)


def _state(agent: Any, xfer: _Xfer) -> str:
    """NIXL's state of a running transfer: "PROC", "DONE" or "ERR" (also when asking
    fails)."""
    try:
        return str(agent.check_xfer_state(xfer.handle))
    except Exception:
        return "ERR"


def _release(xfer: _Xfer) -> bool:
    try:
        xfer.handle.release()
    except Exception:
        return False
    return True
