"""The full install's data transport against vLLM's own, in one process.

Run by ``test_vllm_adapter.py::test_full_install_data_transport`` with a vLLM venv's
Python. Three regions of demo blocks: one behind vLLM's ``NixlTransport`` (``stock``),
two behind :class:`p2pfsm.vllm.data.PlaneDataTransport` (``ours``, ``other``). WRITEs go
each way between ours and stock and between ours and other; every byte landed is checked
against ``p2pfsm.demo_blocks``. Then what the manager and the sessions rely on:
scoped polls, each transfer reported once, ``cancel`` in both modes, a removed peer's
reports dropped (its running WRITE retired, reported by ``poll_retired``), a
re-registration, one UCX progress step per manager tick, and the
refusals. Prints one JSON line of checks.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
from vllm.v1.kv_offload.tiering.p2p.data.nixl import NixlTransport

from p2pfsm.demo_blocks import demo_block
from p2pfsm.tools.vllm_peer.common import make_region
from p2pfsm.vllm.data import PlaneDataTransport, progress_open

BLOCK_LEN, BLOCKS = 4096, 8
BOUND_S = 20.0  # every wait below ends on its event; this only bounds a broken run
CONFIG = {"model": "demo", "block_size": 16}


def filled() -> np.ndarray:
    region = make_region(BLOCKS, BLOCK_LEN)
    for i in range(BLOCKS):
        region[i] = np.frombuffer(demo_block(i, BLOCK_LEN), dtype=np.uint8)
    return region


def register(at: Any, peer_id: str, peer: Any) -> None:
    at.add_remote_peer_async(peer_id, peer.get_agent_metadata(), peer.base_addr,
                             peer.num_blocks, peer.block_len).result(timeout=BOUND_S)


def settle(src: Any, peer_id: str, tids: set[int], passive: Any) -> dict[int, bool]:
    """Poll ``src`` (scoped to ``peer_id``) until every id in ``tids`` is reported: every
    id reported meanwhile, True for one reported done once (failed, or reported twice:
    False). The passive side gets its progress step each turn, as the manager's tick
    gives it."""
    seen: dict[int, bool] = {}
    end = time.monotonic() + BOUND_S
    while not tids <= set(seen) and time.monotonic() < end:
        result = src.poll(peer_id)
        for tid in [*result.done, *result.failed]:
            seen[tid] = tid not in seen and tid in result.done
        if hasattr(passive, "progress"):
            passive.progress()
    return seen


def counted_steps(transport: PlaneDataTransport) -> list[int]:
    """From now on, ``[n]``: the UCX progress steps ``transport``'s DataPlane ran."""
    steps = [0]
    step = transport.plane.progress

    def counting() -> None:
        steps[0] += 1
        step()

    transport.plane.progress = counting  # type: ignore[method-assign]
    return steps


def landed(region: np.ndarray, dest: list[int], blocks: list[int]) -> bool:
    return all(region[d].tobytes() == demo_block(b, BLOCK_LEN)
               for d, b in zip(dest, blocks, strict=True))


def main() -> None:
    out: dict[str, Any] = {}
    r_stock, r_ours, r_other = filled(), filled(), make_region(BLOCKS, BLOCK_LEN)
    stock = NixlTransport("drive-stock", memoryview(r_stock.data), config_fields=CONFIG)
    ours = PlaneDataTransport("drive-ours", memoryview(r_ours.data), config_fields=CONFIG)
    other = PlaneDataTransport("drive-other", memoryview(r_other.data), config_fields=CONFIG)
    try:
        out["same_surface"] = (
            ours.config_fingerprint == stock.config_fingerprint != ""
            and ours.num_blocks == BLOCKS and ours.block_len == BLOCK_LEN
            and ours.base_addr == r_ours.ctypes.data and ours.available)
        register(ours, "stock", stock)
        register(stock, "ours", ours)
        register(ours, "other", other)
        register(other, "ours", ours)

        # ours -> stock (stock is passive: its progress thread serves it)
        tid = ours.write_blocks("stock", [0, 1], [6, 7])
        got = settle(ours, "stock", {tid}, stock) if tid is not None else {}
        out["ours_to_stock"] = got == {tid: True} and landed(r_stock, [6, 7], [0, 1])
        # stock -> ours (ours is passive: served by its progress steps)
        r_ours[5] = 0
        tid = stock.write_blocks("ours", [2], [5])
        got = settle(stock, "ours", {tid}, ours) if tid is not None else {}
        out["stock_to_ours"] = got == {tid: True} and landed(r_ours, [5], [2])
        # ours -> other, and a poll scoped to another peer sees none of it
        a = ours.write_blocks("other", [0, 1, 2], [0, 1, 2])
        b = ours.write_blocks("other", [3], [3])
        stray = ours.poll("stock")
        got = settle(ours, "other", {a, b}, other) if None not in (a, b) else {}
        out["ours_to_other"] = (got == {a: True, b: True} and not stray.done
                                and landed(r_other, [0, 1, 2, 3], [0, 1, 2, 3]))
        out["reported_once"] = not ours.poll("other").done and not ours.poll(None).done

        # one progress step per tick: the control transport's, then a poll per peer;
        # a scope polled again (a drain loop, no tick between) gets a step each time
        steps = counted_steps(ours)
        progress_open()
        for scope in ("stock", "other", None):
            ours.poll(scope)
        tick = steps[0]
        ours.poll("other")
        ours.poll("other")
        out["one_progress_per_tick"] = tick == 1 and steps[0] == tick + 2

        # cancel: an ended transfer is released unreported; a running one is waited for
        c = ours.write_blocks("other", [4], [4])
        still = ours.cancel([c], mode="wait")
        late = settle(ours, "other", set(still), other) if still else {}
        out["cancel_wait"] = c is not None and (still == [] or late == {c: True})
        # (a later WRITE's report is where an earlier one's would have come by)
        d = ours.write_blocks("other", [5], [5])
        cancelled = ours.cancel([d]) if d is not None else None
        marker = ours.write_blocks("other", [0], [0])
        seen = settle(ours, "other", {marker}, other) if marker is not None else {}
        out["cancel_immediate"] = cancelled == [] and seen == {marker: True}
        # a removed peer's reports are dropped; it registers again
        e = ours.write_blocks("other", [6], [6])
        ours.remove_remote_peer("other")
        register(ours, "other", other)
        f = ours.write_blocks("other", [7], [7])
        seen = settle(ours, "other", {f}, other) if f is not None else {}
        out["remove_and_again"] = (e is not None and seen == {f: True}
                                   and landed(r_other, [7], [7]))
        # the removed peer's WRITE still running then was retired (0.34.0's surface):
        # poll_retired() reports it once, when it has ended
        retired: list[int] = []
        end = time.monotonic() + BOUND_S
        while e not in retired and time.monotonic() < end:
            retired += ours.poll_retired()
            other.progress()
        out["removed_write_retired"] = retired == [e] and ours.poll_retired() == []

        # refusals: nothing posted, nothing registered
        out["write_unknown_peer"] = ours.write_blocks("nobody", [0], [0]) is None
        out["write_bad_index"] = ours.write_blocks("other", [BLOCKS], [0]) is None
        refused: dict[str, str] = {}
        for case, args in {
            "own_metadata": ("self", ours.get_agent_metadata(), ours.base_addr),
            "agent_of_another_peer": ("stock-again", stock.get_agent_metadata(),
                                      stock.base_addr),
        }.items():
            fut = ours.add_remote_peer_async(args[0], args[1], args[2], BLOCKS, BLOCK_LEN)
            exc = fut.exception(timeout=BOUND_S)
            refused[case] = "" if exc is None else type(exc).__name__
        fut = ours.add_remote_peer_async("big", other.get_agent_metadata(), other.base_addr,
                                         (1 << 20) + 1, BLOCK_LEN)
        refused["num_blocks_over_bound"] = type(fut.exception(timeout=BOUND_S)).__name__
        out["refused"] = refused
    finally:
        for transport in (ours, other, stock):
            transport.close()
    ours.close()  # idempotent
    out["closed"] = ours.poll("other").done == () and not ours.available
    print(json.dumps(out, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
