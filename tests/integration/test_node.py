"""Node between real processes on 127.0.0.1: ZeroMQ control plane, NIXL data plane,
sessions driven by the Node's event loop.

The test process runs the consumer node(s); the peers run :func:`node_peers.peer_main`
in spawned children. Every wait is bounded and names what it waited for; the test's node
keeps stepping while it waits for a child, since the first NIXL WRITE into a process
needs that process to progress UCX.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.node import Node, NodeConfig
from p2pfsm.executor.node.effects import NodeEffects
from p2pfsm.session import FailReason, LoadResult, Timeouts

from . import Child
from .node_peers import PeerState, RecordingNode, peer_main

torch = needs_nixl_and_torch()

BLOCK = 16 * 1024
FINGERPRINT = "0123456789abcdef"
HELD = 48  # the server holds demo blocks 0..47 of its 64
FAST_HEARTBEATS: dict[str, Any] = {"heartbeat_ivl_ms": 100, "heartbeat_timeout_ms": 600}


def config(bind: str = "tcp://127.0.0.1:0", num_blocks: int = 64, **kw: Any) -> NodeConfig:
    kw.setdefault("block_len", BLOCK)
    kw.setdefault("fingerprint", FINGERPRINT)
    return NodeConfig(bind, num_blocks, **kw)


def drive(node: RecordingNode, done: Callable[[], bool], timeout: float, what: str) -> None:
    """Run ``node``'s loop until ``done()``; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {what} within {timeout:.1f} s; deaths={node.deaths}")
        node.step(min(left, 0.05))


class Peer:
    """A peer process and what it reported but nobody has asked for yet."""

    def __init__(self, child: Child, peer_id: str) -> None:
        self.child = child
        self.id = peer_id
        self.inbox: list[tuple[Any, ...]] = []

    @property
    def pid(self) -> int:
        return self.child.pid

    def wait(self, node: RecordingNode, tag: str, rid: str | None = None,
             timeout: float = 10.0) -> tuple[Any, ...]:
        """The first report ``tag`` (about request ``rid``), stepping ``node`` meanwhile."""

        def wanted(msg: tuple[Any, ...]) -> bool:
            return msg[0] == tag and (rid is None or rid in msg)

        for k, msg in enumerate(self.inbox):
            if wanted(msg):
                return self.inbox.pop(k)
        deadline = time.monotonic() + timeout
        while True:
            while self.child.conn.poll(0):
                msg = self.child.recv(1.0, repr(tag))
                if wanted(msg):
                    return tuple(msg)
                self.inbox.append(msg)
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.child.name}: no {tag!r} {rid or ''} within "
                                     f"{timeout:.1f} s; unclaimed reports: {self.inbox!r}")
            node.step(0.005)

    def ask(self, node: RecordingNode, *cmd: Any, reply: str) -> tuple[Any, ...]:
        self.child.send(*cmd)
        return self.wait(node, reply)

    def state(self, node: RecordingNode) -> PeerState:
        state = self.ask(node, "state", reply="state")[1]
        assert isinstance(state, PeerState)
        return state

    def eventually(self, node: RecordingNode, check: Callable[[PeerState], bool],
                   what: str, timeout: float = 10.0) -> PeerState:
        deadline = time.monotonic() + timeout
        while not check(state := self.state(node)):
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.child.name}: no {what} within {timeout:.1f} s; "
                                     f"state {state!r}")
        return state


def start_peer(children: list[Child], name: str, cfg: NodeConfig, held: int = HELD) -> Peer:
    child = Child(peer_main, cfg, held, name=name)
    children.append(child)
    (_, peer_id) = child.expect("ready", 60.0)
    return Peer(child, peer_id)


@pytest.fixture(scope="module")
def server() -> Iterator[Peer]:
    """One serving peer shared by the tests that leave it healthy."""
    started: list[Child] = []
    try:
        yield start_peer(started, "server", config(timeouts=Timeouts(load=5.0, abort_ack=2.0)))
    finally:
        for child in started:
            child.stop()


@pytest.fixture
def nodes() -> Iterator[Callable[..., RecordingNode]]:
    made: list[RecordingNode] = []

    def make(**kw: Any) -> RecordingNode:
        node = RecordingNode(config(**kw))
        made.append(node)
        return node

    try:
        yield make
    finally:
        for node in made:
            node.close(timeout=2.0)


def connected(node: RecordingNode, peer: Peer) -> RecordingNode:
    session = node.connect(peer.id)
    drive(node, lambda: session.ready or not session.alive, 20.0, f"handshake with {peer.id}")
    assert session.ready, node.deaths.get(peer.id)
    return node


def keys_of(blocks: list[int]) -> list[bytes]:
    return [demo_key(b) for b in blocks]


def assert_blocks(node: RecordingNode, dest: list[int], blocks: list[int]) -> None:
    for d, b in zip(dest, blocks, strict=True):
        assert bytes(node.region[d].numpy()) == demo_block(b, BLOCK), f"block {d} != demo {b}"


def assert_zero(node: RecordingNode, indexes: list[int]) -> None:
    zero = bytes(BLOCK)
    for d in indexes:
        assert bytes(node.region[d].numpy()) == zero, f"block {d} was written"


def one_result_per_job(node: RecordingNode) -> list[int]:
    jobs = [r.job_id for r in node.results]
    assert len(jobs) == len(set(jobs)), f"a job got two results: {node.results!r}"
    return jobs


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- a healthy pair ----------------------------------------------------------------------


def test_handshake(server: Peer, nodes: Callable[..., RecordingNode]) -> None:
    node = connected(nodes(), server)
    st = server.eventually(node, lambda st: st.states.get(node.local_id) == "ready",
                           "server-side ready session")
    assert node.received[server.id][:2] == ["connect", "connect_ack"]
    assert st.received[node.local_id][:2] == ["connect", "connect_ack"]
    assert server.id in node.data.peers and node.local_id in st.data_peers
    assert node.opened[server.id] == 1 and st.opened[node.local_id] == 1
    assert not node.violations and st.violations == 0


def test_pd_fetch_is_byte_exact(server: Peer, nodes: Callable[..., RecordingNode]) -> None:
    node = connected(nodes(), server)
    blocks = list(range(40))
    dest = [63 - b for b in blocks]  # scattered: block b lands at 63 - b
    fut = node.fetch(server.id, "pd-1", keys_of(blocks), dest)
    drive(node, fut.done, 20.0, "result of the PD fetch")
    result = fut.result()
    assert result.success and result.released, result
    assert_blocks(node, dest, blocks)
    assert_zero(node, list(range(24)))
    assert server.wait(node, "fetch", "pd-1")[3:] == (40, 0)
    assert server.wait(node, "store", "pd-1") == ("store", "pd-1", True)
    assert one_result_per_job(node) == [result.job_id]
    assert "transfer_done" in node.received[server.id]


def test_demand_path_supplies_late_keys(server: Peer,
                                        nodes: Callable[..., RecordingNode]) -> None:
    """The server holds back some keys at fetch time and supplies them on command."""
    node = connected(nodes(), server)
    server.ask(node, "withhold", [5, 6, 7], reply="withholding")
    try:
        blocks = list(range(10))
        fut = node.fetch(server.id, "demand-1", keys_of(blocks), blocks)
        assert server.wait(node, "fetch", "demand-1")[3:] == (7, 3)
        assert not fut.done(), "the load finished without the withheld blocks"
        assert server.ask(node, "release", reply="released")[1] == 3
        drive(node, fut.done, 20.0, "result of the demand-path fetch")
        result = fut.result()
        assert result.success and result.released, result
        assert_blocks(node, blocks, blocks)
        assert server.wait(node, "store", "demand-1")[2] is True
        assert server.wait(node, "store", "demand-1")[2] is True
    finally:
        server.ask(node, "withhold", [], reply="withholding")


def test_lookup_then_fetch_the_hits(server: Peer, nodes: Callable[..., RecordingNode]) -> None:
    node = connected(nodes(), server)
    asked = [3, 60, 7, 10_000]  # 60 is outside what the server holds, 10 000 unknown
    lookup = node.lookup(server.id, "sym-1", keys_of(asked))
    drive(node, lookup.done, 20.0, "lookup answer")
    answer = lookup.result()
    assert answer.answered and answer.hits == (True, False, True, False), answer
    fut = node.fetch(server.id, "sym-1", keys_of([3, 7]), [10, 11])
    drive(node, fut.done, 20.0, "result of the fetch of the hits")
    result = fut.result()
    assert result.success and result.released, result
    assert_blocks(node, [10, 11], [3, 7])
    node.finish(server.id, "sym-1")
    st = server.eventually(
        node, lambda st: not any(st.open_counts.get(node.local_id, {"?": 1}).values()),
        "server-side rounds and lookups closed after finish")
    assert st.violations == 0 and not node.violations
    assert "lookup_resp" in node.received[server.id]


def test_abort_after_load_timeout(server: Peer, nodes: Callable[..., RecordingNode]) -> None:
    node = connected(nodes(timeouts=Timeouts(load=0.3, abort_ack=1.0)), server)
    start = time.monotonic()
    fut = node.fetch(server.id, "abort-1", keys_of([HELD + 2]), [0])  # not held
    assert server.wait(node, "fetch", "abort-1")[3:] == (0, 0)
    drive(node, fut.done, 10.0, "result of the aborted fetch")
    elapsed = time.monotonic() - start
    result = fut.result()
    assert not result.success and result.released, result
    assert elapsed >= 0.3
    assert "abort_ack" in node.received[server.id]
    st = server.state(node)
    assert "abort_fetch" in st.received[node.local_id]
    assert_zero(node, [0])
    # The session survives an abort: the next fetch works.
    assert node.session(server.id).ready
    again = node.fetch(server.id, "abort-2", keys_of([1]), [1])
    drive(node, again.done, 20.0, "fetch after an abort")
    assert again.result().success
    assert_blocks(node, [1], [1])
    one_result_per_job(node)


def test_host_finish_on_either_side(server: Peer, nodes: Callable[..., RecordingNode]) -> None:
    # The load deadline (120 s) is far past every wait below: what ends a load here is
    # the finish under test, never its deadline.
    node = connected(nodes(timeouts=Timeouts(load=120.0, abort_ack=2.0)), server)
    server.ask(node, "withhold", [20], reply="withholding")
    try:
        # Our host finishes while its load waits: abort, abort_ack, released failure.
        mine = node.fetch(server.id, "finish-c", keys_of([20]), [0])
        assert server.wait(node, "fetch", "finish-c")[3:] == (0, 1)
        node.finish(server.id, "finish-c")
        drive(node, mine.done, 60.0, "result after our finish")
        result = mine.result()
        assert not result.success and result.released, result
        assert "abort_ack" in node.received[server.id]
        server.ask(node, "forget", reply="forgot")

        # The server's host finishes a half-supplied request: transfer_done(failure).
        theirs = node.fetch(server.id, "finish-s", keys_of([20, 21]), [1, 2])
        assert server.wait(node, "fetch", "finish-s")[3:] == (1, 1)
        server.ask(node, "finish", node.local_id, "finish-s", reply="finished")
        drive(node, theirs.done, 60.0, "result after the server's finish")
        result = theirs.result()
        assert not result.success and result.released, result
        assert node.received[server.id].count("transfer_done") == 1
        assert server.wait(node, "store", "finish-s") == ("store", "finish-s", False)
        assert node.session(server.id).ready
        one_result_per_job(node)
    finally:
        server.ask(node, "forget", reply="forgot")
        server.ask(node, "withhold", [], reply="withholding")


# -- peers that cannot or should not talk --------------------------------------------------


@pytest.mark.parametrize(
    ("field", "override"),
    [
        ("block_len", {"block_len": 2 * BLOCK}),
        ("hash_seed", {"hash_seed": "another-seed"}),
        ("config_fingerprint", {"fingerprint": "fedcba9876543210"}),
    ],
)
def test_mismatched_peers_never_transfer(server: Peer, nodes: Callable[..., RecordingNode],
                                         field: str, override: dict[str, Any]) -> None:
    node = nodes(**override)
    session = node.connect(server.id)
    drive(node, lambda: not session.alive, 20.0, "the mismatch to end the session")
    dead = node.deaths[server.id]
    assert dead.mismatch is not None and dead.mismatch.field == field, dead
    assert dead.reason.startswith("incompatible peer") and field in dead.reason

    # Both sides have seen the other's disconnect: neither restarts the session on it.
    st = server.eventually(node, lambda st: "disconnect" in st.received.get(node.local_id, ()),
                           "our disconnect at the server")
    drive(node, lambda: "disconnect" in node.received[server.id], 10.0, "server's disconnect")
    st = server.state(node)
    assert st.mismatch_fields[node.local_id] == field
    assert st.deaths[node.local_id].startswith("incompatible peer")
    assert st.opened[node.local_id] == 1 and node.opened[server.id] == 1

    # No transfer: nothing registered on either side; a fetch fails at once.
    assert node.data.peers == () and node.local_id not in st.data_peers
    fut = node.fetch(server.id, "mismatch-1", keys_of([0]), [0])
    assert fut.done() and not fut.result().success
    assert "fetch" not in st.received[node.local_id]
    assert float(node.region.sum()) == 0


@pytest.mark.parametrize("redial", [True, False])
def test_refused_address_fails_at_once_saying_so(nodes: Callable[..., RecordingNode],
                                                 redial: bool) -> None:
    # Both deadlines far past the wait's bound: only the refusal itself can end it.
    node = nodes(timeouts=Timeouts(handshake=120.0, load=120.0), connect_timeout_ms=120_000,
                 **({} if redial else {"reconnect_backoff_s": None}))
    peer = f"127.0.0.1:{closed_port()}"
    session = node.connect(peer)
    fut = node.fetch(peer, "nowhere-1", keys_of([0]), [0])  # queued until ready
    drive(node, lambda: not session.alive, 30.0, "failure of the refusing peer")
    assert session.death_reason == "transport lost: connection refused"
    with pytest.raises(TransportError):
        node.connect("256.0.0.1:5555")
    if redial:
        # The node opens the session again (NodeConfig.reconnect_backoff_s, on by
        # default): the fetch, never sent, waits for a session up to its own deadline;
        # closing the node ends the wait, with the reason.
        assert not fut.done()
        node.close(timeout=2.0)
        assert fut.result().reason is FailReason.SESSION_ENDED, fut.result()
        assert "closed while it waited" in (fut.result().detail or ""), fut.result()
    assert fut.done() and not fut.result().success
    one_result_per_job(node)


def test_silent_address_fails_at_the_connect_timeout(
        nodes: Callable[..., RecordingNode]) -> None:
    """A listener that never speaks ZMTP: the TCP connect succeeds, so only
    ``connect_timeout_ms`` (well before the handshake deadline) ends the session."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # never accepted: the kernel completes TCP, nobody answers
        peer = f"127.0.0.1:{silent.getsockname()[1]}"
        node = nodes(timeouts=Timeouts(handshake=120.0), connect_timeout_ms=300)
        session = node.connect(peer)
        drive(node, lambda: not session.alive, 30.0, "failure of the silent peer")
    assert node.deaths[peer].reason == "transport lost: connect timeout"


class _RefusedEffects(NodeEffects):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("effects refused")


class _BrokenNode(Node):
    _effects_part = _RefusedEffects


def test_a_node_whose_part_fails_to_build_leaves_no_plane_open() -> None:
    """A part built after the planes raises: the error comes out, and both planes are
    closed (the port can be bound at once, while the error still holds the half-built
    node)."""
    bind = f"tcp://127.0.0.1:{closed_port()}"
    with pytest.raises(RuntimeError, match="effects refused") as failed:
        _BrokenNode(config(bind=bind))
    node = Node(config(bind=bind))  # "address in use" if the first ROUTER were open
    try:
        assert node.local_id.endswith(bind.rsplit(":", 1)[1])
    finally:
        node.close()
    assert failed.value is not None


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "10"])
def test_connect_timeout_is_validated(bad: object) -> None:
    with pytest.raises(ConfigError, match="connect_timeout_ms"):
        config(connect_timeout_ms=bad)


# -- peers that die ------------------------------------------------------------------------


def test_peer_killed_with_work_outstanding_then_restarted(
        children: list[Child], nodes: Callable[..., RecordingNode]) -> None:
    # The load deadline (120 s) is far past every wait below: the loads here end by the
    # peer's death or freeze (its transport lost), never by their deadline.
    slow_loads = Timeouts(load=120.0, abort_ack=2.0)
    peer_cfg = config(timeouts=slow_loads, **FAST_HEARTBEATS)
    victim = start_peer(children, "victim", peer_cfg)
    node = connected(nodes(timeouts=slow_loads, **FAST_HEARTBEATS), victim)
    victim.ask(node, "withhold", [40], reply="withholding")

    # Outstanding when the victim dies: our supply (never fetched), a load it parked,
    # and a burst of loads of which some are still in flight.
    node.region[62] = torch.full((BLOCK,), 7, dtype=torch.uint8)
    store = node.supply(victim.id, "ours-1", [demo_key(9_999)], [62])
    parked = node.fetch(victim.id, "parked", keys_of([40]), [63])
    assert victim.wait(node, "fetch", "parked")[3:] == (0, 1)
    burst = [node.fetch(victim.id, f"burst-{i}", keys_of(list(range(4 * i, 4 * i + 4))),
                        list(range(4 * i, 4 * i + 4))) for i in range(12)]
    drive(node, lambda: any(f.done() for f in burst), 20.0, "the first burst result")
    os.kill(victim.pid, signal.SIGKILL)
    victim.child.proc.join(10.0)
    everything = [store, parked, *burst]
    drive(node, lambda: all(f.done() for f in everything), 60.0, "a result for every job")

    assert not store.result().success
    lost = parked.result()
    assert not lost.success and not lost.released, lost  # a write might still land
    for i, fut in enumerate(burst):
        result = fut.result()
        if result.success:
            assert_blocks(node, list(range(4 * i, 4 * i + 4)), list(range(4 * i, 4 * i + 4)))
    assert len(one_result_per_job(node)) == len(everything)
    assert node.deaths[victim.id].reason.startswith("transport lost")
    assert victim.id not in node.data.peers

    # A new server on the same port: connect again and fetch.
    restarted = start_peer(children, "restarted", config(
        bind=f"tcp://{victim.id}", timeouts=slow_loads, **FAST_HEARTBEATS))
    assert restarted.id == victim.id
    node.region.zero_()
    connected(node, restarted)
    assert node.opened[victim.id] == 2
    again = node.fetch(restarted.id, "after-restart", keys_of([0, 1, 2, 3]), [4, 5, 6, 7])
    drive(node, again.done, 20.0, "fetch from the restarted peer")
    assert again.result().success
    assert_blocks(node, [4, 5, 6, 7], [0, 1, 2, 3])

    # Frozen, not killed: heartbeats end the session well before the load deadline.
    os.kill(restarted.pid, signal.SIGSTOP)
    frozen = node.fetch(restarted.id, "frozen", keys_of([5]), [5])
    drive(node, frozen.done, 60.0, "failure of the load from the frozen peer")
    assert not frozen.result().success
    assert node.deaths[restarted.id].reason.startswith("transport lost")
    assert isinstance(frozen.result(), LoadResult)
    one_result_per_job(node)


def test_restarted_peer_whose_old_connection_looks_alive_gets_in_once_it_ends(
        children: list[Child], nodes: Callable[..., RecordingNode]) -> None:
    """A peer whose old connection still looks alive (SIGSTOPped: no FIN, heartbeats of
    60 s) comes back as a new incarnation over a new connection under its identity (a
    raw DEALER, as a restarted process would). While the old connection is open the new
    one is never read (a live id is read on one connection only: a twin cannot cut a
    peer off), so the old session lives on with its parked load. Once the old
    connection ends (here the old process is killed), the old session dies with every
    job's one result, and the restarted peer's connect on a fresh connection reaches
    a new session (the one the node opens again by itself, or one it opens for it)."""
    import dataclasses

    import zmq

    from p2pfsm.protocol import encode

    slow = {"heartbeat_ivl_ms": 1000, "heartbeat_timeout_ms": 60_000}
    victim = start_peer(children, "victim", config(**slow))
    node = connected(nodes(**slow), victim)
    victim.ask(node, "withhold", [40], reply="withholding")
    parked = node.fetch(victim.id, "parked", keys_of([40]), [63])
    assert victim.wait(node, "fetch", "parked")[3:] == (0, 1)
    old = node.sessions[victim.id]
    assert old.peer is not None and old.peer.incarnation is not None
    os.kill(victim.pid, signal.SIGSTOP)
    restart = dataclasses.replace(old.peer, incarnation=old.peer.incarnation + 1)

    ctx = zmq.Context()

    def dealer() -> zmq.Socket[bytes]:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, victim.id.encode("ascii"))
        sock.connect(f"tcp://{node.local_id}")
        return sock

    twin = dealer()
    try:
        twin.send(encode(restart))
        end = time.monotonic() + 1.0  # an observation window: the old session lives on
        while time.monotonic() < end:
            node.step(0.05)
        assert old.alive and not parked.done(), old.death_reason
        os.kill(victim.pid, signal.SIGKILL)
        drive(node, parked.done, 20.0, "the parked load's result")
        assert not old.alive
        # The restarted process listens at the old address again (the node dials it
        # back there) and connects from a fresh connection; the twin's connection ends
        # with it, so no other connection holds the identity in libzmq.
        twin.close(0)
        listener = ctx.socket(zmq.ROUTER)
        listener.setsockopt(zmq.LINGER, 0)
        with contextlib.suppress(zmq.ZMQError):  # the port taken meanwhile: dials fail
            listener.bind(f"tcp://{victim.id}")
        fresh = lambda: getattr(node.sessions.get(victim.id), "peer", None) == restart  # noqa: E731
        deadline = time.monotonic() + 20.0
        while not fresh():  # connects again, as a restarted peer not answered would
            assert time.monotonic() < deadline, f"no fresh session; deaths={node.deaths}"
            came_back = dealer()
            came_back.send(encode(restart))
            window = time.monotonic() + 1.0
            while not fresh() and time.monotonic() < window:
                node.step(0.05)
            came_back.close(0)
    finally:
        ctx.destroy(linger=0)
    lost = parked.result()
    assert not lost.success
    assert one_result_per_job(node) == [lost.job_id]
    fresh = node.sessions[victim.id]
    assert fresh is not old and fresh.peer == restart  # (a raw DEALER: no session lives)
