"""A vLLM 0.33.0 P2P peer: vLLM's own session, ZMQ and NIXL code, driven as its tier does.

Run it as ``python -m p2pfsm.vllm.peer server|client ...`` with a Python that has vLLM
0.33.0 (``.venv-vllm``, built by ``.ci/install-vllm.sh``); the interop suite and
``p2pfsm bench --vs-vllm`` start it that way. Besides vLLM it imports only p2pfsm's shared
demo block model (``p2pfsm.demo.blocks``). It drives ``P2PSession`` directly, the way vLLM's
``P2PSecondaryTierManager`` does (``vllm/v1/kv_offload/tiering/p2p/manager.py`` in the wheel):
``poll()`` every iteration, ``add_stored_blocks`` for supply, ``request_blocks`` for
fetches, ``register_lookup`` + ``flush_pending_lookups`` for lookups, and a small
``ParentManager`` stand-in for ``serve_external_requests``.

Two roles:

``server``
    Holds demo blocks ``0..N-1`` at their own index. A fetch that names a request with no
    lookup behind it is supplied at once with the demanded blocks it holds (vLLM's manager
    replays parked stores on ``new_fetch_ids``). Options shape the PD flows:
    ``--hold-back 4,5`` keeps those blocks "not yet stored" until ``--late-after`` seconds
    after the first request arrives, then stores them (a lookup sees them as
    HIT_PENDING until then; a waiting fetch is supplied then); ``--finish-after S`` calls
    ``finish_request`` on each fetched request ``S`` seconds after its fetch.
    Prints one ``ready`` line when it accepts peers, and a ``summary`` line (every control
    frame it saw or sent, per peer, and its store results) when it stops: on SIGTERM or
    SIGINT, or after ``--max-seconds``.

``client``
    Connects to ``--connect HOST:PORT``, fetches ``--keys`` (``pd``: directly; ``sym``:
    lookup first, then fetch the hits, then ``finish_request``), verifies every byte it
    received against the block model, and prints one ``result`` line. ``--load-timeout``
    patches vLLM's ``_LOAD_TIMEOUT_S`` (the capture harness did the same with 3 s).

``--adapter`` (either role) calls :func:`p2pfsm.vllm.install` first, so the same driver
runs p2pfsm's sessions behind vLLM's interface; the peer builds each session through the
name vLLM's tier manager uses, so it gets whichever class the manager would.

Every line meant for the test starts with ``P2PINTEROP `` followed by one JSON object;
vLLM's own logging goes to stderr. Loopback only; every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

# vLLM reads these when it is first imported: keep its logs off stdout.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import numpy as np
import zmq
from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import ParentManager, TransferJob
from vllm.v1.kv_offload.tiering.p2p.control.base import ControlConnection
from vllm.v1.kv_offload.tiering.p2p.control.zmq import ZmqTransport
from vllm.v1.kv_offload.tiering.p2p.data.nixl import NixlTransport
from vllm.v1.kv_offload.tiering.p2p.session import P2PSession
from vllm.v1.kv_offload.tiering.p2p.session import client as vllm_client

from p2pfsm.demo.blocks import demo_block, demo_key
from p2pfsm.vllm.switch import current

MARK = "P2PINTEROP "
HOST = "127.0.0.1"
TICK_S = 0.001
_STOP = False


def wait_for_frames(transport: ZmqTransport) -> None:
    """Block until a frame reaches vLLM's ROUTER, or TICK_S at most: NIXL completions and
    vLLM's timers have nothing to wait on, so they are looked at every tick."""
    transport._router.poll(max(1, round(TICK_S * 1000)), zmq.POLLIN)


def new_session(*args: Any) -> P2PSession:
    """A session of the class vLLM's tier manager would build now: vLLM's own, or
    p2pfsm's once ``--adapter`` ran :func:`p2pfsm.vllm.install`."""
    return current()(*args)


def session_kind() -> str:
    return "vllm" if current() is P2PSession else "p2pfsm"


def emit(kind: str, **fields: Any) -> None:
    print(MARK + json.dumps({"kind": kind, **fields}, sort_keys=True), flush=True)


def _on_signal(_sig: int, _frame: object) -> None:
    global _STOP
    _STOP = True


def parse_blocks(text: str) -> list[int]:
    """``"0-7"`` or ``"0-3,9999"`` -> block numbers; ``""`` -> []."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def bind_transport() -> tuple[ZmqTransport, str]:
    """A ZmqTransport on a free loopback port; local_id is that exact "host:port"."""
    for _ in range(20):
        port = free_port()
        local_id = f"{HOST}:{port}"
        try:
            return ZmqTransport(local_id, HOST, port), local_id
        except zmq.ZMQError:
            continue
    raise RuntimeError("no free loopback port for the ROUTER")


def make_region(num_blocks: int, block_len: int) -> np.ndarray:
    return np.zeros((num_blocks, block_len), dtype=np.uint8)


def make_data(region: np.ndarray, config: dict[str, Any] | None) -> NixlTransport:
    data = NixlTransport(f"vllm-interop-{uuid.uuid4().hex[:12]}", memoryview(region.data),
                         config_fields=config)
    if not data.available:
        raise RuntimeError("vLLM found no NIXL (pip install --no-deps nixl==1.5.1 nixl-cu12)")
    return data


def summarize(msg: Any) -> dict[str, Any]:
    """One control frame, as the test wants to see it (no NIXL blob, no key bytes)."""
    if not isinstance(msg, dict):
        return {"type": repr(msg)}
    out: dict[str, Any] = {"type": msg.get("type")}
    for name in ("kv_request_id", "round_seq", "success", "hits", "block_len",
                 "config_fingerprint", "hash_seed"):
        if name in msg:
            out[name] = msg[name]
    keys = msg.get("keys")
    if isinstance(keys, list):
        out["nkeys"] = len(keys)
    return out


class RecordingConnection(ControlConnection):  # type: ignore[misc]
    """Wraps vLLM's ZmqConnection and records every frame the session receives or sends."""

    def __init__(self, inner: ControlConnection) -> None:
        super().__init__(inner.peer_id)
        self.inner = inner
        self.frames: list[dict[str, Any]] = []
        self.fetches: dict[str, list[bytes]] = {}
        self.lookups: set[str] = set()
        self.t0 = time.monotonic()

    def _note(self, way: str, msg: Any) -> None:
        entry = summarize(msg)
        entry["dir"] = way
        entry["t_ms"] = round((time.monotonic() - self.t0) * 1000, 1)
        self.frames.append(entry)

    @property
    def alive(self) -> bool:
        return bool(self.inner.alive)

    def send(self, msg: dict[str, Any]) -> None:
        self._note("out", msg)
        self.inner.send(msg)

    def recv(self) -> Sequence[dict[str, Any]]:
        msgs: Sequence[dict[str, Any]] = self.inner.recv()
        for msg in msgs:
            self._note("in", msg)
            if isinstance(msg, dict) and isinstance(msg.get("kv_request_id"), str):
                rid = msg["kv_request_id"]
                if msg.get("type") == "fetch" and isinstance(msg.get("keys"), list):
                    self.fetches[rid] = [bytes(k) for k in msg["keys"]]
                elif msg.get("type") == "lookup":
                    self.lookups.add(rid)
        return msgs

    def mark_dead(self) -> None:
        self.inner.mark_dead()

    def close(self) -> None:
        self.inner.close()


# ----------------------------------------------------------------------------- server


class DemoStore:
    """The server's blocks: which keys are stored, at which index."""

    def __init__(self, region: np.ndarray, blocks: int, hold_back: set[int]) -> None:
        self.region = region
        self.block_len = region.shape[1]
        self.index = {demo_key(i): i for i in range(blocks)}
        self.held_back = {demo_key(i) for i in hold_back if i < blocks}
        self.stored = {k for k in self.index if k not in self.held_back}
        for key in self.stored:
            self.write(self.index[key])

    def write(self, i: int) -> None:
        self.region[i] = np.frombuffer(demo_block(i, self.block_len), dtype=np.uint8)

    def store_late(self) -> list[bytes]:
        keys = sorted(self.held_back, key=self.index.__getitem__)
        for key in keys:
            self.write(self.index[key])
        self.stored |= self.held_back
        self.held_back = set()
        return keys


class StandInParent(ParentManager):  # type: ignore[misc]
    """The tiering manager as the server role sees it during serve_external_requests."""

    def __init__(self, store: DemoStore, server: Server) -> None:
        self.store = store
        self.server = server

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self.server.note("parent.on_new_request", req_id=req_context.req_id)
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self.store.stored:
            result = LookupResult.HIT
        elif key in self.store.held_back:
            result = LookupResult.HIT_PENDING
            self.server.start_late_clock()
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
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.config = json.loads(args.config_json) if args.config_json else None
        self.region = make_region(args.blocks, args.block_len)
        self.store = DemoStore(self.region, args.blocks, set(parse_blocks(args.hold_back)))
        self.transport, self.local_id = bind_transport()
        self.data = make_data(self.region, self.config)
        self.parent = StandInParent(self.store, self)
        self.sessions: dict[str, tuple[P2PSession, RecordingConnection]] = {}
        self.ended: list[dict[str, Any]] = []
        # (peer, kv_request_id) -> fetch time, keys still waiting for a late store, finished?
        self.demands: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.lookup_results: dict[str, int] = {}
        self.store_results: list[dict[str, Any]] = []
        self.late_at: float | None = None
        self.job = 0
        self.t0 = time.monotonic()

    def new_job(self) -> int:
        self.job += 1
        return self.job

    def note(self, what: str, **fields: Any) -> None:
        self.events.append({"event": what, "t_ms": round((time.monotonic() - self.t0) * 1000, 1),
                            **fields})

    def start_late_clock(self) -> None:
        if self.late_at is None and self.store.held_back:
            self.late_at = time.monotonic() + self.args.late_after

    def run(self) -> None:
        emit("ready", peer_id=self.local_id, fingerprint=self.data.config_fingerprint,
             sessions=session_kind(),
             blocks=self.args.blocks, block_len=self.args.block_len)
        end = time.monotonic() + self.args.max_seconds
        while not _STOP and time.monotonic() < end:
            self.step()
            wait_for_frames(self.transport)
        self.close()

    def step(self) -> None:
        for conn in self.transport.poll():
            rec = RecordingConnection(conn)
            session = new_session(conn.peer_id, self.local_id, self.data, self.args.block_len,
                                 self.args.hash_seed, rec)
            self.sessions[conn.peer_id] = (session, rec)
            self.note("session_created", peer_id=conn.peer_id)
        for peer, (session, rec) in list(self.sessions.items()):
            if rec.lookups:
                self.start_late_clock()
            result = session.poll()
            for kv in result.new_fetch_ids:
                self.on_fetch(peer, session, rec, kv)
            for store in result.stores:
                self.store_results.append({"job_id": store.job_id, "success": store.success})
            session.serve_external_requests(self.parent)
            if not session.alive:
                self.reap(peer, session, rec)
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
        held = [k for k in keys if k in self.store.stored]
        waiting = [k for k in keys if k in self.store.held_back]
        if held:
            job = self.new_job()
            idxs = [self.store.index[k] for k in held]
            session.add_stored_blocks(kv, held, idxs, job)
            self.note("add_stored_blocks", kv_request_id=kv, job_id=job, blocks=idxs,
                      why="fetch")
        if waiting:
            self.start_late_clock()
        self.demands[(peer, kv)] = {"t": time.monotonic(), "waiting": waiting,
                                    "finished": False}

    def late_store(self) -> None:
        if self.late_at is None or time.monotonic() < self.late_at or not self.store.held_back:
            return
        keys = self.store.store_late()
        self.note("late_store", blocks=[self.store.index[k] for k in keys])
        for (peer, kv), demand in self.demands.items():
            entry = self.sessions.get(peer)
            if not demand["waiting"] or entry is None:
                continue
            job = self.new_job()
            idxs = [self.store.index[k] for k in demand["waiting"]]
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
            if demand["finished"] or entry is None:
                continue
            if now - demand["t"] >= self.args.finish_after:
                entry[0].finish_request(kv)
                demand["finished"] = True
                self.note("finish_request", kv_request_id=kv)

    def reap(self, peer: str, session: P2PSession, rec: RecordingConnection) -> None:
        reason = session.death_reason
        closed = session.close()
        self.data.remove_remote_peer(peer)
        del self.sessions[peer]
        self.note("session_dead", peer_id=peer, reason=reason)
        self.ended.append({"peer_id": peer, "reason": reason, "frames": rec.frames,
                           "failed_stores": list(closed.failed_stores)})

    def close(self) -> None:
        for peer, (session, rec) in list(self.sessions.items()):
            closed = session.close()
            self.ended.append({"peer_id": peer, "reason": "server stopped",
                               "frames": rec.frames,
                               "failed_stores": list(closed.failed_stores)})
        self.sessions.clear()
        emit("summary", peers=self.ended, events=self.events, stores=self.store_results,
             lookup_results=self.lookup_results)
        self.transport.close()
        self.data.close()


# ----------------------------------------------------------------------------- client


def run_client(args: argparse.Namespace) -> int:
    vllm_client._LOAD_TIMEOUT_S = args.load_timeout
    vllm_client._ABORT_ACK_TIMEOUT_S = args.abort_ack_timeout
    config = json.loads(args.config_json) if args.config_json else None
    blocks = parse_blocks(args.keys)
    region = make_region(max(len(blocks), 1), args.block_len)
    transport, local_id = bind_transport()
    data = make_data(region, config)
    conn = transport.connect(args.connect)
    rec = RecordingConnection(conn)
    session = new_session(args.connect, local_id, data, args.block_len, args.hash_seed, rec)
    report: dict[str, Any] = {"mode": args.mode, "keys": len(blocks), "peer_id": local_id,
                              "sessions": session_kind(),
                              "fingerprint": data.config_fingerprint}
    try:
        run_client_flow(args, transport, session, region, blocks, report)
    finally:
        alive = session.alive  # read before close(): close() drops the connection
        report["session_alive"] = alive
        report["death_reason"] = None if alive else session.death_reason
        session.close()
        report["frames"] = rec.frames
        transport.close()
        data.close()
    emit("result", **report)
    return 0 if report.get("success") and report.get("verified") else 1


def _pump(transport: ZmqTransport, session: P2PSession, loads: list[Any]) -> None:
    transport.poll()
    result = session.poll()
    loads.extend(result.loads)


def run_client_flow(args: argparse.Namespace, transport: ZmqTransport, session: P2PSession,
                    region: np.ndarray, blocks: list[int], report: dict[str, Any]) -> None:
    loads: list[Any] = []
    end = time.monotonic() + args.handshake_timeout
    while not session.ready and session.alive and time.monotonic() < end and not _STOP:
        _pump(transport, session, loads)
        wait_for_frames(transport)
    report["ready"] = session.ready
    if not session.ready:
        report.update(success=False, verified=False, error="handshake did not complete")
        return
    attempts: list[dict[str, Any]] = []
    for job in range(1, args.repeat + 1):
        region[:] = 0  # each attempt's bytes are verified on their own
        attempt = one_attempt(args, transport, session, region, blocks, job, loads)
        attempts.append(attempt)
        if "error" in attempt:
            break
    report.update(attempts[-1])
    report["attempts"] = attempts
    report["success"] = all(a["success"] for a in attempts) and len(attempts) == args.repeat
    report["verified"] = all(a["verified"] for a in attempts) and report["success"]
    report["late_loads"] = [(r.job_id, r.success) for r in loads
                            if r.job_id not in {a.get("job") for a in attempts}]
    # The flow is over but the session is still open: a p2pfsm server under test can
    # look at its own state now, before our disconnect ends it.
    emit("done", success=report["success"])
    end = time.monotonic() + args.hold_open
    while time.monotonic() < end and session.alive and not _STOP:
        _pump(transport, session, loads)
        wait_for_frames(transport)


def one_attempt(args: argparse.Namespace, transport: ZmqTransport, session: P2PSession,
                region: np.ndarray, blocks: list[int], job: int,
                loads: list[Any]) -> dict[str, Any]:
    """One lookup (sym) and fetch of ``blocks`` under ``--request-id``; its report."""
    kv = args.request_id
    keys = [OffloadKey(demo_key(b)) for b in blocks]
    out: dict[str, Any] = {"job": job}
    t0 = time.monotonic()
    chosen = list(blocks)
    if args.mode == "sym":
        for key in keys:
            session.register_lookup(kv, key)
        answers: list[bool | None] = [None] * len(keys)
        end = time.monotonic() + args.lookup_timeout
        while any(a is None for a in answers) and session.alive and time.monotonic() < end:
            session.flush_pending_lookups()
            _pump(transport, session, loads)
            answers = [session.register_lookup(kv, key) for key in keys]
            wait_for_frames(transport)
        out["lookup_seconds"] = round(time.monotonic() - t0, 4)
        if any(a is None for a in answers):
            return {**out, "success": False, "verified": False,
                    "error": "lookup was not answered"}
        chosen = [b for b, hit in zip(blocks, answers, strict=True) if hit]
        out["hits"] = len(chosen)
    dest = list(range(len(chosen)))
    success = True
    if chosen:
        session.request_blocks(job, kv, [OffloadKey(demo_key(b)) for b in chosen], dest)
        limit = args.load_timeout + args.abort_ack_timeout + 5
        end = time.monotonic() + limit
        result = None
        while result is None and session.alive and time.monotonic() < end and not _STOP:
            _pump(transport, session, loads)
            result = next((r for r in loads if r.job_id == job), None)
            wait_for_frames(transport)
        if result is None:
            return {**out, "success": False, "verified": False,
                    "error": f"no load result in {limit} s"}
        success = bool(result.success)
    out["seconds"] = round(time.monotonic() - t0, 4)
    if args.mode == "sym":
        session.finish_request(kv)
    # Let the last frames (a terminal fetch, the peer's late replies) go out and in.
    end = time.monotonic() + args.linger
    while time.monotonic() < end and session.alive:
        _pump(transport, session, loads)
        wait_for_frames(transport)
    bl = args.block_len
    good = [b for d, b in zip(dest, chosen, strict=True)
            if region[d].tobytes() == demo_block(b, bl)]
    out.update(success=success, verified=success and len(good) == len(chosen), landed=good,
               chosen=chosen, bytes=len(chosen) * bl if success else 0)
    return out


# ------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="role", required=True)
    for name in ("server", "client"):
        q = sub.add_parser(name)
        q.add_argument("--block-len", type=int, default=4096)
        q.add_argument("--hash-seed", default="vllm-none-hash")
        q.add_argument("--config-json", default="",
                       help="model config dict whose fingerprint the peer must match")
        q.add_argument("--max-seconds", type=float, default=120.0, help="hard bound on the run")
        q.add_argument("--adapter", action="store_true",
                       help="run p2pfsm's sessions (p2pfsm.vllm.install()) instead of vLLM's")
    s = sub.choices["server"]
    s.add_argument("--blocks", type=int, default=16, help="demo blocks 0..N-1 held")
    s.add_argument("--hold-back", default="", help="blocks stored only --late-after s later")
    s.add_argument("--late-after", type=float, default=1.0)
    s.add_argument("--finish-after", type=float, default=None,
                   help="finish_request each fetched request this long after its fetch")
    c = sub.choices["client"]
    c.add_argument("--connect", required=True, help="HOST:PORT of the server")
    c.add_argument("--keys", default="0-7")
    c.add_argument("--mode", choices=("pd", "sym"), default="pd")
    c.add_argument("--request-id", default=f"vllm-interop-{uuid.uuid4().hex[:12]}")
    c.add_argument("--load-timeout", type=float, default=30.0, help="patches _LOAD_TIMEOUT_S")
    c.add_argument("--abort-ack-timeout", type=float, default=10.0)
    c.add_argument("--handshake-timeout", type=float, default=30.0)
    c.add_argument("--lookup-timeout", type=float, default=30.0)
    c.add_argument("--linger", type=float, default=0.2, help="keep polling after the result")
    c.add_argument("--repeat", type=int, default=1,
                   help="run the flow this many times, one after another, on the same "
                        "request id (vLLM restarts its round_seq at 0 each time)")
    c.add_argument("--hold-open", type=float, default=0.2,
                   help="keep the session open this long after the 'done' line")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGALRM, _on_signal)
    signal.alarm(max(1, int(args.max_seconds)))  # the hard bound, whatever a loop does
    if args.adapter:
        from p2pfsm.vllm import install

        install()  # before any session is built
    if args.role == "server":
        Server(args).run()
        return 0
    return run_client(args)


if __name__ == "__main__":
    sys.exit(main())
