"""Child-process entry points for the Node tests, and a Node that keeps a record.

:func:`peer_main` runs a :class:`RecordingNode` that serves demo blocks (block ``i`` of
the demo model at index ``i``, for ``i < held``) in a process of its own, driven by one
event loop that also reads commands from the test over a pipe. Its ``on_fetch`` supplies
what it holds at once, except keys the test told it to withhold: those are parked and
supplied on the ``release`` command (the demand path). It reports every fetch it hears
of and every store result, so the test can wait on them instead of sleeping.

Commands (tuples) and replies:

* ``("stop",)`` -> ends the loop, closes the node.
* ``("withhold", [block numbers])`` -> ``("withholding", n)``.
* ``("release",)`` -> supplies every parked key -> ``("released", n)``.
* ``("forget",)`` -> drops parked keys without supplying them -> ``("forgot", n)``.
* ``("finish", peer_id, kv_request_id)`` -> ``("finished",)``.
* ``("state",)`` -> ``("state", PeerState)``.

Unprompted reports: ``("ready", local_id)``, ``("fetch", peer_id, kv_request_id,
supplied, parked)``, ``("store", kv_request_id, success)``.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from p2pfsm.demo_blocks import demo_key
from p2pfsm.executor.node import LookupAnswer, LookupAsk, Node, NodeConfig
from p2pfsm.executor.node.effects import NodeEffects
from p2pfsm.protocol import decode
from p2pfsm.session import (
    FetchArrived,
    LoadResult,
    Session,
    StoreResult,
)
from p2pfsm.tools.demo.host import fill_demo_region


class _RecordingEffects(NodeEffects):
    """Effects that keep every load and store result its sessions emit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.results: list[LoadResult | StoreResult] = []

    def load_result(self, peer: str, out: LoadResult) -> None:
        self.results.append(out)
        super().load_result(peer, out)

    def store_result(self, peer: str, out: StoreResult) -> None:
        self.results.append(out)
        super().store_result(peer, out)


class RecordingNode(Node):
    """A Node that counts the sessions it opens, the job results its sessions emit and
    the message types it receives, per peer (for "exactly one result" checks)."""

    _effects_part = _RecordingEffects

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert isinstance(self._effects, _RecordingEffects)
        self.results = self._effects.results
        self.opened: collections.Counter[str] = collections.Counter()
        self.received: dict[str, list[str]] = collections.defaultdict(list)
        peers = self._peers
        new_session, on_frame = peers.new_session, peers.on_frame

        def opening(peer_id: str) -> Session:
            self.opened[peer_id] += 1
            return new_session(peer_id)

        def receiving(peer_id: str, frame: bytes, conn: int = -1) -> None:
            try:
                self.received[peer_id].append(decode(frame).TYPE)
            except Exception:  # a bad frame is the record's "?", the session's business
                self.received[peer_id].append("?")
            on_frame(peer_id, frame, conn)

        peers.new_session = opening  # type: ignore[method-assign]
        peers.on_frame = receiving  # type: ignore[method-assign]


@dataclass
class PeerState:
    """What ``("state",)`` returns: the node's view of each peer."""

    local_id: str
    states: dict[str, str]
    deaths: dict[str, str]
    mismatch_fields: dict[str, str]
    opened: dict[str, int]
    received: dict[str, list[str]]
    data_peers: tuple[str, ...]
    open_counts: dict[str, dict[str, int]]
    violations: int
    results: list[tuple[str, int, bool]] = field(default_factory=list)


def _state(node: RecordingNode) -> PeerState:
    return PeerState(
        local_id=node.local_id,
        states={p: s.state for p, s in node.sessions.items()},
        deaths={p: d.reason for p, d in node.deaths.items()},
        mismatch_fields={p: d.mismatch.field for p, d in node.deaths.items()
                         if d.mismatch is not None},
        opened=dict(node.opened),
        received=dict(node.received),
        data_peers=node.data.peers,
        open_counts={p: s.open_counts() for p, s in node.sessions.items()},
        violations=len(node.violations),
        results=[(type(r).__name__, r.job_id, r.success) for r in node.results],
    )


def peer_main(conn: Connection, config: NodeConfig, held: int,
              withhold: Iterable[int] = ()) -> None:
    """Serve demo blocks ``0..held-1`` until told to stop (see the module docstring)."""
    keep_back = {demo_key(i) for i in withhold}
    index = {demo_key(i): i for i in range(held)}
    parked: list[tuple[str, str, list[bytes]]] = []
    pinned: set[tuple[str, str, int]] = set()
    node: RecordingNode

    def supply(peer_id: str, rid: str, keys: list[bytes]) -> None:
        fut = node.supply(peer_id, rid, keys, [index[k] for k in keys])

        def report(done: Future[StoreResult]) -> None:
            ok = done.exception() is None and done.result().success
            with contextlib.suppress(OSError, ValueError):  # the test may be gone
                conn.send(("store", rid, ok))

        fut.add_done_callback(report)

    def on_fetch(peer_id: str, fetch: FetchArrived) -> None:
        if (peer_id, fetch.kv_request_id, fetch.round_seq) in pinned:
            # Our lookup answer pinned this round's blocks: it is served from those.
            pinned.discard((peer_id, fetch.kv_request_id, fetch.round_seq))
            conn.send(("fetch", peer_id, fetch.kv_request_id, 0, 0))
            return
        now = [k for k in fetch.keys if k in index and k not in keep_back]
        later = [k for k in fetch.keys if k in index and k in keep_back]
        if later:
            parked.append((peer_id, fetch.kv_request_id, later))
        if now:
            supply(peer_id, fetch.kv_request_id, now)
        conn.send(("fetch", peer_id, fetch.kv_request_id, len(now), len(later)))

    def on_lookup(peer_id: str, req: LookupAsk) -> LookupAnswer:
        hits = {k: index[k] for k in req.keys if k in index}
        if hits:
            pinned.add((peer_id, req.kv_request_id, req.round_seq))
        return hits, frozenset()

    node = RecordingNode(config, on_lookup=on_lookup, on_fetch=on_fetch)
    try:
        fill_demo_region(node, held)
        conn.send(("ready", node.local_id))
        while True:
            if conn.poll(0):
                cmd = conn.recv()
                if cmd[0] == "stop":
                    break
                if cmd[0] == "withhold":
                    keep_back = {demo_key(i) for i in cmd[1]}
                    conn.send(("withholding", len(keep_back)))
                elif cmd[0] == "release":
                    batch, parked[:] = list(parked), []
                    for peer_id, rid, keys in batch:
                        supply(peer_id, rid, keys)
                    conn.send(("released", sum(len(k) for _, _, k in batch)))
                elif cmd[0] == "forget":
                    conn.send(("forgot", len(parked)))
                    parked.clear()
                elif cmd[0] == "finish":
                    node.finish(cmd[1], cmd[2])
                    conn.send(("finished",))
                elif cmd[0] == "state":
                    conn.send(("state", _state(node)))
            # The loop's only wait: ZeroMQ, for at most 20 ms (and never past the next
            # timer or data-plane progress deadline), so commands are seen promptly.
            node.step(0.02)
    finally:
        node.close()
