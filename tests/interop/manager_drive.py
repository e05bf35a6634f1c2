"""vLLM's own ``P2PSecondaryTierManager`` (0.33.0 or 0.34.0), driven as an engine drives it.

Run by ``test_vllm_adapter.py::test_real_tier_manager`` with a vLLM venv's Python;
argv: ``vllm`` (vLLM's sessions), ``p2pfsm`` (``p2pfsm.vllm.install()`` first) or
``full`` (``install(transport="p2pfsm")``: p2pfsm's control and data transports too), or
several, comma-separated: one after the other in this process (one vLLM import), each
with a manager and peers of its own, the install undone after each. One
manager on a primary region of demo-block size, each step one ``get_finished_jobs()``
(the manager's poll), ``serve_external_requests()`` and ``on_schedule_end()``, as the
engine calls them. Its peers are stock vLLM processes (``python -m p2pfsm.tools.vllm_peer``)
this script starts and stops by PID. Flows, in order:

* ``pd``: a decoder request (``remote_prefiller``): every key a HIT, one load, verified;
* ``sym``: a symmetric request (``remote_kv_source``) whose keys 4 and 5 the peer stores
  1 s late and one of which it never has: RETRY until answered, then a load of the hits;
* ``kill``: a load whose peer is SIGKILLed while it waits for held-back blocks: the job
  fails once, the session is reaped, the request falls back (``lookup`` is MISS);
* ``reconnect``: the peer restarted on the same port: a new request loads from it;
* ``reset`` (where vLLM's session has ``abort_loads``, 0.34.0): a load of a block the
  peer never stores, then ``drain_jobs()`` (the cache reset): the load is aborted, fails
  once, and its deferred release is set when ``drain_jobs()`` returns;
* ``native``: PD and symmetric loads from a p2pfsm node (``p2pfsm serve``);
* ``produce``: a prefiller request (``remote_decoder``): a store submitted before any
  peer asked, fetched by a stock vLLM client: one store result, the client verifies;
* ``native_produce``: the same store fetched by p2pfsm's own client (``p2pfsm fetch``);
* ``shutdown()``, with the sessions to the three servers open.

Prints one JSON line per kind: each flow's job results, lookups and checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, OffloadingSpec, ReqContext, ScheduleEndContext
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.base import ParentManager, TransferJob
from vllm.v1.kv_offload.tiering.p2p import manager as manager_module
from vllm.v1.kv_offload.tiering.p2p.control.zmq import ZmqTransport
from vllm.v1.kv_offload.tiering.p2p.data.nixl import NixlTransport
from vllm.v1.kv_offload.tiering.p2p.session import P2PSession as Stock

import p2pfsm.vllm as pv
from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.tools.vllm_peer import patches
from p2pfsm.tools.vllm_peer.common import HOST, MARK, free_port, wait_for_frames
from p2pfsm.vllm.control import PlaneTransport
from p2pfsm.vllm.data import PlaneDataTransport
from p2pfsm.vllm.session import P2PSession as Adapter

BLOCK_LEN, BLOCKS, MISSING = 4096, 32, 9999
BOUND_S = 60.0  # every wait below ends on its event; this only bounds a broken run
CONFIG = OffloadingConfig(
    groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layers.0",),
                                  group_id=0),),
    worker_kv_bytes_per_block=BLOCK_LEN, enable_kv_cache_events=False, extra_config={},
    engine_id="p2pfsm-manager-drive",
    model=OffloadingModelConfig(name="p2pfsm/tools/demo", dtype="float16"),
    cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
    parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1,
                                      dcp_size=1, data_parallel_index=0, data_parallel_size=1,
                                      data_parallel_rank_local=None,
                                      is_parallelism_agnostic=True))


class Spec(OffloadingSpec):  # type: ignore[misc]
    """The offloading spec the manager reads its layout from (nothing else is used)."""

    def get_manager(self) -> Any:
        raise NotImplementedError

    def get_worker(self, kv_caches: Any) -> Any:
        raise NotImplementedError


class Parent(ParentManager):  # type: ignore[misc]
    """The tiering manager above this tier: it holds nothing a peer may look up."""

    def on_new_request(self, req_context: ReqContext) -> Any:
        return None

    def lookup(self, key: bytes, req_context: ReqContext) -> LookupResult:
        return LookupResult.MISS

    def create_store_job(self, keys: Any, req_context: ReqContext) -> Any:
        raise AssertionError("no lookup is a hit here")

    def on_request_finished(self, req_context: ReqContext) -> None:
        pass


class Peer:
    """A stock vLLM process (``p2pfsm.tools.vllm_peer``) this script started, or with ``argv``
    any other; stopped by PID."""

    def __init__(self, role: str, *args: str, argv: list[str] | None = None) -> None:
        config = json.dumps(FileMapper.from_offloading_spec(
            root_dir="", offloading_spec=Spec(CONFIG), blocks_per_file=1,
            parallel_agnostic=True).get_run_config())
        argv = argv or [sys.executable, "-m", "p2pfsm.tools.vllm_peer", role, "--block-len",
                        str(BLOCK_LEN), "--config-json", config, *args]
        # A file, so the peer never blocks on its output; closed by stop().
        self.out = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def record(self, kind: str) -> dict[str, Any]:
        """The first marked line of ``kind``, waiting for it while the peer runs."""
        def marked(line: str) -> dict[str, Any] | None:
            rec = json.loads(line[len(MARK):]) if line.startswith(MARK) else None
            return rec if rec is not None and rec.get("kind") == kind else None

        return self.first(marked, repr(kind))

    def first(self, parse: Callable[[str], dict[str, Any] | None],
              what: str) -> dict[str, Any]:
        """The first line of output ``parse`` makes something of, once there."""
        end = time.monotonic() + BOUND_S
        while True:
            exited = self.proc.poll() is not None
            self.out.seek(0)
            for line in self.out.read().splitlines():
                found = parse(line)
                if found is not None:
                    return found
            assert not exited, f"peer exited ({self.proc.returncode}) before a {what} line"
            assert time.monotonic() < end, f"no {what} line within {BOUND_S} s"
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.05)  # returns at once if it ends

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.out.close()


class Engine:
    """The manager and the engine's loop around it."""

    def __init__(self) -> None:
        self.region = np.zeros((BLOCKS, BLOCK_LEN), dtype=np.uint8)
        self.port = free_port()
        self.manager = manager_module.P2PSecondaryTierManager(
            Spec(CONFIG), memoryview(self.region.data), host=HOST, port=self.port)
        self.parent = Parent()
        self.results: dict[int, list[bool]] = {}  # job id -> every result it got
        self.released: dict[int, bool] = {}  # job id -> its deferred release was set

    def step(self) -> None:
        for result in self.manager.get_finished_jobs():
            self.results.setdefault(int(result.job_id), []).append(bool(result.success))
            event = getattr(result, "deferred_release", None)  # 0.34.0's field
            if event is not None:
                self.released[int(result.job_id)] = event.is_set()
        self.manager.serve_external_requests(self.parent)
        self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=[]))
        wait_for_frames(self.manager._control)

    def until(self, done: Callable[[], bool], what: str) -> None:
        end = time.monotonic() + BOUND_S
        while not done():
            assert time.monotonic() < end, f"no {what} within {BOUND_S} s"
            self.step()

    def load(self, job: int, ctx: ReqContext, blocks: list[int], dest: list[int]) -> bool:
        """Submit a load of demo ``blocks`` into ``dest``; wait for its result; whether
        every byte landed."""
        self.region[dest] = 0
        keys = [demo_key(b) for b in blocks]
        self.manager.submit_load(TransferJob(job_id=job, keys=keys,
                                             chunk_ids=np.array(dest, dtype=np.int64),
                                             is_promotion=True, req_context=ctx))
        self.until(lambda: job in self.results, f"result of load {job}")
        return all(self.region[d].tobytes() == demo_block(b, BLOCK_LEN)
                   for d, b in zip(dest, blocks, strict=True))

    def lookups(self, ctx: ReqContext, blocks: list[int]) -> list[str]:
        """Each key's answer once none is RETRY (one round of lookups per step)."""
        answers: list[str] = []

        def answered() -> bool:
            nonlocal answers
            answers = [self.manager.lookup(demo_key(b), ctx).name for b in blocks]
            return "RETRY" not in answers

        self.until(answered, "lookup answers")
        return answers


def consumer(peer_id: str, kind: str, kv: str) -> ReqContext:
    """A request that loads from ``peer_id`` (``kind``: PD or symmetric parameters)."""
    host, port = peer_id.rsplit(":", 1)
    return ReqContext(req_id=f"req-{kv}", kv_transfer_params={
        kind: {"kv_request_id": kv, "remote_host": host, "remote_port": int(port)}})


def drive(engine: Engine) -> dict[str, Any]:
    m, out = engine.manager, {}
    # Each server outlives the whole drive (minutes on a busy machine).
    server = Peer("server", "--blocks", "16", "--hold-back", "4,5", "--late-after", "1.0",
                  "--max-seconds", "900")
    victim = Peer("server", "--blocks", "16", "--hold-back", "0-3", "--late-after", "300",
                  "--port", str(free_port()), "--max-seconds", "900")
    peers = [server, victim]
    try:
        sid, vid = server.record("ready")["peer_id"], victim.record("ready")["peer_id"]

        ctx = consumer(sid, "remote_prefiller", "pd-1")
        m.on_new_request(ctx)
        answers = [m.lookup(demo_key(b), ctx).name for b in range(8)]
        verified = engine.load(1, ctx, list(range(8)), list(range(8)))
        m.on_request_finished(ctx)
        out["pd"] = {"lookups": answers, "results": engine.results[1], "verified": verified}

        ctx = consumer(sid, "remote_kv_source", "sym-1")
        m.on_new_request(ctx)
        blocks = [0, 1, 2, 3, 4, 5, MISSING]
        answers = engine.lookups(ctx, blocks)
        hits = [b for b, a in zip(blocks, answers, strict=True) if a == "HIT"]
        verified = engine.load(2, ctx, hits, list(range(8, 8 + len(hits))))
        m.on_request_finished(ctx)
        out["sym"] = {"lookups": answers, "results": engine.results[2], "verified": verified}

        ctx = consumer(vid, "remote_prefiller", "kill-1")
        m.on_new_request(ctx)
        engine.until(lambda: m._sessions[vid].ready, "a ready session with the victim")
        keys = [demo_key(b) for b in range(4)]
        m.submit_load(TransferJob(job_id=3, keys=keys, chunk_ids=np.arange(16, 20),
                                  is_promotion=True, req_context=ctx))
        engine.step()  # the fetch goes out
        victim.kill()
        engine.until(lambda: 3 in engine.results and vid not in m._sessions,
                     "the failed load and the reaping")
        out["kill"] = {"results": engine.results[3], "reaped": vid not in m._sessions,
                       "lookup_after": m.lookup(keys[0], ctx).name}
        m.on_request_finished(ctx)

        restarted = Peer("server", "--blocks", "16", "--port", vid.rsplit(":", 1)[1],
                         "--max-seconds", "900")
        peers.append(restarted)
        assert restarted.record("ready")["peer_id"] == vid
        ctx = consumer(vid, "remote_prefiller", "kill-2")
        m.on_new_request(ctx)
        verified = engine.load(4, ctx, list(range(8, 12)), list(range(20, 24)))
        m.on_request_finished(ctx)
        out["reconnect"] = {"results": engine.results[4], "verified": verified}

        if hasattr(Stock, "abort_loads"):  # the release's cache reset aborts loads
            ctx = consumer(sid, "remote_prefiller", "reset-1")
            m.on_new_request(ctx)
            m.submit_load(TransferJob(job_id=9, keys=[demo_key(0), demo_key(MISSING)],
                                      chunk_ids=np.arange(30, 32), is_promotion=True,
                                      req_context=ctx))
            engine.step()  # the fetch goes out; the server waits for block 9999
            m.drain_jobs()  # returns once the abort is acknowledged
            engine.until(lambda: 9 in engine.results, "the reset load's result")
            m.on_request_finished(ctx)
            out["reset"] = {"results": engine.results[9], "released": engine.released.get(9),
                            "idle_after": not m.has_pending_work()}

        cli = str(Path(sys.executable).with_name("p2pfsm"))  # p2pfsm's own CLI
        native = Peer("", argv=[cli, "serve", "-q", "--bind", f"tcp://{HOST}:0", "--blocks",
                                "16", "--block-len", str(BLOCK_LEN), "--fingerprint",
                                str(m._data.config_fingerprint)])
        peers.append(native)
        nid = native.first(lambda line: {"id": line.rsplit("tcp://", 1)[1]}
                           if line.startswith("serving ") else None, "serving")["id"]
        ctx = consumer(nid, "remote_prefiller", "native-pd")
        m.on_new_request(ctx)
        verified = engine.load(6, ctx, list(range(8)), list(range(8)))
        m.on_request_finished(ctx)
        out["native_pd"] = {"results": engine.results[6], "verified": verified}
        ctx = consumer(nid, "remote_kv_source", "native-sym")
        m.on_new_request(ctx)
        answers = engine.lookups(ctx, [12, 13, MISSING])
        verified = engine.load(7, ctx, [12, 13], [28, 29])
        m.on_request_finished(ctx)
        out["native_sym"] = {"lookups": answers, "results": engine.results[7],
                             "verified": verified}

        for b in range(4):  # the prefill: this engine's own blocks 0-3
            engine.region[24 + b] = np.frombuffer(demo_block(b, BLOCK_LEN), dtype=np.uint8)
        ctx = ReqContext(req_id="req-produce",
                         kv_transfer_params={"remote_decoder": {"kv_request_id": "produce-1"}})
        m.on_new_request(ctx)
        m.submit_store(TransferJob(job_id=5, keys=[demo_key(b) for b in range(4)],
                                   chunk_ids=np.arange(24, 28), is_promotion=False,
                                   req_context=ctx))
        client = Peer("client", "--connect", f"{HOST}:{engine.port}", "--keys", "0-3",
                      "--request-id", "produce-1")
        peers.append(client)
        engine.until(lambda: client.proc.poll() is not None and 5 in engine.results,
                     "the client's fetch and the store's result")
        fetched = client.record("result")
        m.on_request_finished(ctx)
        out["produce"] = {"results": engine.results[5], "client_verified": fetched["verified"],
                          "client_success": fetched["success"]}
        # The same store fetched by p2pfsm's own client (its request id is the CLI's).
        ctx = ReqContext(req_id="req-native-produce", kv_transfer_params={
            "remote_decoder": {"kv_request_id": "p2pfsm-fetch-0"}})
        m.on_new_request(ctx)
        m.submit_store(TransferJob(job_id=8, keys=[demo_key(b) for b in range(4)],
                                   chunk_ids=np.arange(24, 28), is_promotion=False,
                                   req_context=ctx))
        fetcher = Peer("", argv=[cli, "fetch", "-q", "--connect", f"tcp://{HOST}:{engine.port}",
                                 "--keys", "0-3", "--block-len", str(BLOCK_LEN),
                                 "--fingerprint", str(m._data.config_fingerprint)])
        peers.append(fetcher)
        engine.until(lambda: fetcher.proc.poll() is not None and 8 in engine.results,
                     "p2pfsm's fetch and the store's result")
        report = fetcher.first(lambda line: json.loads(line) if line.startswith("{") else None,
                               "report")
        m.on_request_finished(ctx)
        out["native_produce"] = {"results": engine.results[8], "rc": fetcher.proc.returncode,
                                 "client_verified": report["verified"]}
        # Shut down with the servers' sessions still open (``shutdown()`` reads them all;
        # the clients' may still be there too, if their end is not seen yet).
        names = {sid: "server", vid: "victim", nid: "native"}
        out["shutdown"] = {"open": sorted(names[p] for p in m._sessions if p in names)}
        m.shutdown()  # raises where the manager cannot read a session
    finally:
        for peer in peers:
            peer.stop()
    out["jobs_once"] = {str(j): len(r) for j, r in sorted(engine.results.items())}
    return out


def run_kind(kind: str) -> dict[str, Any]:
    """Every flow with a new manager of ``kind``; the install undone at the end."""
    full = kind == "full"
    if kind != "vllm":
        pv.install("p2pfsm" if full else None)
    try:
        assert manager_module.P2PSession is (Stock if kind == "vllm" else Adapter)
        assert manager_module.ZmqTransport is (PlaneTransport if full else ZmqTransport)
        assert manager_module.NixlTransport is (PlaneDataTransport if full else NixlTransport)
        return {"sessions": kind, **drive(Engine())}
    finally:
        if kind != "vllm":
            pv.uninstall()


def main() -> None:
    patches.apply()  # as the harness does: vLLM's close stops its monitor first
    for kind in sys.argv[1].split(","):
        print(json.dumps(run_kind(kind)), flush=True)


if __name__ == "__main__":
    main()
