"""p2pfsm's NIXL data plane behind vLLM's ``DataTransport`` interface (0.33.0, 0.34.0).

:class:`PlaneDataTransport` has ``NixlTransport``'s constructor ``(agent_name, view,
config_fields, backends, num_threads)`` and the surface vLLM's tier manager and sessions
use: ``get_agent_metadata``, ``base_addr`` / ``num_blocks`` / ``block_len`` /
``config_fingerprint`` (vLLM's own base class computes them from the view, so a peer sees
the same values), ``add_remote_peer`` / ``add_remote_peer_async``, ``remove_remote_peer``,
``write_blocks``, ``poll``, ``cancel``, ``close``, and 0.34.0's ``poll_retired`` /
``force_release_retired`` (a removed peer's running WRITEs are retired: hidden from
``poll``, reported once by ``poll_retired`` when they end). Underneath is
:class:`~p2pfsm.executor.nixl.plane.DataPlane` over the caller's view (registered in
place, one descriptor per block, as vLLM's): the wire (NIXL metadata, a peer's
``base_addr`` / ``num_blocks`` / ``block_len``, one WRITE per batch) is vLLM's, so a
stock vLLM peer interoperates in both roles. :func:`p2pfsm.vllm.install` with
``transport="p2pfsm"`` makes vLLM's manager build it (docs/explanation/vllm.md).

What DataPlane changes for a vLLM node: a registration is refused when the metadata
describes this node's own agent, names an agent already registered under another peer id,
or advertises more than ``P2PFSM_VLLM_MAX_PEER_BLOCKS`` blocks (or a ``block_len`` other
than ours); an unloaded peer's agent, and one whose registration was refused, stays
loaded for reuse (``keep_agents``), so a flood of connects carrying one agent costs one
load; a running WRITE is never released early (``cancel(..., "immediate")`` leaves it to
end and drops its report); a peer is faulted after its first failed transfer (vLLM: three
in a row, or one decisive error).

DataPlane has no progress thread: UCX progresses inside its calls. :func:`progress_open`
(called by the full install's control transport on every poll, under the same manager
lock) runs one step for every open transport, so the passive side of a WRITE is served on
each tick of the manager; ``add_remote_peer`` and ``write_blocks`` run one each. ``poll``
runs one only when its scope (a peer id, or None) was already polled since the last step:
a tick that progresses once and then polls N peers costs one step, not N+1, and a caller
that polls without the control plane (a drain loop) still gets a fresh step on every poll
of a scope after its first, so between two polls of one scope UCX always progressed.
Importing this module imports vLLM.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from typing import Any

from vllm.v1.kv_offload.tiering.p2p.data.base import CancelMode, DataTransport, PollResult

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.nixl.memory import HostRegion
from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.vllm import guard

log = logging.getLogger("p2pfsm.vllm.data")

UCX_PARAMS = {"engine_config": "TLS=^rc_gda"}
"""vLLM 0.33.0's UCX setting (host memory only: no GPU lanes to wire up per peer)."""
KEEP_AGENTS = 64
_EMPTY = PollResult(done=(), failed=())
_open: weakref.WeakSet[PlaneDataTransport] = weakref.WeakSet()


def progress_open() -> None:
    """One UCX progress step for every open :class:`PlaneDataTransport` in the process."""
    for transport in list(_open):
        transport.progress()


class PlaneDataTransport(DataTransport):  # type: ignore[misc]
    """``NixlTransport``'s place in vLLM's tier manager, on p2pfsm's DataPlane.

    Transfer ids are this transport's own ints, never reused. Each id is reported once,
    by the first ``poll`` scoped to its peer (or an unscoped one), unless it was
    cancelled or its peer removed first.
    """

    def __init__(self, agent_name: str, view: memoryview,
                 config_fields: dict[str, Any] | None = None,
                 backends: list[str] | None = None, num_threads: int = 4) -> None:
        super().__init__(view, config_fields=config_fields)
        others = [b for b in (backends or ["UCX"]) if b != "UCX"]
        if others:
            raise ConfigError(f"PlaneDataTransport: only the UCX backend, not {others}")
        del num_threads  # DataPlane runs UCX without a thread pool
        self._plane = DataPlane(
            agent_name, self.num_blocks, self.block_len,
            memory=HostRegion(self.base_addr, self.num_blocks * self.block_len),
            max_peer_blocks=guard.config().max_num_blocks, keep_agents=KEEP_AGENTS,
            ucx_params=UCX_PARAMS)
        self._next_id = 0
        self._owner: dict[int, str] = {}  # id not yet reported -> its peer
        self._ready: dict[str, dict[int, bool]] = {}  # peer -> ended ids, in post order
        self._retired: set[int] = set()  # running ids of removed peers
        self._retired_ended: list[int] = []  # retired ids that ended since poll_retired
        self._closed = False
        self._polled: set[str | None] = set()  # scopes polled since the last progress step
        _open.add(self)

    @property
    def available(self) -> bool:
        """True while open (NixlTransport's: a NIXL agent exists)."""
        return not self._closed

    @property
    def plane(self) -> DataPlane:
        """The p2pfsm data plane underneath."""
        return self._plane

    def get_agent_metadata(self) -> bytes:
        return self._plane.metadata

    def progress(self) -> None:
        """One UCX progress step (serves a peer's WRITE into our region); logged, never
        raised, once it fails. Every scope's next ``poll`` reads its outcome."""
        if self._closed:
            return
        self._polled.clear()
        try:
            self._plane.progress()
        except TransportError as exc:
            log.warning("PlaneDataTransport: %s", exc)

    # -- peers ---------------------------------------------------------------------

    def add_remote_peer(self, peer_id: str, agent_metadata: bytes, base_addr: int,
                        num_blocks: int, block_len: int) -> None:
        """Register ``peer_id`` inline (its future, via the base class, is resolved);
        raises :class:`TransportError` for what DataPlane refuses (module docstring),
        leaving an earlier registration of ``peer_id`` as it was. A new one replaces it:
        the old one's transfers are left to end, unreported."""
        metadata = bytes(agent_metadata) if isinstance(agent_metadata, bytearray | memoryview) \
            else agent_metadata
        self._plane.add_peer(peer_id, metadata, base_addr, num_blocks, block_len)
        self._drop_reports(peer_id)
        self.progress()

    def remove_remote_peer(self, peer_id: str) -> None:
        """Forget ``peer_id``: its running WRITEs are retired (left to end, reported only
        by :meth:`poll_retired`), its agent stays loaded for reuse. Unknown ids are
        ignored."""
        if self._closed:
            return
        ended = self._ready.get(peer_id, {})
        self._retired.update(t for t, p in self._owner.items() if p == peer_id and t not in ended)
        self._drop_reports(peer_id)
        self._plane.remove_peer(peer_id)

    def poll_retired(self) -> list[int]:
        """The retired WRITEs that ended since the last call (each reported once)."""
        if self._closed:
            return []
        if self._retired:
            self.poll(None)  # collects what ended, retired ones included
        ended, self._retired_ended = self._retired_ended, []
        return ended

    def force_release_retired(self, transfer_ids: Iterable[int]) -> None:
        """Stop tracking retired WRITEs that have not ended. A running WRITE is still
        not released early (DataPlane lets it end and drops its report)."""
        for tid in transfer_ids:
            self._retired.discard(tid)

    def _drop_reports(self, peer_id: str) -> None:
        self._ready.pop(peer_id, None)
        for tid in [t for t, p in self._owner.items() if p == peer_id]:
            del self._owner[tid]

    # -- transfers -----------------------------------------------------------------

    def write_blocks(self, peer_id: str, local_idxs: list[int],
                     remote_idxs: list[int]) -> int | None:
        """One WRITE of our ``local_idxs`` into the peer's ``remote_idxs``; its id, or
        None for an unknown peer or a batch DataPlane refuses (nothing posted then)."""
        if self._closed:
            return None
        tid = self._next_id
        try:
            self._plane.write(tid, peer_id, local_idxs, remote_idxs)
        except TransportError as exc:
            log.warning("PlaneDataTransport: write_blocks to %s refused: %s", peer_id, exc)
            return None
        self._next_id += 1
        self._owner[tid] = peer_id
        self.progress()
        return tid

    def poll(self, peer_id: str | None = None) -> PollResult:
        """Ended WRITEs of ``peer_id`` (None: of every peer) since the last poll, and
        the peer's fault once a transfer to it failed. Runs a progress step only when
        this scope was polled since the last one (module docstring)."""
        if self._closed:
            return _EMPTY
        if peer_id in self._polled:
            self.progress()
        self._polled.add(peer_id)
        for tid, ok in self._plane.poll():
            if isinstance(tid, int) and (owner := self._owner.get(tid)) is not None:
                self._ready.setdefault(owner, {})[tid] = ok
            elif isinstance(tid, int) and tid in self._retired:
                self._retired.discard(tid)
                self._retired_ended.append(tid)
        if peer_id is None:
            ended = [(t, ok) for per in self._ready.values() for t, ok in per.items()]
            self._ready.clear()
        else:
            ended = list(self._ready.pop(peer_id, {}).items())
        for tid, _ in ended:
            del self._owner[tid]
        fault = None
        if peer_id is not None and self._plane.is_faulted(peer_id):
            fault = "a WRITE to the peer failed (p2pfsm DataPlane)"
        if not ended and fault is None:
            return _EMPTY
        return PollResult(done=[t for t, ok in ended if ok],
                          failed=[t for t, ok in ended if not ok], peer_fault=fault)

    def cancel(self, transfer_ids: Iterable[int], mode: CancelMode = "immediate") -> list[int]:
        """Abandon the transfers: an ended one is released and never reported. A running
        one is left to end (releasing it would not stop the bytes): ``"wait"`` returns
        its id for the caller to poll, ``"immediate"`` drops its report."""
        if self._closed:
            return []
        still: list[int] = []
        for tid in transfer_ids:
            owner = self._owner.get(tid)
            if owner is None:
                continue
            ready = self._ready.get(owner, {})
            if tid in ready or self._plane.cancel(tid):
                ready.pop(tid, None)
                del self._owner[tid]
            elif mode == "wait":
                still.append(tid)
            else:
                del self._owner[tid]
        return still

    def close(self) -> None:
        """Release every transfer and peer and deregister the view (never freed).
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        _open.discard(self)
        self._owner.clear()
        self._ready.clear()
        self._retired.clear()
        self._retired_ended.clear()
        self._plane.close()
