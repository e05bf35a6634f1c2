"""DataPlane between real processes on one host (NIXL over UCX, CPU memory, CMA).

The test process owns the initiating plane; each target plane lives in a spawned child
that progresses UCX from its own loop, as the executor will. NIXL metadata travels over
the multiprocessing pipe here, except in the idle-CPU test, which runs a ControlPlane and
a DataPlane together in each process and exchanges it over ZeroMQ.
"""

from __future__ import annotations

import hashlib
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import msgpack
import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.demo_blocks import demo_block
from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.fds import HEADROOM
from p2pfsm.executor.nixl.plane import IDLE_PROGRESS_MS, DataPlane, WriteId
from p2pfsm.executor.zmq.plane import ControlPlane, FrameIn
from tests.helpers.descriptors import descriptors_left

from . import Child, cpu_seconds

torch = needs_nixl_and_torch()

BLOCK = 4096


# -- child processes -------------------------------------------------------------------


def target_node(
    conn: Connection, name: str, num_blocks: int, block_len: int, progressing: bool
) -> None:
    """A plane that others write into; progresses UCX unless told not to."""
    plane = DataPlane(name, num_blocks, block_len)
    conn.send(("ready", plane.metadata, plane.base_addr))
    try:
        while True:
            # Wait on the command pipe for at most one progress interval, then progress.
            timeout = plane.progress_interval_ms / 1000 if progressing else None
            if conn.poll(timeout):
                cmd = conn.recv()
                if cmd[0] == "stop":
                    break
                if cmd[0] == "add":
                    plane.add_peer(*cmd[1:])
                    conn.send(("added",))
                elif cmd[0] == "progress":
                    progressing = cmd[1]
                    conn.send(("progress", progressing))
                elif cmd[0] == "region":
                    conn.send(("region", plane.region.numpy().tobytes()))
                elif cmd[0] == "digest":
                    conn.send(
                        ("digest", hashlib.sha256(plane.region.numpy().tobytes()).hexdigest())
                    )
            if progressing:
                plane.progress()
    finally:
        plane.close()


def _announce(plane: DataPlane) -> bytes:
    announcement = {
        "agent_metadata": plane.metadata,
        "base_addr": plane.base_addr,
        "num_blocks": plane.num_blocks,
        "block_len": plane.block_len,
    }
    return bytes(msgpack.packb(announcement))


def _add_from(plane: DataPlane, peer_id: str, frame: bytes) -> None:
    msg = msgpack.unpackb(frame)
    plane.add_peer(
        peer_id, msg["agent_metadata"], msg["base_addr"], msg["num_blocks"], msg["block_len"]
    )


def node_loop(conn: Connection, name: str) -> None:
    """ControlPlane + DataPlane driven by one loop, the executor's shape: wait on ZeroMQ
    for at most the data plane's progress interval, then progress and poll NIXL."""
    control = ControlPlane("tcp://127.0.0.1:0")
    data = DataPlane(name, 64, BLOCK, warmup_s=0.2)
    conn.send(("ready", control.local_id))
    try:
        while not conn.poll(0):
            for ev in control.poll(data.progress_interval_ms):
                if isinstance(ev, FrameIn) and ev.peer_id not in data.peers:
                    _add_from(data, ev.peer_id, ev.frame)
                    control.send(ev.peer_id, _announce(data))
            data.progress()
            data.poll()
    finally:
        data.close()
        control.close()


# -- helpers ---------------------------------------------------------------------------


def _start_target(
    children: list[Child], name: str, num_blocks: int, block_len: int, progressing: bool = True
) -> tuple[Child, bytes, int]:
    child = Child(target_node, name, num_blocks, block_len, progressing, name=name)
    children.append(child)
    (_, metadata, base_addr) = child.expect("ready", 60.0)
    return child, metadata, base_addr


def _connect(plane: DataPlane, child: Child, peer_id: str, md: bytes, base: int, nb: int) -> None:
    """Register both ways, as the vLLM handshake does."""
    plane.add_peer(peer_id, md, base, nb, plane.block_len)
    child.request(
        "add", "initiator", plane.metadata, plane.base_addr, plane.num_blocks, plane.block_len,
        reply="added",
    )  # fmt: skip


def _drive(
    plane: DataPlane,
    child: Child,
    done: Callable[[list[tuple[WriteId, bool]]], bool],
    timeout: float,
    what: str,
) -> list[tuple[WriteId, bool]]:
    """The executor's loop in miniature: poll NIXL, progress, then wait (on the child's
    pipe, which stays quiet) for at most the plane's progress interval."""
    deadline = time.monotonic() + timeout
    results: list[tuple[WriteId, bool]] = []
    while True:
        results.extend(plane.poll())
        if done(results):
            return results
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {what} within {timeout:.1f} s; got {results!r}")
        plane.progress()
        if child.conn.poll(plane.progress_interval_ms / 1000):
            raise AssertionError(f"unexpected message from {child.name}: {child.conn.recv()!r}")


def _reported(*ids: WriteId) -> Callable[[list[tuple[WriteId, bool]]], bool]:
    return lambda results: set(ids) <= {write_id for write_id, _ in results}


def _fill_demo(plane: DataPlane, count: int) -> None:
    """Local block i holds demo block i."""
    for i in range(count):
        content = bytearray(demo_block(i, plane.block_len))
        plane.region[i] = torch.frombuffer(content, dtype=torch.uint8)


@dataclass
class Pair:
    """Our plane (32 blocks) connected both ways to a progressing target (64 blocks)."""

    plane: DataPlane
    child: Child
    metadata: bytes
    base_addr: int


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    started: list[Child] = []
    plane = DataPlane("initiator", 32, BLOCK)
    try:
        child, md, base = _start_target(started, "target", 64, BLOCK)
        _connect(plane, child, "target", md, base, 64)
        _fill_demo(plane, 16)
        yield Pair(plane, child, md, base)
    finally:
        plane.close()
        for child in started:
            child.stop()


# -- tests -----------------------------------------------------------------------------


def test_sixteen_demo_blocks_land_byte_exact(pair: Pair) -> None:
    plane, child = pair.plane, pair.child
    remote = [63, 0, 17, 5, 40, 41, 2, 33, 58, 11, 27, 9, 50, 44, 21, 36]
    xfer = "sixteen"
    plane.write(xfer, "target", list(range(16)), remote)
    results = _drive(plane, child, _reported(xfer), 10.0, "completion of the 16-block WRITE")
    assert results == [(xfer, True)]

    (_, region) = child.request("region", reply="region")
    assert len(region) == 64 * BLOCK
    for k, dest in enumerate(remote):
        got = region[dest * BLOCK : (dest + 1) * BLOCK]
        assert got == demo_block(k, BLOCK), f"target block {dest} != demo block {k}"
    untouched = set(range(64)) - set(remote)
    zero = bytes(BLOCK)
    for dest in untouched:
        assert region[dest * BLOCK : (dest + 1) * BLOCK] == zero, f"block {dest} was touched"


def test_poll_reports_each_transfer_once_and_cancel_hides_it(pair: Pair) -> None:
    plane, child = pair.plane, pair.child
    first, second = 2, 1
    plane.write(first, "target", [0], [1])
    plane.write(second, "target", [1, 2], [2, 3])
    results = _drive(plane, child, _reported(first, second), 10.0, "both transfers")
    assert sorted(results) == [(second, True), (first, True)]
    assert plane.poll() == []
    assert plane.in_flight == 0

    assert plane.cancel(first) is True  # already reported: nothing left to touch memory
    assert plane.cancel(10**9) is True  # never existed

    cancelled, later = 3, 4
    plane.write(cancelled, "target", [3], [4])
    ended = plane.cancel(cancelled)  # True only if it had ended: then never reported
    plane.write(later, "target", [4], [5])
    wanted = [(later, True)] if ended else [(cancelled, True), (later, True)]
    results = _drive(plane, child, _reported(*(x for x, _ in wanted)), 10.0,
                     "the transfers after a cancel")
    assert sorted(results) == wanted, "a cancel that said True must hide the transfer"
    assert plane.poll() == []


def test_a_write_is_named_by_the_callers_id(pair: Pair) -> None:
    """The caller names each WRITE; poll reports it under that name, and a name still
    in use (in flight, or ended and not yet reported) is refused without posting."""
    plane, child = pair.plane, pair.child
    assert plane.region is not None
    plane.region[20].fill_(0xA7)
    name = (object(), 7)  # the node's shape: (session, xfer)
    plane.write(name, "target", [0], [61])
    with pytest.raises(TransportError, match="not yet reported"):
        plane.write(name, "target", [20], [60])
    with pytest.raises(TransportError, match="not hashable"):
        plane.write(["a", "list"], "target", [20], [60])
    results = _drive(plane, child, _reported(name), 10.0, "the named WRITE")
    assert results == [(name, True)]
    assert plane.poll() == [] and plane.in_flight == 0
    (_, region) = child.request("region", reply="region")
    assert region[61 * BLOCK : 62 * BLOCK] == demo_block(0, BLOCK)
    assert region[60 * BLOCK : 61 * BLOCK] != b"\xa7" * BLOCK, "a refused WRITE was posted"

    plane.write(name, "target", [20], [60])  # reported: the name is free again
    results = _drive(plane, child, _reported(name), 10.0, "the name's second WRITE")
    assert results == [(name, True)]
    (_, region) = child.request("region", reply="region")
    assert region[60 * BLOCK : 61 * BLOCK] == b"\xa7" * BLOCK


def test_the_planes_table_is_the_one_of_writes_not_reported(pair: Pair) -> None:
    """``plane.writes`` holds each WRITE from post to report (nothing else keeps a
    table of them); an abandoned WRITE is never reported and leaves the table."""
    plane, child = pair.plane, pair.child
    kept, dropped = ("kept", 1), ("dropped", 2)
    plane.write(kept, "target", [0], [50])
    plane.write(dropped, "target", [1], [51])
    assert plane.writes.holds(kept) and plane.writes.holds(dropped)
    assert len(plane.writes) == 2 and plane.writes.unreported() == [kept, dropped]
    plane.abandon(dropped)
    assert not plane.writes.holds(dropped) and plane.writes.unreported() == [kept]
    assert len(plane.writes) == 1
    results = _drive(plane, child, _reported(kept), 10.0, "the kept WRITE")
    deadline = time.monotonic() + 10.0
    while plane.in_flight:  # the abandoned one ends too, unreported
        assert time.monotonic() < deadline, "the abandoned WRITE did not end in 10 s"
        results.extend(plane.poll())
        plane.progress()
        child.conn.poll(plane.progress_interval_ms / 1000)
    assert results + plane.poll() == [(kept, True)]
    assert len(plane.writes) == 0 and not plane.writes.holds(kept)


def test_cancel_leaves_a_running_write_to_end(children: list[Child]) -> None:
    """A new peer that does not progress keeps our first WRITE in PROC (UCX wire-up
    needs the target). Releasing it would not stop bytes already handed to the
    transport (over UCX TCP they land after the release), so cancel says False, the
    WRITE stays in flight, and poll reports it once the peer progresses and it lands."""
    with DataPlane("initiator-c", 8, BLOCK) as plane:
        assert plane.region is not None
        plane.region[2].fill_(0x5A)
        child, md, base = _start_target(children, "mute", 8, BLOCK, progressing=False)
        plane.add_peer("mute", md, base, 8, BLOCK)
        running = (object(), 0)  # the node names a WRITE (session, xfer)
        plane.write(running, "mute", [2], [3])
        assert plane.in_flight == 1
        assert plane.poll() == []
        assert plane.progress_interval_ms <= 1  # prompt, then busy, while a transfer is in flight
        assert plane.cancel(running) is False
        with pytest.raises(TransportError, match="not yet reported"):  # still the caller's
            plane.write(running, "mute", [4], [4])
        assert plane.in_flight == 1
        child.request("progress", True, reply="progress")
        results = _drive(plane, child, _reported(running), 10.0, "the cancelled WRITE's end")
        assert results == [(running, True)]
        assert plane.cancel(running) is True  # reported: nothing left to touch memory
        (_, region) = child.request("region", reply="region")
        assert region[3 * BLOCK : 4 * BLOCK] == b"\x5a" * BLOCK

        # Removing the peer leaves a running WRITE running too: releasing it would not
        # stop the transport reading our block 1 (a host told "failed" could reuse it
        # while it is read) and writing the peer's block 0, which lands after the removal.
        other, md2, base2 = _start_target(children, "mute2", 8, BLOCK, progressing=False)
        plane.region[1].fill_(0x3C)
        plane.add_peer("mute2", md2, base2, 8, BLOCK)
        stalled = (object(), 0)
        plane.write(stalled, "mute2", [1], [0])
        assert plane.cancel(stalled) is False
        plane.remove_peer("mute2")
        assert plane.peers == ("mute",)
        assert plane.poll() == [] and plane.in_flight == 1
        assert plane.cancel(stalled) is False
        with pytest.raises(TransportError, match="unknown peer"):
            plane.write("new", "mute2", [2], [2])
        other.request("progress", True, reply="progress")
        results = _drive(plane, other, _reported(stalled), 10.0, "the removed peer's WRITE")
        assert results == [(stalled, True)]
        assert plane.poll() == [] and plane.in_flight == 0
        (_, region) = other.request("region", reply="region")
        assert region[:BLOCK] == b"\x3c" * BLOCK

        plane.add_peer("mute2", md2, base2, 8, BLOCK)
        after = stalled  # reported: the id may name a new WRITE
        plane.write(after, "mute2", [1], [1])
        results = _drive(plane, other, _reported(after), 10.0, "a WRITE once the peer progresses")
        assert results == [(after, True)]
        assert plane.poll() == []


def test_bad_requests_raise_transport_error(pair: Pair) -> None:
    plane = pair.plane
    with pytest.raises(TransportError, match="unknown peer"):
        plane.write(1, "nobody", [0], [0])
    bad_batches: list[tuple[Any, Any]] = [
        ([0], [64]),  # past the target's last block
        ([32], [0]),  # past our last block
        ([-1], [0]),
        ([0], [2**31]),  # overflowed int32 inside vLLM's transfer call
        ([True], [0]),
        ([0.0], [0]),
        (["1"], [0]),
        ([0, 1], [0]),
        ([], []),
        ([0, 1], [5, 5]),
        ("01", "01"),
    ]
    for local, remote in bad_batches:
        with pytest.raises(TransportError):
            plane.write(1, "target", local, remote)
    assert plane.in_flight == 0 and plane.poll() == []

    md = plane.metadata
    with pytest.raises(TransportError, match="own NIXL agent"):
        plane.add_peer("self", md, plane.base_addr, 32, BLOCK)
    with pytest.raises(TransportError):
        plane.add_peer("junk", b"not nixl metadata", 4096, 8, BLOCK)
    with pytest.raises(TransportError, match="block_len"):
        plane.add_peer("odd", md, 4096, 8, BLOCK * 2)
    with pytest.raises(TransportError, match="wraps"):
        plane.add_peer("wrap", md, 2**64 - BLOCK, 2, BLOCK)
    with pytest.raises(TransportError):
        plane.add_peer("bool", md, 4096, True, BLOCK)
    with pytest.raises(ConfigError):
        DataPlane("x", 0, BLOCK)
    with pytest.raises(ConfigError):
        DataPlane("x", 1, BLOCK, device="tpu")
    with pytest.raises(ConfigError, match="keep_agents"):
        DataPlane("x", 1, BLOCK, keep_agents=-1)


def test_a_peer_announcing_more_blocks_than_allowed_is_refused(pair: Pair) -> None:
    with DataPlane("bounded", 4, BLOCK, max_peer_blocks=64) as plane:
        with pytest.raises(TransportError, match="exceeds 64"):
            plane.add_peer("target", pair.metadata, pair.base_addr, 65, BLOCK)
        assert plane.peers == ()
        plane.add_peer("target", pair.metadata, pair.base_addr, 64, BLOCK)
        assert plane.peers == ("target",)


def test_remove_and_re_add_peer(pair: Pair) -> None:
    plane, child, md, base = pair.plane, pair.child, pair.metadata, pair.base_addr
    plane.remove_peer("target")
    assert plane.peers == ()
    with pytest.raises(TransportError, match="unknown peer"):
        plane.write(1, "target", [0], [0])
    plane.remove_peer("target")  # unknown ids are ignored
    plane.add_peer("target", md, base, 64, BLOCK)
    plane.add_peer("target", md, base, 64, BLOCK)  # re-adding replaces the registration
    with pytest.raises(TransportError, match="already peer"):
        plane.add_peer("alias", md, base, 64, BLOCK)
    xfer = "after re-add"
    plane.write(xfer, "target", [7], [7])
    assert _drive(plane, child, _reported(xfer), 10.0, "WRITE after re-add") == [(xfer, True)]


def test_re_adding_a_live_agent_opens_no_connection(pair: Pair) -> None:
    """Unloading a live agent leaves its UCX connection open on both sides (the remote
    keeps its endpoint), so loading it again per re-add grew one descriptor each time
    (10 here); the plane keeps the agent loaded and reuses it."""
    plane, child, md, base = pair.plane, pair.child, pair.metadata, pair.base_addr
    plane.add_peer("target", md, base, 64, BLOCK)
    plane.progress()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(10):
        plane.remove_peer("target")
        plane.add_peer("target", md, base, 64, BLOCK)
        plane.progress()
    assert len(os.listdir("/proc/self/fd")) == before
    xfer = "after re-adds"
    plane.write(xfer, "target", [2], [2])
    assert _drive(plane, child, _reported(xfer), 10.0, "WRITE after re-adds") == [(xfer, True)]
    # A kept agent that NIXL no longer holds is loaded afresh by the next add.
    plane.remove_peer("target")
    plane._agent.remove_remote_agent("target")
    plane.add_peer("target", md, base, 64, BLOCK)
    assert plane.peers == ("target",)


def test_refused_announcements_of_one_agent_load_it_once(pair: Pair) -> None:
    """Connects that carry one live agent but announce blocks it did not register (the
    hostile suite's flood: its 16-block agent announced as 64 blocks) are refused with
    the agent left loaded. Unloading it on each refusal made the next connect load it
    again, and each load of a live agent leaves a UCX connection behind (two descriptors
    a load with both agents in one process, 500 loads: +1000, then NIXL failed to load
    it at the descriptor limit and UCX aborted)."""
    md, base = pair.metadata, pair.base_addr  # the target registered 64 blocks
    with DataPlane("flooded", 8, BLOCK) as plane:
        before = 0
        for i in range(11):
            with pytest.raises(TransportError) as refused:
                plane.add_peer(f"flood-{i}", md, base, 65, BLOCK)
            plane.progress()
            before = before or len(os.listdir("/proc/self/fd"))  # once the agent is loaded
        assert len(os.listdir("/proc/self/fd")) == before
        assert plane.peers == ()
        assert "did not register" in str(refused.value)
        plane.add_peer("honest", md, base, 64, BLOCK)  # the kept load serves a true one
        plane.progress()
        assert plane.peers == ("honest",)
        assert len(os.listdir("/proc/self/fd")) == before


def test_no_agent_is_loaded_short_of_descriptors(pair: Pair) -> None:
    """UCX aborts the process (an assertion at the next progress) after loading an
    agent with one descriptor free: the plane refuses the load instead."""
    md, base = pair.metadata, pair.base_addr
    with DataPlane("short", 8, BLOCK) as plane:
        with descriptors_left(HEADROOM // 2), pytest.raises(TransportError,
                                                            match="descriptors free"):
            plane.add_peer("target", md, base, 64, BLOCK)
        assert plane.peers == ()
        plane.add_peer("target", md, base, 64, BLOCK)
        assert plane.peers == ("target",)


def test_killed_peer_fails_transfers(children: list[Child]) -> None:
    with DataPlane("initiator-k", 8, BLOCK) as plane:
        child, md, base = _start_target(children, "doomed", 8, BLOCK)
        _connect(plane, child, "doomed", md, base, 8)
        warm = "warm"
        plane.write(warm, "doomed", [0], [0])
        assert _drive(plane, child, _reported(warm), 10.0, "warm-up WRITE") == [(warm, True)]

        os.kill(child.pid, signal.SIGKILL)
        child.proc.join(10.0)
        assert not child.proc.is_alive()
        failed = "failed"
        plane.write(failed, "doomed", [1], [1])
        deadline = time.monotonic() + 5.0
        results: list[tuple[WriteId, bool]] = []
        while failed not in {x for x, _ in results}:
            assert time.monotonic() < deadline, "a WRITE to a dead peer was not reported"
            results.extend(plane.poll())
            plane.progress()
        assert results == [(failed, False)]
        assert plane.is_faulted("doomed")
        plane.remove_peer("doomed")
        with pytest.raises(TransportError):
            plane.write("after", "doomed", [0], [0])


def test_write_256_blocks_of_64k(children: list[Child]) -> None:
    """Raw WRITE time of 256 x 64 KiB between two processes, every byte checked."""
    blocks, block_len = 256, 64 * 1024
    with DataPlane("initiator-b", blocks, block_len) as plane:
        child, md, base = _start_target(children, "bench", blocks, block_len)
        _connect(plane, child, "bench", md, base, blocks)
        _fill_demo(plane, blocks)
        everything = list(range(blocks))
        warm = "warm"
        plane.write(warm, "bench", everything, everything)
        _drive(plane, child, _reported(warm), 10.0, "warm-up WRITE")
        times = []
        for xfer in range(20):
            start = time.perf_counter()
            plane.write(xfer, "bench", everything, everything)
            results = _drive(plane, child, _reported(xfer), 10.0, "256-block WRITE")
            times.append(time.perf_counter() - start)
            assert results == [(xfer, True)]
        median = statistics.median(times)
        print(
            f"\n256 x 64 KiB WRITE: median {median * 1e3:.2f} ms "
            f"({blocks * block_len / median / 1e9:.1f} GB/s), min {min(times) * 1e3:.2f} ms, "
            f"max {max(times) * 1e3:.2f} ms"
        )
        (_, digest) = child.request("digest", reply="digest")
        assert digest == hashlib.sha256(plane.region.numpy().tobytes()).hexdigest()
        assert median < 0.5, f"median {median * 1e3:.1f} ms"


def test_idle_pair_costs_almost_no_cpu(children: list[Child]) -> None:
    """Both processes idle with a ControlPlane + DataPlane each, connected and after one
    transfer: the loop wakes every idle_progress_ms and burns next to no CPU (NIXL's
    default progress thread would burn a whole core per process)."""
    child = Child(node_loop, "idle-node", name="idle-node")
    children.append(child)
    (_, node_id) = child.expect("ready", 60.0)
    with (
        ControlPlane("tcp://127.0.0.1:0") as control,
        DataPlane("idle-initiator", 64, BLOCK, warmup_s=0.2) as data,
    ):
        control.connect(node_id)
        control.send(node_id, _announce(data))
        deadline = time.monotonic() + 20.0
        while node_id not in data.peers:
            assert time.monotonic() < deadline, "no announcement back over ZeroMQ"
            for ev in control.poll(100):
                if isinstance(ev, FrameIn) and ev.peer_id == node_id:
                    _add_from(data, node_id, ev.frame)
        xfer = "only"
        data.write(xfer, node_id, [0, 1], [2, 3])
        seen: list[tuple[WriteId, bool]] = []
        while xfer not in {x for x, _ in seen}:
            assert time.monotonic() < deadline, "WRITE over the ZeroMQ-brokered pair hung"
            control.poll(data.progress_interval_ms)
            data.progress()
            seen.extend(data.poll())
        assert seen == [(xfer, True)]

        def idle_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                assert control.poll(data.progress_interval_ms) == []
                data.progress()
                assert data.poll() == []

        idle_for(0.5)  # let both warm-up windows (0.2 s) run out
        assert data.progress_interval_ms == IDLE_PROGRESS_MS
        window = 2.0
        own0, peer0 = cpu_seconds(os.getpid()), cpu_seconds(child.pid)
        idle_for(window)
        own = (cpu_seconds(os.getpid()) - own0) / window
        peer = (cpu_seconds(child.pid) - peer0) / window
        print(f"\nidle CPU over {window:.0f} s: test process {own:.3f}, peer process {peer:.3f}")
        assert peer < 0.05, f"idle peer burns {peer:.2f} CPU-s/s"
        assert own < 0.05, f"idle test process burns {own:.2f} CPU-s/s"
