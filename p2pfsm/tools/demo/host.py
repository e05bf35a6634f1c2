"""The deterministic demo host behind ``p2pfsm serve`` / ``fetch`` / ``demo``.

Block model (the one vLLM's interop harness uses): key ``demo_key(i)`` has content
``demo_block(i, block_len)``, and a serving node holds block ``i`` at index ``i``.
The server supplies whatever it holds of each fetch (PD) and answers lookups with
the keys it holds (symmetric). The client verifies every byte it receives; a fetch
that fails says why (the keys the peer lacks, found by a lookup, or its session's end).

The size checks (:func:`parse_keys`, :func:`check_region`) and :func:`require_data_plane`
run before anything is allocated or torch and NIXL are loaded: importing this module
loads neither (the node is imported when a host is built).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import NIXL_INSTALL_HINT, ConfigError, P2PFSMError, TransportError
from p2pfsm.protocol.validate import Limits
from p2pfsm.session import FetchArrived

if TYPE_CHECKING:
    from p2pfsm.executor.node import LookupAnswer, LookupAsk, Node, NodeConfig

_LIMITS = Limits()
MAX_KEYS = _LIMITS.max_list_items
"""Most keys one fetch or lookup may carry: the protocol's ``max_list_items`` per frame."""
MAX_BLOCKS = _LIMITS.max_num_blocks
"""Most blocks a node may hold: the protocol's ``max_num_blocks`` (indexes < 2**31)."""
MAX_KEY_NUMBER = 2**64 - 1
"""Largest demo block number (:func:`demo_key` takes 8 bytes)."""
BOOKKEEPING_PER_BLOCK = 512
"""Bytes a demo host spends per block beside the block itself (its key table, NIXL's
descriptors), counted by :func:`check_region`."""


def _ranges(text: str) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        # Digits only and at most 20 of them (2**64 has 20): no huge-int parsing.
        for digits in (lo, hi) if sep else (lo,):
            if not digits.strip().isdigit() or len(digits.strip()) > 20:
                raise ValueError(part)
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first or last > MAX_KEY_NUMBER:
            raise ValueError(part)
        out.append((first, last))
    return out


def parse_keys(text: str, limit: int = MAX_KEYS) -> list[int]:
    """``"0-15"`` or ``"0-3,9999"`` -> block numbers (each ≥ 0, no duplicates).

    Counted from the ranges before any list is built: more than ``limit`` keys (the
    protocol's per-frame maximum by default) is a :class:`ConfigError`, whatever the
    ranges span.
    """
    try:
        ranges = _ranges(text)
    except ValueError:
        raise ConfigError(f"--keys: expected ranges like 0-15 or 0-3,9999, got {text!r}") from None
    total = sum(last - first + 1 for first, last in ranges)
    if total > limit:
        raise ConfigError(f"--keys: {total} keys, more than the {limit} one fetch may carry")
    ordered = sorted(ranges)
    if any(a[1] >= b[0] for a, b in itertools.pairwise(ordered)):
        raise ConfigError(f"--keys: repeated block numbers in {text!r}")
    return [i for first, last in ranges for i in range(first, last + 1)]


def format_keys(numbers: Sequence[int]) -> str:
    """Block numbers as ranges: ``[1, 2, 3, 7]`` -> ``"1-3,7"``."""
    parts: list[str] = []
    ordered = sorted(numbers)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def available_memory() -> int | None:
    """Bytes this process may still allocate: /proc/meminfo's MemAvailable, capped by a
    cgroup v2 ``memory.max`` (less what the cgroup uses); None when unknown."""
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    try:
        cgroup = Path("/sys/fs/cgroup")
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(0, min(found)) if found else None


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def check_region(num_blocks: int, block_len: int, *, what: str = "--blocks",
                 memory: int | None = None) -> None:
    """Refuse, before allocating anything, a region the protocol or this machine cannot hold.

    ``num_blocks`` must be at most :data:`MAX_BLOCKS`, and ``num_blocks * (block_len +``
    :data:`BOOKKEEPING_PER_BLOCK` ``)`` must fit in ``memory`` (default:
    :func:`available_memory`; no memory check when that is unknown).

    Raises:
        ConfigError: naming ``what``, the size asked for and the limit.
    """
    if num_blocks > MAX_BLOCKS:
        raise ConfigError(f"{what}: {num_blocks} blocks, more than the protocol's "
                          f"{MAX_BLOCKS} (num_blocks)")
    need = num_blocks * (block_len + BOOKKEEPING_PER_BLOCK)
    have = available_memory() if memory is None else memory
    if have is not None and need > have:
        raise ConfigError(f"{what}: {num_blocks} blocks x {block_len} B need about "
                          f"{_size(need)}, more than the {_size(have)} of memory available")


def require_data_plane() -> None:
    """Import numpy, torch and NIXL now, so that a missing one is one clear error.

    Raises:
        TransportError: naming the import that failed (its own text) and the pip command.
    """
    for module in ("numpy", "torch"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise TransportError(f"the NIXL data plane needs {module}: {exc}; "
                                 f"install it with {NIXL_INSTALL_HINT}") from None
    failures: list[str] = []
    for module in ("nixl._api", "nixl_cu12._api"):
        try:
            importlib.import_module(module)
            return
        except ModuleNotFoundError as exc:
            top = module.split(".")[0]
            if exc.name in (top, module):
                continue  # that distribution is simply not installed
            failures.append(f"{module}: {exc}")
        except (ImportError, OSError) as exc:
            failures.append(f"{module}: {exc}")
    reason = "; ".join(failures) if failures else "No module named 'nixl_cu12'"
    raise TransportError(f"NIXL cannot be imported ({reason}); "
                         f"install it with {NIXL_INSTALL_HINT}")


def fill_demo_region(node: Node, count: int) -> None:
    """Store demo blocks 0..count-1 at their own index."""
    try:
        import torch
    except ImportError as exc:
        raise TransportError(f"the demo host needs torch: {exc}; "
                             f"install it with {NIXL_INSTALL_HINT}") from None

    bl = node.config.block_len
    region = node.region
    if region.device.type == "cpu":
        # Row by row through a numpy view: torch's own __setitem__ costs milliseconds a
        # row on a busy machine (seconds for a 256-block region), numpy's microseconds.
        rows = region.numpy()
        for i in range(count):
            rows[i] = memoryview(demo_block(i, bl))
        return
    for i in range(count):
        region[i] = torch.frombuffer(bytearray(demo_block(i, bl)), dtype=torch.uint8)


class DemoServer:
    """Serves demo blocks 0..num_blocks-1 from ``node``; those in ``hold_back`` only
    ``late_after`` seconds after a request first asks for them (:mod:`p2pfsm.tools.demo.holdback`:
    fetched, they wait as demand; looked up, they stay pending)."""

    def __init__(self, config: NodeConfig, hold_back: Sequence[int] = (),
                 late_after: float = 1.0) -> None:
        from p2pfsm.executor.node import Node
        from p2pfsm.tools.demo.holdback import HoldBack

        if config.num_blocks > MAX_BLOCKS:
            raise ConfigError(f"num_blocks: {config.num_blocks}, more than the protocol's "
                              f"{MAX_BLOCKS}")
        self.held = {demo_key(i): i for i in range(config.num_blocks)}
        self.hold = HoldBack(hold_back, late_after) if hold_back else None
        self.node = Node(config, on_lookup=self._on_lookup, on_fetch=self._on_fetch)
        fill_demo_region(self.node, config.num_blocks)

    def _on_fetch(self, peer_id: str, fetch: FetchArrived) -> None:
        wanted = fetch.missing  # keys a supply or the lookup's pins already cover are out
        keys = [k for k in wanted if k in self.held]
        late = [] if self.hold is None else self.hold.late(peer_id, fetch.kv_request_id, keys)
        if late and self.hold is not None:  # stored later: they wait as demand till then
            self.hold.later(peer_id, fetch.kv_request_id,
                            lambda: self._supply_late(peer_id, fetch.kv_request_id, late))
        now = [k for k in keys if k not in late]
        if now:
            self.node.supply(peer_id, fetch.kv_request_id, now, [self.held[k] for k in now])
        if len(keys) < len(wanted):
            # Blocks we do not hold: no supply will ever come, so let this round fail now
            # (transfer_done(false) once our writes have landed) instead of at its
            # deadline. Only the round: the peer may go on with the request.
            self.node.decline(peer_id, fetch.kv_request_id, fetch.round_seq)

    def _supply_late(self, peer_id: str, kv_request_id: str, keys: list[bytes]) -> None:
        # The session may have ended meanwhile: nobody waits for these blocks any more.
        with contextlib.suppress(P2PFSMError):
            self.node.supply(peer_id, kv_request_id, keys, [self.held[k] for k in keys])

    def _on_lookup(self, peer_id: str, req: LookupAsk) -> LookupAnswer:
        hits = {k: self.held[k] for k in req.keys if k in self.held}
        late = [] if self.hold is None else self.hold.late(peer_id, req.kv_request_id, hits)
        if late and self.hold is not None:
            for k in late:
                del hits[k]
            stored = {k: self.held[k] for k in late}
            self.hold.later(peer_id, req.kv_request_id,
                            lambda: self._resolve_late(peer_id, req.token, stored))
        return hits, late

    def _resolve_late(self, peer_id: str, token: int, hits: dict[bytes, int]) -> None:
        with contextlib.suppress(P2PFSMError):  # the lookup or its session ended meanwhile
            self.node.resolve_lookup(peer_id, token, hits)

    def serve(self, stop: Callable[[], bool]) -> None:
        """Run the node until ``stop()``, storing held-back blocks as they fall due."""
        if self.hold is None:
            self.node.serve(stop)
            return
        while not stop() and not self.node.closed:
            due = self.hold.next_due()
            wait = 1.0 if due is None else min(1.0, max(0.0, due - time.monotonic()))
            self.node.step(wait)
            self.hold.run_due()


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
    reason: str | None = None
    """The failed LoadResult's reason (``FailReason``), None on success."""
    detail: str | None = None
    """The failed LoadResult's own words (peer, keys, cause)."""


def run_fetch(node: Node, peer_id: str, blocks: Sequence[int], mode: str,
              handshake_timeout: float, request_id: str = "p2pfsm-fetch-0") -> FetchReport:
    """Connect, fetch ``blocks`` (pd: directly; sym: lookup first), verify every byte.

    A failed fetch's report names why in ``error``: the keys the peer does not hold
    (asked with a lookup once the fetch has failed), the end of the session, or a
    transfer that failed although the peer holds every key.
    """
    session = node.connect(peer_id)
    node.run_until(lambda: session.ready or not session.alive, handshake_timeout)
    if not session.ready:
        dead = node.deaths.get(peer_id)
        if dead is not None and dead.mismatch is not None:
            raise ConfigError(f"{peer_id} is incompatible: {dead.mismatch}")
        why = dead.reason if dead is not None else "handshake timed out"
        raise TransportError(f"cannot reach {peer_id}: {why}")
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
    reason: str | None = None
    detail: str | None = None
    if chosen:
        load = node.fetch(peer_id, request_id, [demo_key(b) for b in chosen], dest)
        limit = node.config.timeouts.load + 3 * node.config.timeouts.abort_ack + 5
        node.run_until(load.done, limit)
        if not load.done():
            raise TransportError(f"no result from {peer_id} within {limit:.0f} s")
        result = load.result()
        success = result.success
        if not success:
            reason = None if result.reason is None else result.reason.value
            detail = result.detail
    seconds = time.perf_counter() - t0
    if mode == "sym":
        node.finish(peer_id, request_id)
    error: str | None = None
    verified = success
    if success:
        bl = node.config.block_len
        wrong = [b for d, b in zip(dest, chosen, strict=True)
                 if bytes(node.region[d].numpy()) != demo_block(b, bl)]
        verified = not wrong
        if wrong:
            error = f"blocks {format_keys(wrong)} arrived with the wrong content"
    else:
        error = why_fetch_failed(node, peer_id, f"{request_id}-why", chosen)
    return FetchReport(success, verified, len(chosen) * node.config.block_len if success else 0,
                       seconds, len(blocks), hits, error, reason, detail)


def why_fetch_failed(node: Node, peer_id: str, request_id: str, blocks: Sequence[int]) -> str:
    """Why a fetch of ``blocks`` from ``peer_id`` failed, in words: the session's end,
    or (asked now with a lookup under ``request_id``) the keys the peer does not hold."""
    session = node.sessions.get(peer_id)
    if session is None or not session.alive:
        dead = node.deaths.get(peer_id)
        return f"the session to {peer_id} ended: {dead.reason if dead else 'closed'}"
    lookup = node.lookup(peer_id, request_id, [demo_key(b) for b in blocks])
    try:
        node.run_until(lookup.done, node.config.timeouts.lookup + 5)
    finally:
        if session.alive:
            node.finish(peer_id, request_id)
    answer = lookup.result() if lookup.done() else None
    if answer is None or not answer.answered:
        return f"the fetch failed and {peer_id} did not answer a lookup of its keys"
    missing = [b for b, hit in zip(blocks, answer.hits, strict=True) if not hit]
    if missing:
        return f"peer has no blocks for keys {format_keys(missing)}"
    return f"the transfer failed although {peer_id} holds every key"
