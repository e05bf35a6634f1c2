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
    ``--hold-back 4,5`` keeps those blocks "not yet stored" for each request until
    ``--late-after`` seconds after the server first saw that request (a lookup sees them
    as HIT_PENDING until then; a waiting fetch is supplied then), so one server serves
    many clients alike; ``--finish-after S`` calls ``finish_request`` on each fetched
    request (whose id starts with ``--finish-prefix``) ``S`` seconds after its fetch.
    Prints one ``ready`` line when it accepts peers, and a ``summary`` line (every control
    frame it saw or sent, per peer, and its store results) when it stops: on SIGTERM or
    SIGINT, or after ``--max-seconds``.

``client``
    Connects to ``--connect HOST:PORT``, fetches ``--keys`` (``pd``: directly; ``sym``:
    lookup first, then fetch the hits, then ``finish_request``), verifies every byte it
    received against the block model, and prints one ``result`` line. ``--load-timeout``
    patches vLLM's ``_LOAD_TIMEOUT_S`` (the capture harness did the same with 3 s).
    With ``--plan FILE`` it waits for that JSON file and runs its steps instead, one
    session each (:func:`run_plan`), switching between vLLM's sessions and p2pfsm's per
    step; ``kill`` steps keep fetches in flight until a process is killed (:func:`run_kill`).

Both roles record a :class:`Trace` per session: what a tier manager sees of it.

``--adapter`` (either role) calls :func:`p2pfsm.vllm.install` first, so the same driver
runs p2pfsm's sessions behind vLLM's interface (``--full``: the full install, p2pfsm's
control transport too); the peer builds each session through the
name vLLM's tier manager uses, so it gets whichever class the manager would.

Every line meant for the test starts with ``P2PINTEROP `` followed by one JSON object;
vLLM's own logging goes to stderr. Loopback only; every loop is bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
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
from vllm.v1.kv_offload.tiering.p2p.control.zmq import ZmqConnection
from vllm.v1.kv_offload.tiering.p2p.session import P2PSession
from vllm.v1.kv_offload.tiering.p2p.session import client as vllm_client

from p2pfsm.demo.blocks import demo_block, demo_key
from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.vllm.switch import current, current_data_transport, current_transport

MARK = "P2PINTEROP "


def _close_monitor_first_off(self: ZmqConnection) -> None:
    """vLLM 0.33.0's ``ZmqConnection.close`` closes the monitor's PAIR socket, then the
    DEALER: the DEALER's close event then goes to a monitor with no reader, and libzmq's
    I/O thread can block on it for good, so the process accepts no new peer (seen here
    after a few sessions, with both vLLM's sessions and the adapter's). Stop the monitor
    first; everything else is vLLM's close."""
    if not self._closed:
        with contextlib.suppress(zmq.ZMQError):
            self._sockets.dealer.disable_monitor()
    _STOCK_CLOSE(self)


_STOCK_CLOSE = ZmqConnection.close
ZmqConnection.close = _close_monitor_first_off
HOST = "127.0.0.1"
TICK_S = 0.001
_STOP = False


def wait_for_frames(transport: Any) -> None:
    """Block until a frame reaches the control transport, or TICK_S at most: NIXL
    completions and vLLM's timers have nothing to wait on, so they are looked at every
    tick. vLLM's transport is waited on at its ROUTER, p2pfsm's (the full install) with
    its ``wait``."""
    ms = max(1, round(TICK_S * 1000))
    wait = getattr(transport, "wait", None)
    if callable(wait):
        wait(ms)
    else:
        transport._router.poll(ms, zmq.POLLIN)


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


def bind_transport(port: int = 0) -> tuple[Any, str]:
    """A control transport (vLLM's ZmqTransport, or p2pfsm's after the full install) on
    loopback ``port`` (0: a free one); local_id is that exact
    "host:port"."""
    cls = current_transport()  # vLLM's, or p2pfsm's after the full install
    if port:
        return cls(f"{HOST}:{port}", HOST, port), f"{HOST}:{port}"
    for _ in range(20):
        port = free_port()
        local_id = f"{HOST}:{port}"
        try:
            return cls(local_id, HOST, port), local_id
        except (zmq.ZMQError, TransportError, ConfigError):
            continue
    raise RuntimeError("no free loopback port for the ROUTER")


def make_region(num_blocks: int, block_len: int) -> np.ndarray:
    return np.zeros((num_blocks, block_len), dtype=np.uint8)


def make_data(region: np.ndarray, config: dict[str, Any] | None) -> Any:
    """A data transport of the class vLLM's tier manager would build now: vLLM's
    ``NixlTransport``, or p2pfsm's after the full install."""
    data = current_data_transport()(f"vllm-interop-{uuid.uuid4().hex[:12]}",
                                    memoryview(region.data), config_fields=config)
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
    """The server's blocks, each at its own index. ``held_back`` keys count as "not yet
    stored" for each request until ``late_after`` seconds after the server first saw that
    request (its fetch, or its lookup): every request sees the same late store, however
    many requests one server process serves."""

    def __init__(self, region: np.ndarray, blocks: int, hold_back: set[int],
                 late_after: float) -> None:
        self.region = region
        self.block_len = region.shape[1]
        self.index = {demo_key(i): i for i in range(blocks)}
        self.held_back = {demo_key(i) for i in hold_back if i < blocks}
        self.late_after = late_after
        self.first_seen: dict[str, float] = {}
        for i in range(blocks):
            self.region[i] = np.frombuffer(demo_block(i, self.block_len), dtype=np.uint8)

    def seen(self, request: str) -> float:
        """When the server first saw ``request`` (now, the first time it is asked)."""
        return self.first_seen.setdefault(request, time.monotonic())

    def holds(self, key: bytes) -> bool:
        return key in self.index

    def stored_for(self, key: bytes, request: str) -> bool:
        """Whether ``key`` counts as stored for ``request`` now."""
        if key not in self.index:
            return False
        return key not in self.held_back or (
            time.monotonic() >= self.seen(request) + self.late_after)


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


class Trace:
    """What a tier manager sees of one session, in order, timing left out: each poll's
    loads / stores / new fetch ids, each change of ``ready`` / ``alive`` / ``connected``
    (with ``death_reason`` once ``alive`` fell), lookup answers, and ``close()``'s result.
    Job ids are numbered per session in order of first appearance (a server's job
    counter is shared by its sessions) and request ids are kept as given."""

    def __init__(self) -> None:
        self.loads: list[list[Any]] = []
        self.stores: list[list[Any]] = []
        self.new_fetch_ids: list[str] = []
        self.transitions: list[list[Any]] = []
        self.lookups: list[list[Any]] = []
        self.close: dict[str, Any] | None = None
        self.state: dict[str, Any] = {}
        self.jobs: dict[int, int] = {}

    def job(self, job_id: int) -> int:
        return self.jobs.setdefault(job_id, len(self.jobs) + 1)

    def observe(self, session: P2PSession) -> None:
        for name in ("connected", "ready", "alive"):
            value = bool(getattr(session, name))
            if self.state.get(name) != value:
                self.state[name] = value
                self.transitions.append([name, value])
                if name == "alive" and not value:
                    self.transitions.append(["death_reason", session.death_reason])

    def polled(self, session: P2PSession, result: Any) -> None:
        self.loads += [[self.job(r.job_id), bool(r.success)] for r in result.loads]
        self.stores += [[self.job(r.job_id), bool(r.success)] for r in result.stores]
        self.new_fetch_ids += list(result.new_fetch_ids)
        self.observe(session)

    def closed(self, result: Any) -> None:
        self.close = {"failed_jobs": sorted(self.job(j) for j in result.failed_jobs),
                      "failed_req_ids": sorted(result.failed_req_ids),
                      "failed_stores": sorted(self.job(j) for j in result.failed_stores),
                      "failed_serves": len(result.failed_serves)}

    def report(self) -> dict[str, Any]:
        return {"loads": self.loads, "stores": self.stores,
                "new_fetch_ids": self.new_fetch_ids, "transitions": self.transitions,
                "lookups": self.lookups, "close": self.close}


class Server:
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
        while not _STOP and time.monotonic() < end:
            self.step()
            wait_for_frames(self.transport)
        self.close()

    def step(self) -> None:
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


# ----------------------------------------------------------------------------- client


class Link:
    """One client session to one server: its transports, region and public-interface
    trace; every ``poll()`` goes through :meth:`pump`."""

    def __init__(self, args: argparse.Namespace, nblocks: int) -> None:
        self.args = args
        self.config = json.loads(args.config_json) if args.config_json else None
        self.region = make_region(max(nblocks, 1), args.block_len)
        self.transport, self.local_id = bind_transport()
        self.data = make_data(self.region, self.config)
        self.rec = RecordingConnection(self.transport.connect(args.connect))
        self.session = new_session(args.connect, self.local_id, self.data, args.block_len,
                                   args.hash_seed, self.rec)
        self.kind = session_kind()
        self.trace = Trace()
        self.trace.observe(self.session)
        self.loads: list[Any] = []
        self.closed = False

    def pump(self) -> None:
        self.transport.poll()
        result = self.session.poll()
        self.loads.extend(result.loads)
        self.trace.polled(self.session, result)

    def landed(self, dest: list[int], blocks: list[int]) -> list[int]:
        bl = self.args.block_len
        return [b for d, b in zip(dest, blocks, strict=True)
                if self.region[d].tobytes() == demo_block(b, bl)]

    def close(self, report: dict[str, Any]) -> None:
        """Close as vLLM's manager does (its reaper, or its shutdown); fill ``report``."""
        if self.closed:
            return
        self.closed = True
        alive = self.session.alive  # read before close(): close() drops the connection
        report["session_alive"] = alive
        report["death_reason"] = None if alive else self.session.death_reason
        self.trace.closed(self.session.close())
        report["frames"] = self.rec.frames
        report["trace"] = self.trace.report()
        self.transport.close()
        self.data.close()


def run_client(args: argparse.Namespace, name: str | None = None) -> int:
    """One session to ``--connect``: the flow ``--mode`` / ``--keys``; one result line."""
    vllm_client._LOAD_TIMEOUT_S = args.load_timeout
    vllm_client._ABORT_ACK_TIMEOUT_S = args.abort_ack_timeout
    blocks = parse_blocks(args.keys)
    link = Link(args, len(blocks))
    report: dict[str, Any] = {"mode": args.mode, "keys": len(blocks), "peer_id": link.local_id,
                              "sessions": link.kind, "fingerprint": link.data.config_fingerprint,
                              "request_id": args.request_id}
    if name is not None:
        report["name"] = name
    try:
        run_client_flow(args, link, blocks, report)
    finally:
        link.close(report)
    emit("result", **report)
    return 0 if report.get("success") and report.get("verified") else 1


def wait_ready(links: Sequence[Link], seconds: float) -> None:
    end = time.monotonic() + seconds
    while (not all(k.session.ready or not k.session.alive for k in links)
           and time.monotonic() < end and not _STOP):
        for k in links:
            k.pump()
        wait_for_frames(links[0].transport)


def run_client_flow(args: argparse.Namespace, link: Link, blocks: list[int],
                    report: dict[str, Any]) -> None:
    wait_ready([link], args.handshake_timeout)
    report["ready"] = link.session.ready
    if not link.session.ready:
        report.update(success=False, verified=False, error="handshake did not complete")
        return
    attempts: list[dict[str, Any]] = []
    for job in range(1, args.repeat + 1):
        link.region[:] = 0  # each attempt's bytes are verified on their own
        attempt = one_attempt(args, link, blocks, job)
        attempts.append(attempt)
        if "error" in attempt:
            break
    report.update(attempts[-1])
    report["attempts"] = attempts
    report["success"] = all(a["success"] for a in attempts) and len(attempts) == args.repeat
    report["verified"] = all(a["verified"] for a in attempts) and report["success"]
    report["late_loads"] = [(r.job_id, r.success) for r in link.loads
                            if r.job_id not in {a.get("job") for a in attempts}]
    # The flow is over but the session is still open: a p2pfsm server under test can
    # look at its own state now, before our disconnect ends it.
    emit("done", success=report["success"])
    end = time.monotonic() + args.hold_open
    while time.monotonic() < end and link.session.alive and not _STOP:
        link.pump()
        wait_for_frames(link.transport)


def one_attempt(args: argparse.Namespace, link: Link, blocks: list[int],
                job: int) -> dict[str, Any]:
    """One lookup (sym) and fetch of ``blocks`` under ``--request-id``; its report."""
    kv = args.request_id
    session = link.session
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
            link.pump()
            answers = [session.register_lookup(kv, key) for key in keys]
            if any(a is None for a in answers):
                wait_for_frames(link.transport)  # no tick once the answer is in
        link.trace.lookups.append(answers)
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
        link.trace.observe(session)
        limit = args.load_timeout + args.abort_ack_timeout + 5
        end = time.monotonic() + limit
        result = None
        while result is None and session.alive and time.monotonic() < end and not _STOP:
            link.pump()
            result = next((r for r in link.loads if r.job_id == job), None)
            if result is None:
                wait_for_frames(link.transport)  # no tick once the load is in
        if result is None:
            return {**out, "success": False, "verified": False,
                    "error": f"no load result in {limit} s"}
        success = bool(result.success)
    out["seconds"] = round(time.monotonic() - t0, 4)
    if args.mode == "sym":
        session.finish_request(kv)
        link.trace.observe(session)
    # Let the last frames (a terminal fetch, the peer's late replies) go out and in.
    end = time.monotonic() + args.linger
    while time.monotonic() < end and session.alive:
        link.pump()
        wait_for_frames(link.transport)
    good = link.landed(dest, chosen)
    out.update(success=success, verified=success and len(good) == len(chosen), landed=good,
               chosen=chosen, bytes=len(chosen) * args.block_len if success else 0)
    return out


# ------------------------------------------------------------------------------ plans


def use_sessions(kind: str) -> None:
    """Make ``new_session`` build vLLM's sessions (``vllm``) or p2pfsm's (``p2pfsm``)."""
    from p2pfsm.vllm import install, uninstall

    if kind == "p2pfsm":
        install()
    elif kind == "vllm":
        uninstall()
    else:
        raise ValueError(f"unknown sessions {kind!r} (vllm or p2pfsm)")


def read_plan(path: str, seconds: float) -> dict[str, Any]:
    """The plan file, once it exists (the test writes it atomically when its servers are
    up); waits at most ``seconds``."""
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() >= end or _STOP:
            raise RuntimeError(f"no plan at {path} within {seconds:.0f} s")
        time.sleep(0.05)  # a file to appear: nothing to block on
    with open(path) as f:
        plan: dict[str, Any] = json.load(f)
    return plan


def run_plan(args: argparse.Namespace) -> int:
    """Every step of ``--plan``, one after another: ``flow`` steps are one session and one
    client flow each (the client options as keys), ``kill`` steps are :func:`run_kill`.
    Each flow builds its own session of the kind the step names."""
    plan = read_plan(args.plan, args.max_seconds)
    failures = 0
    for step in plan["steps"]:
        use_sessions(step.get("sessions", "vllm"))
        if step["kind"] == "kill":
            run_kill(args, step)
            continue
        flow = argparse.Namespace(**{**vars(args), **{k.replace("-", "_"): v
                                                      for k, v in step["args"].items()}})
        failures += run_client(flow, name=step["name"]) != 0
    emit("plan_done", failures=failures)
    return 0


def run_kill(args: argparse.Namespace, step: dict[str, Any]) -> None:
    """Sessions that each fetch ``keys`` and stay in flight: once every session has the
    blocks ``landed`` in its region and has sent its ``connect_ack``, one ``in_flight`` line;
    the test then kills a process (this one or a server). Each surviving session is
    polled until it is no longer alive, then closed as vLLM's manager reaps it; one
    ``result`` line each, with the seconds from ``in_flight`` to the death."""
    vllm_client._LOAD_TIMEOUT_S = args.load_timeout
    vllm_client._ABORT_ACK_TIMEOUT_S = args.abort_ack_timeout
    blocks = parse_blocks(step["keys"])
    want = parse_blocks(step["landed"])
    links: list[tuple[dict[str, Any], Link]] = []
    for target in step["targets"]:
        use_sessions(target["sessions"])
        one = argparse.Namespace(**{**vars(args), "connect": target["connect"]})
        links.append((target, Link(one, len(blocks))))
    wait_ready([k for _, k in links], args.handshake_timeout)
    dest = list(range(len(blocks)))
    for target, k in links:
        k.session.request_blocks(1, target["request_id"],
                                 [OffloadKey(demo_key(b)) for b in blocks], dest)
        k.trace.observe(k.session)
    def in_flight(k: Link) -> bool:
        # Our connect_ack is out too: vLLM sends it once it registered the peer's data
        # plane, which may come after the peer's first writes landed.
        acked = any(f["dir"] == "out" and f["type"] == "connect_ack" for f in k.rec.frames)
        return acked and k.landed(dest[:len(want)], want) == want

    end = time.monotonic() + step["seconds"]
    while (not all(in_flight(k) for _, k in links)
           and time.monotonic() < end and not _STOP):
        for _, k in links:
            k.pump()
        wait_for_frames(links[0][1].transport)
    emit("in_flight", peers=[k.local_id for _, k in links],
         landed=[k.landed(dest[:len(want)], want) for _, k in links])
    t0 = time.monotonic()
    died: dict[int, float] = {}
    end = t0 + step["seconds"]
    while len(died) < len(links) and time.monotonic() < end and not _STOP:
        for i, (_, k) in enumerate(links):
            if i in died:
                continue
            k.pump()
            if not k.session.alive:
                died[i] = round(time.monotonic() - t0, 3)
        wait_for_frames(links[0][1].transport)
    for i, (target, k) in enumerate(links):
        report: dict[str, Any] = {"name": target["name"], "sessions": k.kind,
                                  "died_after": died.get(i),
                                  "landed": k.landed(dest[:len(want)], want),
                                  "loads": [(r.job_id, r.success) for r in k.loads]}
        k.close(report)
        emit("result", **report)


def parse_links(text: str) -> list[tuple[str, str]]:
    """``"vllm=H:P,p2pfsm=H:P"`` -> [(sessions, address), ...]; a ValueError if malformed."""
    out: list[tuple[str, str]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, sep, addr = part.partition("=")
        if not sep or kind not in ("vllm", "p2pfsm") or ":" not in addr:
            raise ValueError(f"--links: expected SESSIONS=HOST:PORT with SESSIONS vllm or "
                             f"p2pfsm, got {part!r}")
        out.append((kind, addr))
    if not out:
        raise ValueError("--links: need at least one SESSIONS=HOST:PORT")
    return out


def run_links(args: argparse.Namespace) -> int:
    """One session per ``--links`` entry, all in this process, fetching in turn: attempt
    ``i`` runs one fetch on every link, starting at link ``i mod n``. Sessions of both
    kinds thus share this process, its load and its minute; one ``result`` line per link
    (``name`` is its index). Only pd mode: one fetch, nothing else, per attempt."""
    vllm_client._LOAD_TIMEOUT_S = args.load_timeout
    vllm_client._ABORT_ACK_TIMEOUT_S = args.abort_ack_timeout
    blocks = parse_blocks(args.keys)
    links: list[Link] = []
    for kind, addr in parse_links(args.links):
        use_sessions(kind)
        links.append(Link(argparse.Namespace(**{**vars(args), "connect": addr}), len(blocks)))
    wait_ready(links, args.handshake_timeout)
    attempts: list[list[dict[str, Any]]] = [[] for _ in links]
    failed = not all(k.session.ready for k in links)
    for job in range(1, args.repeat + 1):
        if failed:
            break
        for n in range(len(links)):
            i = (job + n) % len(links)
            links[i].region[:] = 0
            attempts[i].append(one_attempt(args, links[i], blocks, job))
            failed = failed or "error" in attempts[i][-1]
    for i, k in enumerate(links):
        report: dict[str, Any] = {"name": str(i), "mode": args.mode, "keys": len(blocks),
                                  "sessions": k.kind, "connect": k.args.connect,
                                  "ready": k.session.ready, "attempts": attempts[i]}
        report["success"] = len(attempts[i]) == args.repeat and all(
            a["success"] for a in attempts[i])
        report["verified"] = report["success"] and all(a["verified"] for a in attempts[i])
        k.close(report)
        emit("result", **report)
    return 0 if all(k.session is not None for k in links) and not failed else 1


def _drive(links: Sequence[Link], want: dict[int, Link], end: float) -> None:
    """Pump ``links`` until every job in ``want`` has its load result (or ``end``)."""
    while want and time.monotonic() < end and not _STOP:
        for k in links:
            k.pump()
        for k in links:
            for r in k.loads:
                if r.job_id in want:
                    if not r.success:
                        raise RuntimeError(f"load {r.job_id} failed")
                    del want[r.job_id]
            k.loads.clear()
        if want:
            wait_for_frames(links[0].transport)
    if want:
        raise RuntimeError(f"{len(want)} loads not done in time")


def run_concurrent(args: argparse.Namespace) -> int:
    """``--concurrent C``: ``--repeat`` rounds of C fetches of ``--per-request`` blocks
    issued together on one session, polled until all are done; each round's seconds.
    With ``--links-count P`` and ``--saturate N`` instead: P sessions each keeping
    ``--concurrent`` one-block fetches in flight until N are done; CPU seconds of this
    process over that window. One ``result`` line."""
    vllm_client._LOAD_TIMEOUT_S = args.load_timeout
    per, width = args.per_request, args.concurrent
    links = [Link(args, width * per) for _ in range(args.links_count)]
    wait_ready(links, args.handshake_timeout)
    if not all(k.session.ready for k in links):
        emit("result", success=False, error="handshake did not complete")
        return 1
    job = 0
    report: dict[str, Any] = {"success": True, "sessions": links[0].kind}
    try:
        if args.saturate:
            def start(k: Link, slot: int) -> int:
                nonlocal job
                job += 1
                k.session.request_blocks(job, f"sat-{job}", [OffloadKey(demo_key(slot))],
                                         [slot])
                return job

            for phase, count in (("warm", max(width * len(links), args.saturate // 10)),
                                 ("run", args.saturate)):
                if phase == "run":  # the parent samples the server's CPU at these lines
                    emit("window", at="start")
                live = {start(k, j): (k, j) for k in links for j in range(width)}
                started, done = len(live), 0
                t0, c0 = time.perf_counter(), time.process_time()
                end = time.monotonic() + args.max_seconds
                while live and time.monotonic() < end and not _STOP:
                    for k in links:
                        k.pump()
                    for k in links:
                        for r in k.loads:
                            if not r.success:
                                raise RuntimeError(f"load {r.job_id} failed")
                            kj = live.pop(r.job_id)
                            done += 1
                            if started < count:
                                live[start(*kj)] = kj
                                started += 1
                        k.loads.clear()
                    if live:
                        wait_for_frames(links[0].transport)
                if live:
                    raise RuntimeError(f"{len(live)} loads not done in time")
                if phase == "run":
                    emit("window", at="end")
                    report.update(fetches=done, wall_s=time.perf_counter() - t0,
                                  cpu_s=time.process_time() - c0)
        else:
            link = links[0]
            times = []
            for rnd in range(args.repeat + 2):
                link.region[:] = 0
                t0 = time.perf_counter()
                want = {}
                for i in range(width):
                    job += 1
                    blocks = list(range(i * per, (i + 1) * per))
                    link.session.request_blocks(job, f"conc-{rnd}-{i}",
                                                [OffloadKey(demo_key(b)) for b in blocks],
                                                blocks)
                    want[job] = link
                _drive(links, want, time.monotonic() + args.load_timeout)
                if rnd >= 2:
                    times.append(time.perf_counter() - t0)
                every = list(range(width * per))
                if len(link.landed(every, every)) != width * per:
                    raise RuntimeError("a concurrent fetch delivered a wrong block")
            report["times"] = times
    except RuntimeError as exc:
        report.update(success=False, error=str(exc))
    for k in links:
        k.close({})
    emit("result", **report)
    return 0 if report["success"] else 1


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
        q.add_argument("--full", action="store_true",
                       help="the full install: p2pfsm's sessions and control transport "
                            "(p2pfsm.vllm.install(transport='p2pfsm'))")
    s = sub.choices["server"]
    s.add_argument("--blocks", type=int, default=16, help="demo blocks 0..N-1 held")
    s.add_argument("--port", type=int, default=0,
                   help="the loopback port to listen on (0: a free one); a restarted "
                        "server comes back under the same peer id")
    s.add_argument("--hold-back", default="", help="blocks stored only --late-after s later")
    s.add_argument("--late-after", type=float, default=1.0)
    s.add_argument("--finish-after", type=float, default=None,
                   help="finish_request each fetched request this long after its fetch")
    s.add_argument("--finish-prefix", default="",
                   help="--finish-after only for request ids starting with this")
    c = sub.choices["client"]
    c.add_argument("--connect", default="", help="HOST:PORT of the server")
    c.add_argument("--plan", default="",
                   help="a JSON file of steps to run instead of one flow (see run_plan)")
    c.add_argument("--links", default="",
                   help="SESSIONS=HOST:PORT,...: one session each, fetching in turn "
                        "(see run_links; instead of --connect)")
    c.add_argument("--concurrent", type=int, default=0,
                   help="fetches in flight at once (see run_concurrent)")
    c.add_argument("--per-request", type=int, default=4, help="--concurrent: blocks each")
    c.add_argument("--links-count", type=int, default=1, help="--saturate: sessions")
    c.add_argument("--saturate", type=int, default=0, help="--concurrent: fetches to run")
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
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack
    signal.alarm(max(1, int(args.max_seconds)))  # the hard bound, whatever a loop does
    if args.adapter or args.full:
        from p2pfsm.vllm import install

        install("p2pfsm" if args.full else None)  # before any session or transport
    if args.role == "server":
        Server(args).run()
        return 0
    if args.plan:
        return run_plan(args)
    if args.links:
        return run_links(args)
    if args.concurrent:
        return run_concurrent(args)
    if not args.connect:
        raise SystemExit("client: --connect HOST:PORT or --plan FILE is required")
    return run_client(args)


if __name__ == "__main__":
    sys.exit(main())
