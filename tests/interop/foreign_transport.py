"""Sessions over a data transport that is not NIXL, with vLLM's sessions or p2pfsm's.

Run by ``test_vllm_adapter.py::test_foreign_data_transport`` with ``.venv-vllm``'s
Python; argv: ``vllm``, ``p2pfsm`` or both, comma-separated (one process, one vLLM
import). vLLM's ``DataTransport`` is an interface: which agent metadata it accepts is
the transport's decision, and a session must serve any of them. :class:`CopyTransport`
implements that interface by copying blocks between two regions of this process; its
metadata (``b"copy:<name>"``) is not NIXL's. The control plane is vLLM's real
``ZmqTransport`` on loopback. Two sessions of the class under test (a consumer ``A`` and
a producer ``B``) run the flows below, each on a request of its own, and the script
prints one JSON line per class of what a tier manager would see:

* ``handshake``: both ready; each transport registered the other with its metadata.
* ``fetch``: A loads keys 0, 1 into its blocks 4, 5; B's host supplies them once the
  fetch arrived (demand).
* ``store_first``: B's host supplies keys 2, 3 before A fetches them.
* ``split_lookup``: A probes key 0 of a request, and once that is answered key 2 of the
  same request (two lookup messages, two answers); B's tier holds key 2 only from then
  on. Then A loads both.
* ``finish``: A fetches key 3; B's host finishes the request without storing it.

Every load's bytes are compared with ``p2pfsm.demo_blocks``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import ParentManager, TransferJob
from vllm.v1.kv_offload.tiering.p2p.data.base import DataTransport, PollResult
from vllm.v1.kv_offload.tiering.p2p.session import P2PSession as Stock

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.tools.vllm_peer import patches
from p2pfsm.tools.vllm_peer.common import bind_transport, make_region, wait_for_frames
from p2pfsm.vllm.session import P2PSession as Adapter

BLOCK_LEN, BLOCKS, SEED = 4096, 8, "foreign-seed"
BOUND_S = 30.0  # every wait below ends on its event; this only bounds a broken run
REGIONS: dict[bytes, np.ndarray] = {}  # metadata -> region, for every open CopyTransport


class CopyTransport(DataTransport):  # type: ignore[misc]
    """vLLM's ``DataTransport`` by copying between regions of this process.

    A write is posted by ``write_blocks`` and done at the next ``poll`` of its peer
    (asynchronous, as the interface asks). ``registered`` records every registration.
    """

    def __init__(self, name: str, region: np.ndarray) -> None:
        super().__init__(memoryview(region.data), config_fields={"model": "copy"})
        self._region = region
        self._metadata = b"copy:" + name.encode()
        self._peers: dict[str, np.ndarray] = {}
        self._posted: dict[int, tuple[str, list[int], list[int]]] = {}
        self._next = 0
        self.registered: list[dict[str, Any]] = []
        REGIONS[self._metadata] = region

    def get_agent_metadata(self) -> bytes:
        return self._metadata

    def add_remote_peer(self, peer_id: str, agent_metadata: bytes, base_addr: int,
                        num_blocks: int, block_len: int) -> None:
        region = REGIONS.get(bytes(agent_metadata))
        if region is None or block_len != self.block_len or num_blocks != len(region):
            raise ValueError(f"CopyTransport: no region for {bytes(agent_metadata)!r}")
        self._peers[peer_id] = region
        self.registered.append({"metadata": bytes(agent_metadata).decode(),
                                "num_blocks": num_blocks, "block_len": block_len})

    def add_remote_peer_async(self, peer_id: str, agent_metadata: bytes, base_addr: int,
                              num_blocks: int, block_len: int) -> Future[None]:
        return super().add_remote_peer_async(peer_id, agent_metadata, base_addr,  # type: ignore[no-any-return]
                                             num_blocks, block_len)

    def remove_remote_peer(self, peer_id: str) -> None:
        self._peers.pop(peer_id, None)

    def write_blocks(self, peer_id: str, local_idxs: list[int],
                     remote_idxs: list[int]) -> int | None:
        if peer_id not in self._peers or len(local_idxs) != len(remote_idxs):
            return None
        tid, self._next = self._next, self._next + 1
        self._posted[tid] = (peer_id, list(local_idxs), list(remote_idxs))
        return tid

    def poll(self, peer_id: str | None = None) -> PollResult:
        done: list[int] = []
        for tid, (peer, local, remote) in list(self._posted.items()):
            if peer_id is not None and peer != peer_id:
                continue
            del self._posted[tid]
            target = self._peers.get(peer)
            if target is not None:
                target[remote] = self._region[local]
                done.append(tid)
        return PollResult(done=done, failed=[])

    def cancel(self, transfer_ids: Iterable[int], mode: str = "immediate") -> list[int]:
        for tid in transfer_ids:
            self._posted.pop(tid, None)
        return []

    def close(self) -> None:
        REGIONS.pop(self._metadata, None)


class Tier(ParentManager):  # type: ignore[misc]
    """B's tier manager: key k is held in B's block k once ``held`` names it."""

    def __init__(self, held: set[int]) -> None:
        self.held = held
        self.jobs = 1000

    def on_new_request(self, req_context: ReqContext) -> None:
        pass

    def lookup(self, key: bytes, req_context: ReqContext) -> LookupResult:
        k = next(i for i in range(BLOCKS) if demo_key(i) == key)
        return LookupResult.HIT if k in self.held else LookupResult.HIT_PENDING

    def create_store_job(self, keys: Any, req_context: ReqContext) -> TransferJob:
        keys = list(keys)
        self.jobs += 1
        idxs = [next(i for i in range(BLOCKS) if demo_key(i) == k) for k in keys]
        return TransferJob(job_id=self.jobs, keys=keys, chunk_ids=np.array(idxs),
                           is_promotion=False, req_context=req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        pass


class Pair:
    """A consumer session A and a producer session B of one class, and their loop."""

    def __init__(self, cls: type) -> None:
        self.regions = [make_region(BLOCKS, BLOCK_LEN), make_region(BLOCKS, BLOCK_LEN)]
        for b in range(BLOCKS):  # B holds demo block k in its block k
            self.regions[1][b] = list(demo_block(b, BLOCK_LEN))
        self.data = [CopyTransport(n, r)
                     for n, r in zip("ab", self.regions, strict=True)]
        (self.ta, self.ida), (self.tb, self.idb) = bind_transport(), bind_transport()
        self.a = cls(self.idb, self.ida, self.data[0], BLOCK_LEN, SEED,
                     self.ta.connect(self.idb))
        self.b: Any = None
        self.cls = cls
        self.tier = Tier({0, 1, 2, 3})
        self.loads: list[list[Any]] = []
        self.stores: list[list[Any]] = []
        self.fetch_ids: list[str] = []
        self.on_fetch: Callable[[str], None] = lambda kv: None

    def step(self) -> None:
        for conn in self.tb.poll():
            self.b = self.cls(conn.peer_id, self.idb, self.data[1], BLOCK_LEN, SEED, conn)
        self.ta.poll()
        got = self.a.poll()
        self.loads += [[r.job_id, r.kv_request_id, bool(r.success)] for r in got.loads]
        if self.b is not None:
            self.b.serve_external_requests(self.tier)
            got = self.b.poll()
            self.stores += [[r.job_id, bool(r.success)] for r in got.stores]
            for kv in got.new_fetch_ids:
                self.fetch_ids.append(kv)
                self.on_fetch(kv)
        wait_for_frames(self.ta)

    def until(self, done: Callable[[], bool]) -> bool:
        end = time.monotonic() + BOUND_S
        while not done() and time.monotonic() < end:
            self.step()
        return done()

    def landed(self, blocks: list[int], keys: list[int]) -> bool:
        return all(self.regions[0][b].tobytes() == demo_block(k, BLOCK_LEN)
                   for b, k in zip(blocks, keys, strict=True))

    def close(self) -> None:
        for s in (self.a, self.b):
            if s is not None:
                s.close()
        self.ta.close()
        self.tb.close()
        for d in self.data:
            d.close()


def run(cls: type) -> dict[str, Any]:
    pair = Pair(cls)
    out: dict[str, Any] = {}
    try:
        out["handshake"] = {
            "ready": pair.until(lambda: pair.a.ready and pair.b is not None and pair.b.ready),
            "registered": [d.registered for d in pair.data]}

        def supply(kv: str) -> None:  # B's host stores what a fetch asks, where it is
            if kv == "fetch":
                pair.b.add_stored_blocks(kv, [demo_key(0), demo_key(1)], [0, 1], 11)
            elif kv == "finish":
                pair.b.finish_request(kv)

        pair.on_fetch = supply
        pair.a.request_blocks(1, "fetch", [demo_key(0), demo_key(1)], [4, 5])
        out["fetch"] = {"done": pair.until(lambda: len(pair.loads) == 1 and bool(pair.stores)),
                        "bytes": pair.landed([4, 5], [0, 1])}

        pair.b.add_stored_blocks("store_first", [demo_key(2), demo_key(3)], [2, 3], 12)
        pair.a.request_blocks(2, "store_first", [demo_key(2), demo_key(3)], [6, 7])
        out["store_first"] = {"done": pair.until(lambda: len(pair.loads) == 2
                                                  and len(pair.stores) == 2),
                              "bytes": pair.landed([6, 7], [2, 3])}

        pair.tier.held = {0}  # key 2 is pending at B until A has the first answer
        keys = [demo_key(0), demo_key(2)]

        def probe() -> list[bool | None]:
            return [pair.a.register_lookup("split", k) for k in keys[:asked]]

        asked = 1  # one lookup message per key, the second sent after the first answer
        first = probe()
        pair.a.flush_pending_lookups()
        pair.until(lambda: probe()[0] is not None)
        asked = 2
        partial = probe()
        pair.a.flush_pending_lookups()
        pair.tier.held = {0, 2}
        pair.until(lambda: None not in probe())
        answers = probe()
        pair.a.request_blocks(3, "split", keys, [1, 2])
        out["split_lookup"] = {"first": first, "partial": partial, "answers": answers,
                               "done": pair.until(lambda: len(pair.loads) == 3
                                                  and len(pair.stores) == 4),
                               "bytes": pair.landed([1, 2], [0, 2])}

        pair.a.request_blocks(4, "finish", [demo_key(3)], [3])
        out["finish"] = {"done": pair.until(lambda: len(pair.loads) == 4),
                         "untouched": pair.regions[0][3].tobytes() == bytes(BLOCK_LEN)}
        out["loads"], out["stores"], out["fetch_ids"] = pair.loads, pair.stores, pair.fetch_ids
        out["alive"] = [pair.a.alive, pair.b.alive]
        return out
    finally:
        pair.close()


def main() -> None:
    patches.apply()  # as the harness does: vLLM's close stops its monitor first
    for kind in sys.argv[1].split(","):
        cls = {"vllm": Stock, "p2pfsm": Adapter}[kind]
        print(json.dumps({"kind": kind, **run(cls)}), flush=True)


if __name__ == "__main__":
    main()
