"""Two hostile connects against a vLLM node, with vLLM's sessions or p2pfsm's.

Run by ``test_vllm_adapter.py::test_adapter_refuses_what_the_node_refuses`` with
``.venv-vllm``'s Python; argv: ``vllm``, ``p2pfsm`` or ``full``, or several,
comma-separated (one process, one vLLM import; the full install is undone after its
run). The target is a session
of that class on vLLM's real ``ZmqTransport`` and ``NixlTransport`` (``full``: the full
install's, p2pfsm's control and data planes behind them), built as the manager builds an
inbound one; the attacker speaks the wire through a transport of the same kind:

* ``own_memory``: the attacker connects with the target's own NIXL metadata (the agent
  renamed) and base address, which the target's connect tells every peer, then fetches
  key 1 into "its" block 0 while the target's host supplies key 1 from block 1. A node
  that accepts writes its own block 1 over its block 0 and reports success.
* ``wrong_peer_id``: a connect naming a peer id other than the one the transport sees.

``p2pfsm`` runs under ``install()`` with the ZeroMQ guard opted out
(``P2PFSM_VLLM_GUARD=0``): the session refuses the second, and vLLM's NIXL transport,
as ``install()`` wraps it (:mod:`p2pfsm.vllm.nixl_guard`), the first.

Prints one JSON line per kind: per case, whether the target acked the connect, the session's
death reason, and (own_memory) whether its block 0 changed and its store's result.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from typing import Any

from vllm.v1.kv_offload.tiering.p2p.session import P2PSession as Stock

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.tools.vllm_peer import patches
from p2pfsm.tools.vllm_peer.common import bind_transport, make_data, make_region, wait_for_frames
from p2pfsm.vllm import guard
from p2pfsm.vllm.session import P2PSession as Adapter

BLOCK_LEN, BLOCKS, SEED = 4096, 4, "vllm-none-hash"
BOUND_S = 20.0  # every wait below ends on its event; this only bounds a broken run
PREFIX, LEN = b"nixlSerDes|Agent", struct.Struct("<Q")


def renamed(metadata: bytes, name: bytes) -> bytes:
    """NIXL agent metadata with the agent's name replaced (the rest kept)."""
    (n,) = LEN.unpack_from(metadata, len(PREFIX))
    start = len(PREFIX) + LEN.size
    return PREFIX + LEN.pack(len(name)) + name + metadata[start + n:]


class Target:
    """A node's session for the attacker, built when the attacker's first frame arrives."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.region = make_region(BLOCKS, BLOCK_LEN)
        for b in range(BLOCKS):
            self.region[b] = list(demo_block(b, BLOCK_LEN))
        self.transport, self.id = bind_transport()
        self.data = make_data(self.region, None)
        self.session: Any = None
        self.stores: list[bool] = []

    def step(self) -> None:
        for conn in self.transport.poll():
            self.session = self.cls(conn.peer_id, self.id, self.data, BLOCK_LEN, SEED, conn)
        if self.session is not None:
            result = self.session.poll()
            self.stores += [bool(s.success) for s in result.stores]
            for kv in result.new_fetch_ids:  # the host holds key 1 in block 1
                self.session.add_stored_blocks(kv, [demo_key(1)], [1], 1)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
        self.transport.close()
        self.data.close()


def run(cls: type, case: str, attacker_data: Any) -> dict[str, Any]:
    target = Target(cls)
    attacker, attacker_id = bind_transport()
    try:
        conn = attacker.connect(target.id)
        frames: list[dict[str, Any]] = []

        def pump_until(done: Any) -> None:
            end = time.monotonic() + BOUND_S
            while not done() and time.monotonic() < end:
                target.step()
                attacker.poll()
                frames.extend(conn.recv())
                wait_for_frames(attacker)  # a tick, or at once when a frame comes

        def seen(kind: str) -> dict[str, Any] | None:
            return next((f for f in frames if f.get("type") == kind), None)

        # What the target tells every peer in its own connect: its agent and region.
        own, data = bytes(target.data.get_agent_metadata()), target.data
        connect = {"type": "connect", "peer_id": attacker_id, "block_len": BLOCK_LEN,
                   "config_fingerprint": str(data.config_fingerprint), "hash_seed": SEED,
                   "num_blocks": BLOCKS, "base_addr": int(data.base_addr),
                   "agent_metadata": renamed(own, b"attacker-agent")}
        if case == "wrong_peer_id":
            connect["peer_id"] = "127.0.0.1:1"
            connect["agent_metadata"] = bytes(attacker_data.get_agent_metadata())
            connect["base_addr"] = int(attacker_data.base_addr)
        conn.send(connect)
        pump_until(lambda: seen("connect_ack") is not None or (
            target.session is not None and not target.session.alive))
        out: dict[str, Any] = {"acked": seen("connect_ack") is not None}
        if case == "own_memory" and out["acked"]:
            conn.send({"type": "fetch", "kv_request_id": "overwrite", "round_seq": 0,
                       "keys": [demo_key(1)], "block_indexes": [0]})
            pump_until(lambda: seen("transfer_done") is not None or bool(target.stores))
            pump_until(lambda: bool(target.stores))
            out["stores"] = target.stores
        if case == "own_memory":
            out["own_block_0_changed"] = (target.region[0].tobytes()
                                          != demo_block(0, BLOCK_LEN))
        session = target.session
        out["session"] = session is not None  # the full install may refuse at the door
        out["alive"] = bool(session is not None and session.alive)
        out["death_reason"] = None if out["alive"] or session is None else session.death_reason
        return out
    finally:
        target.close()
        attacker.close()


def run_kind(kind: str) -> dict[str, Any]:
    """Both cases against a target of ``kind``; the attacker's transports are of the same
    kind (made after the full install, for ``full``)."""
    cls = {"vllm": Stock, "p2pfsm": Adapter, "full": Adapter}[kind]
    attacker_data = make_data(make_region(BLOCKS, BLOCK_LEN), None)  # its own agent
    try:
        return {case: run(cls, case, attacker_data) for case in ("own_memory", "wrong_peer_id")}
    finally:
        attacker_data.close()


def main() -> None:
    import p2pfsm.vllm as pv

    patches.apply()  # as the harness does: vLLM's close stops its monitor first
    for kind in sys.argv[1].split(","):
        if kind == "full":
            pv.install(transport="p2pfsm")
        elif kind == "p2pfsm":  # the sessions' install without the ZeroMQ guard: the
            os.environ[guard.ENV_GUARD] = "0"  # NIXL transport's own-agent refusal stays
            pv.install()
        try:
            print(json.dumps({"kind": kind, **run_kind(kind)}), flush=True)
        finally:
            if kind != "vllm":
                pv.uninstall()
                os.environ.pop(guard.ENV_GUARD, None)


if __name__ == "__main__":
    main()
