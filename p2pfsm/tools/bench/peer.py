"""The bench's peer process: a producer node (a :class:`~p2pfsm.tools.demo.host.DemoServer`)
in a spawned process, plus the raw operations the suites compare fetches against.

:class:`Peer` starts it and asks it, over a pipe, for a node of a shape (``node``), a
bare region (``region``), none (``drop``), raw NIXL WRITEs into a node of ours
(``raw_write``), raw ZeroMQ echo and REQ/REP partners (``echo_setup``, ``echo``,
``rep_setup``, ``rep``) and its idle CPU (``idle``). Leaving it stops and reaps it.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from p2pfsm.errors import TransportError
from p2pfsm.tools.bench import nodes
from p2pfsm.tools.bench.procs import Child

if TYPE_CHECKING:
    from p2pfsm.executor.node import Node

__all__ = ["Peer", "idle_cpu", "node_pair"]

_REPLY_TIMEOUT = 60.0
_IDLE_INTERVAL_MS = 10
"""A progress interval at least this long means the data plane is at its idle pace
(the default pace is 1 ms busy and 50 ms idle)."""


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def idle_cpu(node: Node, seconds: float) -> tuple[float, float]:
    """Run the node's loop until its data plane is at its idle pace, then for ``seconds``
    more; return (seconds it took to get idle, CPU fraction of one core while idle)."""
    t0 = time.monotonic()
    while node.data.progress_interval_ms < _IDLE_INTERVAL_MS and time.monotonic() - t0 < 30.0:
        node.step(1.0)
    settle = time.monotonic() - t0
    cpu0, wall0 = _cpu_seconds(), time.monotonic()
    while time.monotonic() - wall0 < seconds:
        node.step(1.0)
    return settle, (_cpu_seconds() - cpu0) / (time.monotonic() - wall0)


def _raw_writes(node: Node, peer_id: str, count: int, nblocks: int | None = None) -> list[float]:
    """``count`` raw WRITEs of our first ``nblocks`` blocks (default: every block) into
    the same blocks of the peer."""
    blocks = list(range(node.config.num_blocks if nblocks is None else nblocks))
    times = []
    for k in range(count):
        t0 = time.perf_counter()
        xfer = ("raw", k)  # the node's own WRITEs are named (session, xfer)
        node.data.write(xfer, peer_id, blocks, blocks)
        while True:
            done = dict(node.data.poll())
            if xfer in done:
                break
            if time.perf_counter() - t0 > _REPLY_TIMEOUT:
                raise TransportError("raw WRITE: no outcome within 60 s")
        times.append(time.perf_counter() - t0)
        if not done[xfer]:
            raise TransportError("raw WRITE failed")
    return times


class _Bare:
    """A node with a region and no blocks to serve (for the region handshake)."""

    def __init__(self, blocks: int, block_len: int) -> None:
        from p2pfsm.executor.node import Node

        t0 = time.perf_counter()
        self.node = Node(nodes.config(blocks, block_len))
        self.setup_s = time.perf_counter() - t0


def _peer_main(conn: Connection) -> None:
    """The producer process: one DemoServer (or bare node) at a time, plus raw operations
    on demand."""
    import gc

    import zmq

    from p2pfsm.tools.demo.host import DemoServer

    server: DemoServer | _Bare | None = None
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router: zmq.Socket[bytes] | None = None
    dealer: zmq.Socket[bytes] | None = None
    rep: zmq.Socket[bytes] | None = None
    conn.send(("ready",))
    try:
        while True:
            if server is not None:
                server.node.step(0.05)
                if not conn.poll(0):
                    continue
            cmd = conn.recv()
            if cmd[0] == "stop":
                return
            if cmd[0] in ("node", "region", "drop"):
                if server is not None:
                    server.node.close()
                    server = None
                    gc.collect()  # a large region goes back now, not at some later cycle
                if cmd[0] == "node":
                    server = DemoServer(nodes.config(cmd[1], cmd[2]))
                    conn.send(("node", server.node.local_id))
                elif cmd[0] == "region":
                    server = bare = _Bare(cmd[1], cmd[2])
                    conn.send(("region", bare.node.local_id, bare.setup_s))
                else:
                    conn.send(("drop",))
            elif cmd[0] == "raw_write":
                assert server is not None
                conn.send(("raw_write", _raw_writes(server.node, cmd[1], *cmd[2:4])))
            elif cmd[0] == "echo_setup":
                router = ctx.socket(zmq.ROUTER)
                port = router.bind_to_random_port("tcp://127.0.0.1")
                dealer = ctx.socket(zmq.DEALER)
                dealer.setsockopt(zmq.IDENTITY, f"127.0.0.1:{port}".encode())
                dealer.connect(cmd[1])
                conn.send(("echo_setup", f"tcp://127.0.0.1:{port}"))
            elif cmd[0] == "echo":
                assert router is not None and dealer is not None
                for _ in range(cmd[1]):
                    if not router.poll(10_000):
                        raise TransportError("raw echo: no frame within 10 s")
                    _ident, frame = router.recv_multipart()
                    dealer.send(frame)
                conn.send(("echo", cmd[1]))
            elif cmd[0] == "rep_setup":
                rep = ctx.socket(zmq.REP)
                rep_port = rep.bind_to_random_port("tcp://127.0.0.1")
                conn.send(("rep_setup", f"tcp://127.0.0.1:{rep_port}"))
            elif cmd[0] == "rep":
                assert rep is not None
                for _ in range(cmd[1]):
                    if not rep.poll(10_000):
                        raise TransportError("raw REQ/REP: no request within 10 s")
                    rep.send(rep.recv())
                conn.send(("rep", cmd[1]))
            elif cmd[0] == "idle":
                assert server is not None
                settle, cpu = idle_cpu(server.node, cmd[1])
                conn.send(("idle", settle, cpu))
    finally:
        if server is not None:
            server.node.close()
        for sock in (router, dealer, rep):
            if sock is not None:
                sock.close(linger=0)
        ctx.term()


class Peer(Child):
    """The peer process, started and ready."""

    def __init__(self) -> None:
        super().__init__(_peer_main, "p2pfsm-bench-peer")
        self.expect("ready", _REPLY_TIMEOUT)

    def ask(self, *cmd: Any, timeout: float = _REPLY_TIMEOUT,
            pump: Callable[[], object] | None = None, node: Node | None = None
            ) -> tuple[Any, ...]:
        """Send ``cmd``; the reply tagged ``cmd[0]``, calling ``pump`` as fast as it can
        or stepping ``node`` at its own pace meanwhile."""
        if pump is None and node is not None:
            pump = lambda: node.step(0.001)  # noqa: E731
        return super().ask(*cmd, timeout=timeout, pump=pump)

    def wait(self, tag: str, node: Node | None = None) -> tuple[Any, ...]:
        """The reply tagged ``tag`` to a command sent on :attr:`conn`, stepping ``node``."""
        return self.expect(tag, _REPLY_TIMEOUT,
                           None if node is None else lambda: node.step(0.001))


def node_pair(peer: Peer, shape: tuple[int, int]) -> tuple[Node, str]:
    """A consumer node here, connected to a fresh producer node of ``shape`` (blocks,
    block length) in ``peer``; the node and the producer's id."""
    from p2pfsm.executor.node import Node

    (_, peer_id) = peer.ask("node", *shape)
    node = Node(nodes.config(*shape))
    try:
        nodes.connect(node, peer_id)
    except BaseException:
        node.close()
        raise
    return node, peer_id
