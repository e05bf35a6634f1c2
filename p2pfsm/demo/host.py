"""The deterministic demo host behind ``p2pfsm serve`` / ``fetch`` / ``demo``.

Block model (the one vLLM's interop harness uses): key ``demo_key(i)`` has content
``demo_block(i, block_len)``, and a serving node holds block ``i`` at index ``i``.
The server supplies whatever it holds of each fetch (PD) and answers lookups with
the keys it holds (symmetric). The client verifies every byte it receives.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from p2pfsm.demo.blocks import demo_block, demo_key
from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.node import LookupAnswer, Node, NodeConfig
from p2pfsm.session import FetchArrived, LookupRequest


def parse_keys(text: str) -> list[int]:
    """``"0-15"`` or ``"0-3,9999"`` -> block numbers (each ≥ 0, no duplicates)."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            first, last = int(lo), int(hi) if sep else int(lo)
            if first < 0 or last < first:
                raise ValueError(part)
            out.extend(range(first, last + 1))
    except ValueError:
        raise ConfigError(f"--keys: expected ranges like 0-15 or 0-3,9999, got {text!r}") from None
    if len(set(out)) != len(out) or not out:
        raise ConfigError(f"--keys: empty or repeated block numbers in {text!r}")
    return out


def fill_demo_region(node: Node, count: int) -> None:
    """Store demo blocks 0..count-1 at their own index."""
    import torch

    bl = node.config.block_len
    for i in range(count):
        node.region[i] = torch.frombuffer(bytearray(demo_block(i, bl)), dtype=torch.uint8)


class DemoServer:
    """Serves demo blocks 0..num_blocks-1 from ``node``."""

    _PINNED_MEMORY = 4096
    """Rounds remembered as served by lookup pins (oldest forgotten first)."""

    def __init__(self, config: NodeConfig) -> None:
        self.held = {demo_key(i): i for i in range(config.num_blocks)}
        # (peer, kv_request_id, round_seq) whose lookup pinned hits: its fetch is served
        # from those pins, so supplying again would only park a second, unused pin job.
        self._pinned: dict[tuple[str, str, int], None] = {}
        self.node = Node(config, on_lookup=self._on_lookup, on_fetch=self._on_fetch)
        fill_demo_region(self.node, config.num_blocks)

    def _on_fetch(self, peer_id: str, fetch: FetchArrived) -> None:
        served_round = (peer_id, fetch.kv_request_id, fetch.round_seq)
        if served_round in self._pinned:
            del self._pinned[served_round]
            return
        keys = [k for k in fetch.keys if k in self.held]
        if keys:
            self.node.supply(peer_id, fetch.kv_request_id, keys, [self.held[k] for k in keys])

    def _on_lookup(self, peer_id: str, req: LookupRequest) -> LookupAnswer:
        hits = {k: self.held[k] for k in req.keys if k in self.held}
        if hits:
            self._pinned[(peer_id, req.kv_request_id, req.round_seq)] = None
            while len(self._pinned) > self._PINNED_MEMORY:
                del self._pinned[next(iter(self._pinned))]
        return hits, frozenset()


@dataclass
class FetchReport:
    """What ``p2pfsm fetch`` prints."""

    success: bool
    verified: bool
    bytes: int
    seconds: float
    keys: int
    hits: int | None = None
    error: str | None = None


def run_fetch(node: Node, peer_id: str, blocks: Sequence[int], mode: str,
              handshake_timeout: float, request_id: str = "p2pfsm-fetch-0") -> FetchReport:
    """Connect, fetch ``blocks`` (pd: directly; sym: lookup first), verify every byte."""
    session = node.connect(peer_id)
    node.run_until(lambda: session.ready or not session.alive, handshake_timeout)
    if not session.ready:
        dead = node.deaths.get(peer_id)
        if dead is not None and dead.mismatch is not None:
            raise ConfigError(f"{peer_id} is incompatible: {dead.mismatch}")
        reason = dead.reason if dead is not None else "handshake timed out"
        raise TransportError(f"cannot reach {peer_id}: {reason}")
    if len(blocks) > node.config.num_blocks:
        raise ConfigError(f"--keys: {len(blocks)} blocks do not fit in {node.config.num_blocks}")
    keys = [demo_key(i) for i in blocks]
    hits: int | None = None
    t0 = time.perf_counter()
    if mode == "sym":
        lookup = node.lookup(peer_id, request_id, keys)
        node.run_until(lookup.done, node.config.timeouts.lookup + 5)
        answer = lookup.result()
        chosen = [b for b, hit in zip(blocks, answer.hits, strict=True) if hit]
        hits = len(chosen)
    else:
        chosen = list(blocks)
    dest = list(range(len(chosen)))
    success = True
    if chosen:
        load = node.fetch(peer_id, request_id, [demo_key(b) for b in chosen], dest)
        limit = node.config.timeouts.load + 3 * node.config.timeouts.abort_ack + 5
        node.run_until(load.done, limit)
        if not load.done():
            raise TransportError(f"no result from {peer_id} within {limit:.0f} s")
        success = load.result().success
    seconds = time.perf_counter() - t0
    if mode == "sym":
        node.finish(peer_id, request_id)
    bl = node.config.block_len
    pairs = zip(dest, chosen, strict=True)
    verified = success and all(bytes(node.region[d].numpy()) == demo_block(b, bl) for d, b in pairs)
    return FetchReport(success, verified, len(chosen) * bl if success else 0, seconds,
                       len(blocks), hits)
