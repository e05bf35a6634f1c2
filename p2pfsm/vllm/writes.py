"""Our WRITEs on vLLM's data transport (a part of ``P2PSession``).

The Session's ``StartWrite`` posts a WRITE on vLLM's ``DataTransport`` and its
``CancelWrite`` cancels one (in ``wait`` mode: a pin is released only once its WRITE
stopped reading our blocks); each poll of the transport ends the WRITEs it reports done
or failed with the Session's ``WriteFinished``. The transport's peer fault, and a WRITE
older than the release's stall timeout, end the session once no WRITE is left running
(or at once, for a stall), as vLLM's session escalates them: the peer is told
(``disconnect``), and the death reason is ``data plane: <fault>``.
"""

from __future__ import annotations

import time
from typing import Any

from p2pfsm.session import CancelWrite, HostClose, Input, Session, StartWrite, WriteFinished
from p2pfsm.vllm.surface import stalled
from p2pfsm.vllm.withdrawn import Withdrawn


class Writes:
    """The WRITEs of one session: posted, polled, cancelled, stalled."""

    peer_id: str
    _transport: Any
    _session: Session
    _conn: Any
    _fault: str | None  # the transport's peer fault (or a stall), once it reports one
    _death_reason: str | None
    _stall_s: float | None
    _stalled: bool
    _withdrawn: Withdrawn
    _writes: dict[int, int]  # session xfer -> transport transfer id
    _by_tid: dict[int, int]  # transport transfer id -> session xfer
    _write_at: dict[int, float]  # session xfer -> when it was posted

    def _feed(self, event: Input) -> None:
        raise NotImplementedError  # the session's

    def _queue(self, event: Input) -> None:
        raise NotImplementedError  # the session's

    def _write_jobs(self) -> dict[int, frozenset[int]]:
        """Each running write -> the store jobs whose pins it reads."""
        writes = self._session.server.writes
        return {xfer: frozenset(writes[xfer].jobs) for xfer in self._writes if xfer in writes}

    def _poll_writes(self) -> None:
        # The peer's scope is polled on every poll(), as vLLM's session does: a transport
        # may judge a peer faulty with nothing in flight to it. A WRITE is reported done
        # only here, never in the call that posted it (as vLLM's session).
        if self._writes or (self._fault is None and self._session.alive):
            result = self._transport.poll(self.peer_id)
            if result.peer_fault is not None and self._fault is None:
                self._fault = str(result.peer_fault)
            for tid in result.done:
                self._finish_tid(int(tid), True)
            for tid in result.failed:
                self._finish_tid(int(tid), False)
            self._check_stall()
        conn = self._conn
        if (self._fault is not None and (not self._writes or self._stalled)
                and self._session.alive
                and conn is not None and conn.alive):  # as vLLM: a dead conn says so itself
            # As vLLM's: the peer is told (disconnect); the control connection is fine.
            self._death_reason = self._death_reason or f"data plane: {self._fault}"
            self._feed(HostClose())

    def _check_stall(self) -> None:
        """A write older than the release's stall timeout is a peer fault that ends the
        session at once (waiting for it buys nothing; close() retains it)."""
        if self._fault is None:
            self._fault = stalled(self._write_at.values(), self._stall_s, time.monotonic())
            self._stalled = self._fault is not None

    def _finish_tid(self, tid: int, ok: bool) -> None:
        xfer = self._by_tid.get(tid)
        if xfer is not None:
            self._finish_write(xfer, ok)

    def _finish_write(self, xfer: int, ok: bool) -> None:
        tid = self._writes.pop(xfer)
        del self._by_tid[tid]
        self._write_at.pop(xfer, None)
        self._feed(WriteFinished(xfer, ok))

    # the Session's outputs (Executor methods)
    def start_write(self, peer: str, out: StartWrite) -> None:
        if self._fault is not None or self._withdrawn.refuses(self._session, out.xfer):
            # the transport judged the peer unusable, or a reset withdrew the blocks
            self._queue(WriteFinished(out.xfer, False))
            return
        tid = self._transport.write_blocks(self.peer_id, list(out.local_indexes),
                                           list(out.remote_indexes))
        if tid is None:
            self._queue(WriteFinished(out.xfer, False))
            return
        self._writes[out.xfer] = int(tid)
        self._by_tid[int(tid)] = out.xfer
        self._write_at[out.xfer] = time.monotonic()

    def cancel_write(self, peer: str, out: CancelWrite) -> None:
        tid = self._writes.get(out.xfer)
        if tid is None:
            return
        still = self._transport.cancel([tid], mode="wait")
        if tid not in still:  # stopped: it reads our blocks no more
            del self._writes[out.xfer]
            del self._by_tid[tid]
            self._write_at.pop(out.xfer, None)
            self._queue(WriteFinished(out.xfer, False))
