"""What vLLM's tier manager reads off a session, for vLLM's sessions and p2pfsm's.

Run by ``test_vllm_adapter.py::test_session_surface`` with a vLLM venv's Python: every
case runs once per session class (argv: ``vllm``, ``p2pfsm`` or both, comma-separated:
one process, one vLLM import) on vLLM's real ``ZmqTransport`` and ``NixlTransport``, and
prints one JSON line per class of what the manager would see. The peer, where a case has
one, is always vLLM's own session on a transport of its own in this process, driven by
the same loop.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import ParentManager, TransferJob
from vllm.v1.kv_offload.tiering.p2p.session import P2PSession as Stock
from vllm.v1.kv_offload.tiering.p2p.session import client as stock_client
from vllm.v1.kv_offload.tiering.p2p.session import session as stock_session

from p2pfsm.tools.vllm_peer import patches
from p2pfsm.tools.vllm_peer.common import bind_transport, make_data, make_region
from p2pfsm.vllm.session import P2PSession as Adapter

BLOCK_LEN, BLOCKS, SEED = 4096, 8, "surface-seed"
BOUND_S = 30.0  # every wait below ends on its event; this only bounds a broken run
RETAINS = "retained" in stock_session.SessionCloseResult._fields  # 0.34.0's close result


class Holding(ParentManager):  # type: ignore[misc]
    """A tier manager that has not decided yet: every key it is asked about is pending."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def on_new_request(self, req_context: ReqContext) -> None:
        self.asked.append(req_context.req_id)

    def lookup(self, key: bytes, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT_PENDING

    def create_store_job(self, keys: Any, req_context: ReqContext) -> Any:
        raise AssertionError("nothing is a hit here")

    def on_request_finished(self, req_context: ReqContext) -> None:
        pass


def close_result(session: Any) -> dict[str, Any]:
    closed = session.close()
    return {"failed_jobs": sorted(closed.failed_jobs),
            "failed_req_ids": sorted(closed.failed_req_ids),
            "failed_stores": sorted(closed.failed_stores),
            "failed_serves": len(closed.failed_serves),
            **({"retained": {str(t): sorted(j) for t, j in closed.retained.items()}}
               if RETAINS else {})}


class Pair:
    """Our session (of the class under test) to a stock vLLM peer, over vLLM's real
    transports, and :meth:`pump`, one turn of everything."""

    def __init__(self, theirs: Any, their_id: str, their_data: Any) -> None:
        self.theirs, self.their_id, self.their_data = theirs, their_id, their_data
        self.peers: dict[str, Any] = {}
        self.session: Any = None

    def pump(self, ours: Any, parent: Any = None) -> Any:
        """Both transports polled, the peer's sessions (made as connections come) polled
        and, given a ``parent``, serving it; then our session's poll result."""
        ours.poll()
        for conn in self.theirs.poll():
            self.peers[conn.peer_id] = Stock(conn.peer_id, self.their_id, self.their_data,
                                             BLOCK_LEN, SEED, conn)
        for peer in self.peers.values():
            peer.poll()
            if parent is not None:
                peer.serve_external_requests(parent)
        return self.session.poll()


@contextlib.contextmanager
def paired(cls: type) -> Iterator[tuple[Pair, Any]]:
    """A :class:`Pair` and our transport; everything closed on the way out."""
    ours, our_id = bind_transport()
    theirs, their_id = bind_transport()
    our_data = make_data(make_region(BLOCKS, BLOCK_LEN), None)
    their_data = make_data(make_region(BLOCKS, BLOCK_LEN), None)
    pair = Pair(theirs, their_id, their_data)
    try:
        pair.session = cls(their_id, our_id, our_data, BLOCK_LEN, SEED, ours.connect(their_id))
        yield pair, ours
    finally:
        for peer in pair.peers.values():
            peer.close()
        ours.close()
        theirs.close()
        our_data.close()
        their_data.close()


def never_connected(cls: type) -> dict[str, Any]:
    """A session the manager built with ``conn=None`` and gave work, then closed."""
    data = make_data(make_region(BLOCKS, BLOCK_LEN), None)
    try:
        s = cls("127.0.0.1:9", "127.0.0.1:8", data, BLOCK_LEN, SEED, None)
        s.add_stored_blocks("r-store", [b"k0", b"k1"], [0, 1], 7)
        s.request_blocks(8, "r-load", [b"k2"], [2])
        probe = s.register_lookup("r-probe", b"k3")
        s.flush_pending_lookups()
        seen = {"probe": probe, "alive": s.alive, "connected": s.connected, "ready": s.ready,
                "inflight": list(s._server._inflight)}  # the manager's shutdown() reads it
        return {**seen, **close_result(s)}
    finally:
        data.close()


def lookup_in_flight(cls: type, reset: bool = False) -> dict[str, Any]:
    """A ready session with a lookup the peer is still answering, and a load, at close().
    With ``reset`` (0.34.0's manager: a cache reset), ``abort_loads()`` first: the load's
    result, its deferred release, and ``has_pending_work`` until the peer's ack."""
    parent = Holding()
    with paired(cls) as (pair, ours):
        s = pair.session

        def step() -> None:
            pair.pump(ours, parent)

        end = time.monotonic() + BOUND_S
        while not s.ready and time.monotonic() < end:
            step()
        ready = s.ready
        probe = s.register_lookup("r-probe", b"k3")
        s.flush_pending_lookups()
        while not parent.asked and time.monotonic() < end:
            step()
        s.request_blocks(9, "r-load", [b"k4"], [4])
        step()
        seen = {"ready": ready, "peer_asked": len(parent.asked), "probe": probe,
                "probe_again": s.register_lookup("r-probe", b"k3"),
                "inflight": list(s._server._inflight)}
        if reset:
            s.abort_loads()
            loads = list(s.poll().loads)
            pending = s.has_pending_work
            while loads and not loads[0].deferred_release.is_set() and time.monotonic() < end:
                step()
            seen.update(reset_loads=[(r.job_id, r.kv_request_id, r.success,
                                      r.request_finished) for r in loads],
                        pending_before_ack=pending,
                        released=bool(loads) and loads[0].deferred_release.is_set(),
                        pending_after_ack=s.has_pending_work,
                        drained=[list(x) for x in s.drain_stores()])
        return {**seen, **close_result(s)}


def peer_left(cls: type) -> dict[str, Any]:
    """A ready session with a load in flight whose peer closes its session (its
    disconnect, then its connection's end): the load comes back from close(), never from
    a poll, and its request is failed there."""
    with paired(cls) as (pair, ours):
        s = pair.session
        end = time.monotonic() + BOUND_S
        loads: list[Any] = []

        def step() -> None:
            loads.extend(pair.pump(ours).loads)

        while not s.ready and time.monotonic() < end:
            step()
        ready = s.ready
        s.request_blocks(9, "r-left", [b"k6"], [6])
        step()
        for peer in pair.peers.values():
            peer.close()  # its disconnect frame, then its connection closes
        pair.peers.clear()
        while s.alive and time.monotonic() < end:
            step()
        return {"ready": ready, "alive": s.alive,
                "loads": [(r.job_id, r.kv_request_id, r.success) for r in loads],
                **close_result(s)}


class Hitting(Holding):
    """A tier manager that holds every key it is asked about (block 0 pinned for it)."""

    def lookup(self, key: bytes, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT

    def create_store_job(self, keys: Any, req_context: ReqContext) -> Any:
        keys = list(keys)
        return TransferJob(job_id=70, keys=keys, chunk_ids=np.zeros(len(keys), np.int64),
                           is_promotion=False, req_context=req_context)


def ack_lost(cls: type, probed: bool = False) -> dict[str, Any]:
    """A load to a peer that stops answering (0.34.0: the load deadline and a missing
    abort_ack are the release's profile, each shortened here): the load fails at its
    abort's sending with its release deferred, the abort_ack deadline ends the session,
    close() releases the destination. ``probed``: the request ran a lookup the peer
    answered first, so only the symmetric P2P load deadline is short (the PD one outlasts
    the run)."""
    patches.set_client_timeouts(0.2, 0.2)  # read when the session is built (the adapter)
    if probed:  # (undo() restores it: set_client_timeouts kept the original)
        stock_client._PD_LOAD_TIMEOUT_S = 2 * BOUND_S
    try:
        with paired(cls) as (pair, ours):
            s = pair.session
            end = time.monotonic() + BOUND_S
            while not s.ready and time.monotonic() < end:
                pair.pump(ours)
            ready, hit = s.ready, None
            if probed:
                s.register_lookup("r-ack", b"k5")
                s.flush_pending_lookups()
                while hit is None and time.monotonic() < end:
                    pair.pump(ours, Hitting())
                    hit = s.register_lookup("r-ack", b"k5")
            s.request_blocks(9, "r-ack", [b"k5"], [5])  # the peer is never polled again
            loads: list[Any] = []
            while not loads and time.monotonic() < end:
                loads = list(s.poll().loads)
            released_at_report = bool(loads) and loads[0].deferred_release.is_set()
            while s.alive and time.monotonic() < end:
                ours.poll()
                s.poll()
            seen = {"ready": ready, "hit": hit, "alive": s.alive,
                    "death_reason": s.death_reason, "fault": s.data_plane_fault,
                    "pending": s.has_pending_work,
                    "loads": [(r.job_id, r.kv_request_id, r.success, r.request_finished)
                              for r in loads], "released_at_report": released_at_report}
            closed = close_result(s)
            seen["released_at_close"] = bool(loads) and loads[0].deferred_release.is_set()
            return {**seen, **closed}
    finally:
        patches.undo()  # the timeouts as they were (and vLLM's close: apply it again)
        patches.apply()

CASES = {"never_connected": never_connected, "lookup_in_flight": lookup_in_flight,
         "peer_left": peer_left}
if hasattr(Stock, "abort_loads"):  # 0.34.0's manager resets caches through the sessions
    CASES["reset"] = lambda cls: lookup_in_flight(cls, reset=True)
    CASES["ack_lost"] = ack_lost  # (0.33.0 gives up on the load; the adapter re-sends)
    CASES["probed_ack_lost"] = lambda cls: ack_lost(cls, probed=True)


def main() -> None:
    patches.apply()  # as the harness does: vLLM's close stops its monitor first
    for kind in sys.argv[1].split(","):
        cls = {"vllm": Stock, "p2pfsm": Adapter}[kind]
        print(json.dumps({"kind": kind, **{name: case(cls) for name, case in CASES.items()}}),
              flush=True)


if __name__ == "__main__":
    main()
