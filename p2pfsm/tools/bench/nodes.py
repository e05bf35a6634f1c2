"""The bench's nodes: one way to configure one, connect it, and time verified fetches.

Every bench node binds an ephemeral loopback port (:func:`config`); :func:`connect`
waits for a handshake; a :class:`Fetcher` fetches demo blocks into the same indexes and
checks them.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import TransportError

if TYPE_CHECKING:
    from p2pfsm.executor.node import Node, NodeConfig
    from p2pfsm.executor.node.jobs import JobFuture
    from p2pfsm.session import LoadResult

__all__ = ["Fetcher", "config", "connect"]

LOOPBACK = "tcp://127.0.0.1:0"


def config(blocks: int, block_len: int, **options: Any) -> NodeConfig:
    """A bench node's configuration: ``blocks`` of ``block_len`` bytes on an ephemeral
    loopback port; ``options`` are further :class:`NodeConfig` fields."""
    from p2pfsm.executor.node import NodeConfig

    return NodeConfig(LOOPBACK, blocks, block_len, **options)


def connect(node: Node, peer_id: str, timeout: float = 30.0) -> float:
    """Connect ``node`` to ``peer_id`` and step it until the handshake is done; its seconds.
    A TransportError when the session dies or ``timeout`` passes first."""
    t0 = time.perf_counter()
    session = node.connect(peer_id)
    node.run_until(lambda: session.ready or not session.alive, timeout)
    if not session.ready:
        raise TransportError(f"bench: no handshake with {peer_id}: {node.deaths.get(peer_id)}")
    return time.perf_counter() - t0


class Fetcher:
    """Times whole fetches of demo blocks ``first..first+count-1`` into the same indexes."""

    def __init__(self, node: Node, peer_id: str, count: int, tag: str, first: int = 0) -> None:
        self.node, self.peer_id, self.tag, self.n = node, peer_id, tag, 0
        self.keys = [demo_key(i) for i in range(first, first + count)]
        self.dest = list(range(first, first + count))
        self._want: Any = None

    def start(self) -> JobFuture[LoadResult]:
        """Send one fetch; its future."""
        self.n += 1
        return self.node.fetch(self.peer_id, f"bench-{self.tag}-{self.n}", self.keys, self.dest)

    def once(self) -> float:
        """One fetch, stepped to its end and checked; its seconds."""
        t0 = time.perf_counter()
        fut = self.start()
        self.node.run_until(fut.done, 30.0)
        elapsed = time.perf_counter() - t0
        self.check(fut)
        return elapsed

    def check(self, fut: JobFuture[LoadResult]) -> None:
        """Raise unless ``fut`` is a successful fetch."""
        if not fut.done() or not fut.result().success:
            raise TransportError(f"bench fetch {self.tag} {self.n} failed: "
                                 f"{fut.result() if fut.done() else 'no result'}")

    def clear(self) -> None:
        """Zero our destination blocks, so that the next :meth:`verify` sees only what the
        next fetch delivered."""
        self.node.region[self.dest[0]:self.dest[-1] + 1].zero_()

    def verify(self) -> None:
        """Raise unless our destination blocks hold exactly the demo blocks fetched (the
        expected bytes are computed once, then compared as one array)."""
        import numpy as np

        if self._want is None:
            bl = self.node.config.block_len
            self._want = np.frombuffer(b"".join(demo_block(i, bl) for i in self.dest),
                                       dtype=np.uint8).reshape(len(self.dest), bl)
        got = self.node.region[self.dest[0]:self.dest[-1] + 1].numpy()
        if not np.array_equal(got, self._want):
            wrong = next(i for i, (a, b) in enumerate(zip(got, self._want, strict=True))
                         if not np.array_equal(a, b))
            raise TransportError(f"bench fetch delivered a wrong block {self.dest[wrong]}")
