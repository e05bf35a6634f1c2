"""The harness's server role: demo blocks ``0..N-1`` served to every peer that connects,
through sessions built as vLLM's tier manager builds them, and a summary line at the end
(see the package docstring for the options)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import ParentManager, TransferJob
from vllm.v1.kv_offload.tiering.p2p.session import P2PSession

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.tools.vllm_peer.common import (
    STOP,
    bind_transport,
    emit,
    make_data,
    make_region,
    new_session,
    parse_blocks,
    session_kind,
    wait_for_frames,
)
from p2pfsm.tools.vllm_peer.recording import RecordingConnection, Trace


class DemoStore:
    """The server's blocks, each at its own index. ``held_back`` keys count as "not yet
    stored" for each request until ``late_after`` seconds after the server first saw that
    request (its fetch, or its lookup): every request sees the same late store, however
    many requests one server process serves. The clock is read once per server step
    (``tick``), so the keys of one lookup or fetch all see the same instant: two
    held-back keys never land on either side of their late store."""

    def __init__(self, region: np.ndarray, blocks: int, hold_back: set[int],
                 late_after: float) -> None:
        self.region = region
        self.block_len = region.shape[1]
        self.index = {demo_key(i): i for i in range(blocks)}
        self.held_back = {demo_key(i) for i in hold_back if i < blocks}
        self.late_after = late_after
        self.first_seen: dict[str, float] = {}
        self.now = time.monotonic()
        for i in range(blocks):
            self.region[i] = np.frombuffer(demo_block(i, self.block_len), dtype=np.uint8)

    def tick(self) -> None:
        """Read the clock for the step that begins."""
        self.now = time.monotonic()

    def seen(self, request: str) -> float:
        """When the server first saw ``request`` (now, the first time it is asked)."""
        return self.first_seen.setdefault(request, self.now)

    def holds(self, key: bytes) -> bool:
        return key in self.index

    def stored_for(self, key: bytes, request: str) -> bool:
        """Whether ``key`` counts as stored for ``request`` now."""
        if key not in self.index:
            return False
        return key not in self.held_back or self.now >= self.seen(request) + self.late_after


class StandInParent(ParentManager):  # type: ignore[misc]
    """The tiering manager as the server role sees it during serve_external_requests."""

    def __init__(self, store: DemoStore, server: Server) -> None:
        self.store = store
        self.server = server

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self.server.note("parent.on_new_request", req_id=req_context.req_id)
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self.store.stored_for(key, req_context.req_id):
            result = LookupResult.HIT
        elif self.store.holds(key):
            result = LookupResult.HIT_PENDING
        else:
            result = LookupResult.MISS
        self.server.lookup_results[result.name] = self.server.lookup_results.get(result.name,
                                                                                 0) + 1
        return result

    def create_store_job(self, keys: Any, req_context: ReqContext) -> TransferJob:
        keys = list(keys)
        job = self.server.new_job()
        idxs = [self.store.index[k] for k in keys]
        self.server.note("parent.create_store_job", req_id=req_context.req_id, job_id=job,
                         blocks=idxs)
        return TransferJob(job_id=job, keys=keys, chunk_ids=np.array(idxs, dtype=np.int64),
                           is_promotion=False, req_context=req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.server.note("parent.on_request_finished", req_id=req_context.req_id)

class Server:
    """One server process: its region, transports, sessions and what it records."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.config = json.loads(args.config_json) if args.config_json else None
        self.region = make_region(args.blocks, args.block_len)
        self.store = DemoStore(self.region, args.blocks, set(parse_blocks(args.hold_back)),
                               args.late_after)
        self.transport, self.local_id = bind_transport(args.port)
        self.data = make_data(self.region, self.config)
        self.parent = StandInParent(self.store, self)
        self.sessions: dict[str, tuple[P2PSession, RecordingConnection, Trace]] = {}
        self.ended: list[dict[str, Any]] = []
        # (peer, kv_request_id) -> fetch time, keys still waiting for a late store, finished?
        self.demands: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.lookup_results: dict[str, int] = {}
        self.store_results: list[dict[str, Any]] = []
        self.job = 0
        self.t0 = time.monotonic()

    def new_job(self) -> int:
        self.job += 1
        return self.job

    def note(self, what: str, **fields: Any) -> None:
        self.events.append({"event": what, "t_ms": round((time.monotonic() - self.t0) * 1000, 1),
                            **fields})

    def run(self) -> None:
        emit("ready", peer_id=self.local_id, fingerprint=self.data.config_fingerprint,
             sessions=session_kind(),
             blocks=self.args.blocks, block_len=self.args.block_len)
        end = time.monotonic() + self.args.max_seconds
        while not STOP and time.monotonic() < end:
            self.step()
            wait_for_frames(self.transport)
        self.close()

    def step(self) -> None:
        self.store.tick()
        for conn in self.transport.poll():
            rec = RecordingConnection(conn)
            session = new_session(conn.peer_id, self.local_id, self.data, self.args.block_len,
                                 self.args.hash_seed, rec)
            trace = Trace()
            trace.observe(session)
            self.sessions[conn.peer_id] = (session, rec, trace)
            self.note("session_created", peer_id=conn.peer_id)
        for peer, (session, rec, trace) in list(self.sessions.items()):
            result = session.poll()
            trace.polled(session, result)
            for kv in result.new_fetch_ids:
                self.on_fetch(peer, session, rec, kv)
            for store in result.stores:
                self.store_results.append({"job_id": store.job_id, "success": store.success})
            session.serve_external_requests(self.parent)
            trace.observe(session)
            if not session.alive:
                self.reap(peer, session, rec, trace)
        self.late_store()
        self.finish_due()

    def on_fetch(self, peer: str, session: P2PSession, rec: RecordingConnection,
                 kv: str) -> None:
        keys = [OffloadKey(k) for k in rec.fetches.get(kv, [])]
        if not keys:
            self.note("fetch_terminal_empty", peer_id=peer, kv_request_id=kv)
            return
        if kv in rec.lookups:
            self.note("fetch_supplied_by_lookup_pins", peer_id=peer, kv_request_id=kv)
            return
        request = f"{peer}/{kv}"
        held = [k for k in keys if self.store.stored_for(k, request)]
        waiting = [k for k in keys if self.store.holds(k) and k not in held]
        if held:
            job = self.new_job()
            idxs = [self.store.index[k] for k in held]
            session.add_stored_blocks(kv, held, idxs, job)
            self.note("add_stored_blocks", kv_request_id=kv, job_id=job, blocks=idxs,
                      why="fetch")
        self.demands[(peer, kv)] = {"t": time.monotonic(), "waiting": waiting,
                                    "finished": False,
                                    "late_at": self.store.seen(request) + self.args.late_after}

    def late_store(self) -> None:
        """Each request's held-back blocks, ``--late-after`` s after the server first saw
        that request: stored now, and offered to the request waiting for them."""
        now = time.monotonic()
        for (peer, kv), demand in self.demands.items():
            entry = self.sessions.get(peer)
            if not demand["waiting"] or entry is None or now < demand["late_at"]:
                continue
            idxs = [self.store.index[k] for k in demand["waiting"]]
            self.note("late_store", blocks=idxs, kv_request_id=kv)
            job = self.new_job()
            entry[0].add_stored_blocks(kv, demand["waiting"], idxs, job)
            self.note("add_stored_blocks", kv_request_id=kv, job_id=job, blocks=idxs,
                      why="late_store")
            demand["waiting"] = []

    def finish_due(self) -> None:
        if self.args.finish_after is None:
            return
        now = time.monotonic()
        for (peer, kv), demand in self.demands.items():
            entry = self.sessions.get(peer)
            if demand["finished"] or entry is None or not kv.startswith(self.args.finish_prefix):
                continue
            if now - demand["t"] >= self.args.finish_after:
                entry[0].finish_request(kv)
                demand["finished"] = True
                self.note("finish_request", kv_request_id=kv)

    def reap(self, peer: str, session: P2PSession, rec: RecordingConnection,
             trace: Trace) -> None:
        reason = session.death_reason
        closed = session.close()
        trace.closed(closed)
        self.data.remove_remote_peer(peer)
        del self.sessions[peer]
        self.note("session_dead", peer_id=peer, reason=reason)
        self.ended.append({"peer_id": peer, "reason": reason, "frames": rec.frames,
                           "failed_stores": list(closed.failed_stores),
                           "trace": trace.report()})

    def close(self) -> None:
        for peer, (session, rec, trace) in list(self.sessions.items()):
            closed = session.close()
            trace.closed(closed)
            self.ended.append({"peer_id": peer, "reason": "server stopped",
                               "frames": rec.frames,
                               "failed_stores": list(closed.failed_stores),
                               "trace": trace.report()})
        self.sessions.clear()
        emit("summary", peers=self.ended, events=self.events, stores=self.store_results,
             lookup_results=self.lookup_results)
        self.transport.close()
        self.data.close()
