"""Executor-level stateful test: three real nodes in this process, stepped by one driver.

A consumer node ``A`` fetches from two producer nodes (ZeroMQ and NIXL on 127.0.0.1,
host memory); hypothesis interleaves its fetches (some held back by the producer, some
naming a key it lacks), lookups, cancels of a fetch's future, the producers' held-back
supplies, session kills (the connection dropped under one side's session), a producer
closing, the consumer closing with fetches open (a new one takes its place), and
hostile identities (a raw DEALER whose routing id never completed a valid
connect: garbage, a connect naming another host, a connect naming another id, a
malformed id) with bounded runs of the nodes' loops (all, or one node's only). Every
example starts with a fetch from each producer in flight. After every step:

* one result per job: each fetch, lookup and supply future resolves at most once with
  its own job's result and is never cancelled (a ``TransportError`` "node closed" only
  for a job no session held when its node closed); ``on_result`` hears each job once; no
  node drops a result nobody waits for; at the end (every held-back supply given, every
  open fetch cancelled, the nodes run until quiet, then closed) every job has its one
  result;
* no write after release: a destination block given back (its fetch ended with
  ``released``) is filled with a sentinel that must stay intact until a new fetch takes
  the block; a successful fetch's blocks hold exactly the demo blocks it named;
* who is dialled back: no node opens a session to, or holds a connection for, an
  identity that never completed a valid connect;
* what each host is told: every node's sessions are judged call by call by the oracle
  of ``tests/stateful/oracle.py`` (its call hook);
* bytes: shadow memory. A producer's region never changes; each consumer block a fetch
  holds has, byte for byte, its sentinel or the demo block that fetch named.

* deadlines: each node's driver wakes no later than the earliest timer its sessions
  armed (a deadline that moved earlier, or later, is the driver's too), and no timer is
  handed to it before its deadline;
* no node registers its own NIXL agent as a peer's, under its name or another.

Fetches are started directly, submitted through ``node.threadsafe`` (some cancelled
through the submitted future before the driving thread started them), or handed out as
``p2pfsm.aio`` does (a ``FetchHandle``, some cancelled through a task awaiting it). Each
example lays out every node's memory one way in turn (:data:`LAYOUTS`: one region, a
tensor per layer, named host regions), and shadow memory compares every region. Hostile
frames come after the handshake too, over a live session's own connection: a fetch
naming a block index at or past the consumer's region, and a connect of a new
incarnation carrying the consumer's own NIXL metadata.

Bounded: a few examples of a few dozen steps (``SETTINGS``), every wait has a deadline
and names what it waited for, no sleeps, and every node and socket is closed at the end
of each example. Shrinking is off: the failing sequence is printed as found.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import itertools
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
if importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None:
    pytest.skip("NIXL is not installed (.ci/install.sh installs it)", allow_module_level=True)

import zmq
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from stateful.oracle import Oracle

from p2pfsm.aio import FetchHandle
from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import LocalProtocolError
from p2pfsm.executor.nixl.agent import agent_name_of
from p2pfsm.executor.nixl.memory import HostRegion
from p2pfsm.executor.node import LookupAnswer, Node, NodeConfig
from p2pfsm.executor.node.jobs import JobFuture, LookupAsk, copy_outcome
from p2pfsm.protocol import AbortFetch, Connect, decode, encode
from p2pfsm.protocol import Fetch as FetchFrame
from p2pfsm.session import (
    FetchArrived,
    LoadResult,
    LookupResult,
    Session,
    StoreResult,
    Timeouts,
)

from . import drive_nodes

BLOCK = 4096
DEST = 16  # the consumer's blocks
HELD = 8  # demo blocks 0..HELD-1 each producer holds, at their own index
ABSENT = 10**6  # a demo block number no producer holds
SEED = "stateful-hash-seed"
SETTINGS = settings(max_examples=12, stateful_step_count=40, deadline=None, derandomize=True,
                    database=None, phases=[Phase.explicit, Phase.generate],
                    suppress_health_check=list(HealthCheck))
"""Twelve examples of up to 40 steps, the same ones every run: about 22 s on a two-core
machine at load 8 (mostly node start-up and close, and deadlines after one-sided kills)."""
QUIET_ENV = "P2PFSM_SLIP_QUIET_S"
TIMEOUTS = Timeouts(load=2, abort_ack=1, store=3, lookup=2, lookup_pending=1, demand=6)
"""Short, so a job whose peer went silent ends soon (a deadline that fires under load
changes which path a job takes, never what is checked)."""
QUIET_S = float(os.environ.get(QUIET_ENV, "60"))
"""Bound on waits for events that take milliseconds (load only slows them). A run under
a planted slip (tests/mutants) sets a shorter one through ``QUIET_ENV``: there a wait
that never ends is the catch, and the real code's control run keeps the full bound."""


def sentinel(index: int) -> bytes:
    """What a released destination block holds until a fetch takes it again."""
    return bytes([0xC0 | (index & 0x0F)]) * BLOCK


LAYOUTS = ("one region", "per layer", "host regions")
"""The region shapes a node accepts; example ``i`` of the search lays out every node's
memory the ``i % 3``-th way (the same examples, each layout in turn)."""
SLICES = {"one region": (BLOCK,), "per layer": (BLOCK // 4, 3 * BLOCK // 4),
          "host regions": (3 * BLOCK // 4, BLOCK // 4)}
"""Each block's slices, one a region, in the regions' order."""
_TURN = itertools.count()


class Memory:
    """A node's block memory in one of :data:`LAYOUTS`, read and written a whole block
    (its slices, region by region, in order) at a time:

    * ``one region``: the node allocates it (one row a block);
    * ``per layer``: a list of tensors, a consumer's strided views of one tensor (each
      row a slice), a producer's a tensor per region;
    * ``host regions``: named :class:`HostRegion` s over buffers the test owns."""

    def __init__(self, layout: str, num_blocks: int, consumer: bool) -> None:
        import torch

        self.layout = layout
        self.num_blocks = num_blocks
        slices = SLICES[layout]
        self.memory: Any = None
        self.views: list[np.ndarray[Any, Any]] = []
        self.keep: list[Any] = []  # what must stay alive while the node uses it
        if layout == "per layer":
            if consumer:
                whole = torch.zeros((num_blocks, BLOCK), dtype=torch.uint8)
                self.keep.append(whole)
                tensors = [whole[:, :slices[0]], whole[:, slices[0]:]]
            else:
                tensors = [torch.zeros((num_blocks, n), dtype=torch.uint8) for n in slices]
            self.memory = tensors
            self.views = [t.numpy() for t in tensors]
        elif layout == "host regions":
            buffers = [np.zeros(num_blocks * n, dtype=np.uint8) for n in slices]
            self.keep += buffers
            self.memory = {name: HostRegion(b.ctypes.data, b.nbytes)
                           for name, b in zip(("k", "v"), buffers, strict=True)}
            self.views = [b.reshape(num_blocks, n) for b, n in zip(buffers, slices, strict=True)]

    def attach(self, node: Node) -> None:
        """The node allocated its region itself: read it through the node."""
        if self.memory is None:
            self.views = [node.region.numpy()]

    def read(self, block: int) -> bytes:
        return b"".join(v[block].tobytes() for v in self.views)

    def write(self, block: int, data: bytes) -> None:
        start = 0
        for v in self.views:
            n = v.shape[1]
            v[block] = np.frombuffer(data[start:start + n], dtype=np.uint8)
            start += n

    def dump(self) -> bytes:
        """Every byte of every region, block by block."""
        return b"".join(self.read(b) for b in range(self.num_blocks))


class Recorded(Node):
    """A node that records every peer it opens a session for, every result it hands
    out (through ``on_result``) and the type of every frame it receives; the oracle
    (``tests/stateful/oracle.py``) judges every call of its sessions."""

    def __init__(self, config: NodeConfig, holds: dict[str, frozenset[bytes]] | None = None,
                 **kw: Any) -> None:
        self.oracle = Oracle(holds if holds is not None else {}, by_peer=True,
                             tombstone=TIMEOUTS.tombstone)
        super().__init__(config, on_result=self._record, call_hook=self.oracle, **kw)
        self.registered: list[tuple[str, bytes]] = []  # (peer, metadata) add_peer took
        add_peer = self.data.add_peer

        def registering(peer_id: str, metadata: bytes, *args: Any, **kwargs: Any) -> None:
            add_peer(peer_id, metadata, *args, **kwargs)  # raises when it refuses
            self.registered.append((peer_id, bytes(metadata)))

        self.data.add_peer = registering  # type: ignore[method-assign]
        self.opened: list[str] = []
        self.mem: Memory | None = None  # set by the machine
        self.own_metadata: bytes | None = None
        self.heard: list[LoadResult | StoreResult | LookupResult] = []
        self.received: list[str] = []  # the type of every frame that reached the node
        self._record_sessions()

    def _record(self, peer_id: str, value: LoadResult | StoreResult | LookupResult) -> None:
        self.heard.append(value)

    def _record_sessions(self) -> None:
        """Wrap the peers' ``new_session`` and ``on_frame`` (looked up per call) to
        record what they open and receive."""
        peers = self._peers
        new_session, on_frame = peers.new_session, peers.on_frame

        def opening(peer_id: str) -> Session:
            self.opened.append(peer_id)
            session = new_session(peer_id)
            due_timers = session.due_timers

            def due_only(now: float) -> list[Any]:
                """A timer the driver is handed has reached its deadline."""
                armed = dict(session.view.timers)
                due = due_timers(now)
                early = [t for t in due if t in armed and armed[t] > now]
                assert not early, f"{peer_id}: timers {early} handed out before their deadlines"
                return due

            session.due_timers = due_only  # type: ignore[method-assign]
            return session

        def receiving(peer_id: str, frame: bytes, conn: int = -1) -> None:
            with contextlib.suppress(Exception):  # a bad frame is the session's business
                self.received.append(decode(frame).TYPE)
            on_frame(peer_id, frame, conn)

        peers.new_session = opening  # type: ignore[method-assign]
        peers.on_frame = receiving  # type: ignore[method-assign]


@dataclass
class Producer:
    """A producer node serving demo blocks; fetches of ``withhold`` ids wait in
    ``parked`` until the test supplies them."""

    node: Recorded
    withhold: set[str] = field(default_factory=set)
    parked: list[tuple[str, str, tuple[bytes, ...]]] = field(default_factory=list)
    stores: list[JobFuture[StoreResult]] = field(default_factory=list)
    hostile_rids: set[str] = field(default_factory=set)  # fetches no consumer sent
    fetched_hostile: list[str] = field(default_factory=list)  # those its host heard of

    @property
    def id(self) -> str:
        return self.node.local_id


@dataclass(eq=False)
class Fetch:
    rid: str
    producer: str
    keys: tuple[bytes, ...]
    dest: tuple[int, ...]
    blocks: tuple[int, ...]  # demo block numbers (ABSENT+i: not held)
    future: JobFuture[LoadResult]
    node: Recorded  # the consumer that fetched
    settled: bool = False
    via: str = "node"  # "threadsafe": submitted through node.threadsafe; "asyncio"
    handle: FetchHandle | None = None  # via asyncio: what a coroutine awaits


def config(**kw: Any) -> NodeConfig:
    return NodeConfig("tcp://127.0.0.1:0", kw.pop("blocks", DEST), BLOCK, hash_seed=SEED,
                      timeouts=TIMEOUTS, **kw)


def closed_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
    return port


class NodesMachine(RuleBasedStateMachine):
    fetches = Bundle("fetches")

    def __init__(self, layout: str | None = None) -> None:
        """``layout``: every node's (one of :data:`LAYOUTS`); None: the next in turn."""
        super().__init__()
        self.nodes: list[Recorded] = []
        self.zctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.hostile: set[str] = set()
        self.open: list[Fetch] = []
        self.done: list[Fetch] = []
        self.lookups: list[tuple[str, JobFuture[LookupResult]]] = []
        self.free = list(range(DEST))  # destination blocks no fetch may write
        self.quarantined: set[int] = set()  # released=False: the peer could still write
        self.serial = 0
        self.holds: dict[str, frozenset[bytes]] = {}  # what each node holds (the oracle's)
        self.expect: dict[int, int | None] = {}  # consumer block -> demo block it may get
        self.shadows: dict[str, bytes] = {}  # each producer's memory, as it must stay
        self.layout = layout or LAYOUTS[next(_TURN) % len(LAYOUTS)]
        self.loop = asyncio.new_event_loop()  # runs only the awaits of asyncio fetches
        self.memories: list[Memory] = []  # every node's, alive until the machine ends
        try:
            self.consumer = self._node(config())
            self.producers = [self._producer() for _ in range(2)]
            self._start_consumer(self.consumer)
        except BaseException:
            self._close_all()
            raise

    # ------------------------------------------------------------------ setup
    def _start_consumer(self, node: Recorded) -> None:
        """Every block of ``node`` free (its sentinel), sessions to the live producers."""
        self.consumer = node
        self.free = list(range(DEST))
        self.quarantined.clear()
        self.expect.clear()
        for b in self.free:
            self._mem(node).write(b, sentinel(b))
        sessions = [node.connect(p.id) for p in self._live()]
        drive_nodes([n for n in self.nodes if not n.closed],
                    lambda: all(s.ready for s in sessions), "the handshakes", QUIET_S)

    def _node(self, cfg: NodeConfig, consumer: bool = True, **kw: Any) -> Recorded:
        mem = Memory(self.layout, cfg.num_blocks, consumer)
        self.memories.append(mem)
        if mem.memory is not None:
            cfg = dataclasses.replace(cfg, memory=mem.memory)
        node = Recorded(cfg, self.holds, **kw)
        mem.attach(node)
        assert node.data.layout.slices == SLICES[self.layout], (  # the layout is in use
            self.layout, node.data.layout.slices)
        node.mem = mem
        self.nodes.append(node)
        return node

    @staticmethod
    def _mem(node: Recorded) -> Memory:
        assert node.mem is not None
        return node.mem

    def _producer(self) -> Producer:
        index = {demo_key(i): i for i in range(HELD)}
        prod: Producer

        def on_fetch(peer_id: str, fetch: FetchArrived) -> None:
            if fetch.kv_request_id in prod.hostile_rids:
                prod.fetched_hostile.append(fetch.kv_request_id)
                return
            keys = fetch.missing
            if fetch.kv_request_id in prod.withhold:
                prod.parked.append((peer_id, fetch.kv_request_id, keys))
            elif all(k in index for k in keys):
                self._supply(prod, peer_id, fetch.kv_request_id, keys)
            else:
                with contextlib.suppress(LocalProtocolError):  # the round ended meanwhile
                    prod.node.decline(peer_id, fetch.kv_request_id, fetch.round_seq)

        def on_lookup(peer_id: str, ask: LookupAsk) -> LookupAnswer:
            return {k: index[k] for k in ask.keys if k in index}, frozenset()

        node = self._node(config(), False, on_fetch=on_fetch, on_lookup=on_lookup)
        prod = Producer(node)
        for i in range(HELD):  # demo blocks 0..HELD-1 at their own index
            self._mem(node).write(i, demo_block(i, BLOCK))
        self.holds[node.local_id] = frozenset(index)
        self.shadows[node.local_id] = self._mem(node).dump()
        return prod

    def _supply(self, prod: Producer, peer_id: str, rid: str, keys: tuple[bytes, ...]) -> None:
        index = {demo_key(i): i for i in range(HELD)}
        held = tuple(k for k in keys if k in index)
        if not held:
            return
        # A request that ended meanwhile (aborted, finished) takes no supply: refused.
        with contextlib.suppress(LocalProtocolError):
            prod.stores.append(prod.node.supply(peer_id, rid, held, [index[k] for k in held]))

    def _live(self) -> list[Producer]:
        return [p for p in self.producers if not p.node.closed]

    def _run(self, turns: int) -> None:
        for _ in range(turns):
            for node in self.nodes:
                if not node.closed:
                    node.step(0.002)

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: len(self.free) >= 1)
    @rule(target=fetches, which=st.integers(0, 1), first=st.integers(0, HELD - 1),
          count=st.integers(1, 4), hold=st.booleans(), absent=st.booleans())
    def fetch(self, which: int, first: int, count: int, hold: bool, absent: bool,
              via: str = "node", cancel_at_once: bool = False) -> Fetch:
        prod = self.producers[which]
        if prod.id == self.consumer.local_id or (via == "threadsafe" and prod.node.closed):
            # A closed producer's port taken by the new consumer (the OS reuses it); a
            # submitted fetch waits for a live producer only.
            return Fetch("", prod.id, (), (), (), JobFuture(self.consumer), self.consumer,
                         settled=True)
        count = min(count, len(self.free))
        blocks = [(first + i) % HELD for i in range(count)]
        if absent:
            blocks[-1] = ABSENT + self.serial
        self.serial += 1
        rid = f"f{self.serial}"
        if hold:
            prod.withhold.add(rid)
        dest = tuple(self.free[:count])
        del self.free[:count]
        keys = tuple(demo_key(b) for b in blocks)
        try:
            fut: Any = (self.consumer.threadsafe.fetch(prod.id, rid, keys, dest)
                        if via == "threadsafe" else self.consumer.fetch(prod.id, rid, keys, dest))
        except LocalProtocolError:  # the session is over (its producer closed)
            self.free.extend(dest)
            return Fetch(rid, prod.id, keys, dest, tuple(blocks), JobFuture(self.consumer),
                         self.consumer, settled=True)
        for b, d in zip(blocks, dest, strict=True):
            self.expect[d] = b if b < HELD else None
        job = Fetch(rid, prod.id, keys, dest, tuple(blocks), fut, self.consumer, via=via)
        if via == "asyncio":  # as p2pfsm.aio's AsyncNode.fetch hands it out
            final: asyncio.Future[LoadResult] = self.loop.create_future()
            fut.add_done_callback(lambda f: copy_outcome(f, final))
            job.handle = FetchHandle(fut, final, lambda: None)
        self.open.append(job)
        if cancel_at_once and via == "asyncio":
            self._cancel_awaiting(job)
        elif cancel_at_once:  # before the driving thread has even started it
            assert fut.cancel() is False, "a submitted fetch's future said it was cancelled"
        return job

    def _cancel_awaiting(self, job: Fetch) -> None:
        """Cancel a task awaiting the fetch's handle (asyncio's cancel): it finishes the
        request, and the one result still comes, to the handle's ``final`` too."""
        handle = job.handle
        assert handle is not None

        async def awaiting() -> LoadResult:
            return await handle

        task = self.loop.create_task(awaiting())
        self.loop.run_until_complete(asyncio.sleep(0))  # the task now awaits the handle
        if task.done():
            return  # the result was there already
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            self.loop.run_until_complete(task)
        assert task.cancelled(), "the awaiting task was not cancelled"
        assert not job.future.cancelled(), "asyncio's cancel cancelled the node's future"

    @precondition(lambda self: len(self.free) >= 1)
    @rule(target=fetches, which=st.integers(0, 1), first=st.integers(0, HELD - 1),
          count=st.integers(1, 4), hold=st.booleans(), absent=st.booleans(),
          cancel_at_once=st.booleans())
    def fetch_through_asyncio(self, which: int, first: int, count: int, hold: bool,
                              absent: bool, cancel_at_once: bool) -> Fetch:
        """A fetch handed out as ``p2pfsm.aio`` does (a :class:`FetchHandle`), maybe
        cancelled at once through a task awaiting it."""
        return self.fetch(which, first, count, hold, absent, "asyncio", cancel_at_once)

    @precondition(lambda self: len(self.free) >= 1)
    @rule(target=fetches, which=st.integers(0, 1), first=st.integers(0, HELD - 1),
          count=st.integers(1, 4), hold=st.booleans(), absent=st.booleans(),
          cancel_at_once=st.booleans())
    def fetch_from_another_thread(self, which: int, first: int, count: int, hold: bool,
                                  absent: bool, cancel_at_once: bool) -> Fetch:
        """A fetch submitted through ``node.threadsafe`` (carried out at the node's next
        turn), maybe cancelled through its submitted future before it started."""
        return self.fetch(which, first, count, hold, absent, "threadsafe", cancel_at_once)

    # Each example starts with a fetch from each producer in flight, whichever rules
    # hypothesis' swarm switches off for it: the others interleave with work.
    @initialize(target=fetches, first=st.integers(0, HELD - 1), count=st.integers(1, 4),
                hold=st.booleans(), absent=st.booleans())
    def first_fetch_from_each(self, first: int, count: int, hold: bool, absent: bool) -> Fetch:
        self.fetch(1, (first + 3) % HELD, 2, not hold, False)
        job = self.fetch(0, first, count, hold, absent)
        assert isinstance(job, Fetch)
        return job

    @rule(job=consumes(fetches))
    def cancel(self, job: Fetch) -> None:
        if job.settled:
            return
        if job.handle is not None:
            self._cancel_awaiting(job)
            return
        assert job.future.cancel() is False, "a fetch's future said it was cancelled"
        assert not job.future.cancelled(), "a fetch's future was cancelled"

    @rule(which=st.integers(0, 1), first=st.integers(0, HELD - 1), absent=st.booleans())
    def lookup(self, which: int, first: int, absent: bool) -> None:
        prod = self.producers[which]
        if prod.node.closed:
            return  # a lookup would wait for its session to open again, up to its deadline
        self.serial += 1
        rid = f"l{self.serial}"
        keys = [demo_key(first), demo_key(ABSENT if absent else (first + 1) % HELD)]
        with contextlib.suppress(LocalProtocolError):  # the session is over
            self.lookups.append((rid, self.consumer.lookup(prod.id, rid, keys)))

    @rule(which=st.integers(0, 1))
    def give_held_supply(self, which: int) -> None:
        prod = self.producers[which]
        batch, prod.parked[:] = list(prod.parked), []
        prod.withhold.clear()
        if prod.node.closed:
            return
        for peer_id, rid, keys in batch:
            self._supply(prod, peer_id, rid, keys)

    @rule(turns=st.integers(1, 30))
    def run(self, turns: int) -> None:
        self._run(turns)

    @rule(which=st.integers(0, 2), turns=st.integers(1, 30))
    def run_one(self, which: int, turns: int) -> None:
        """Only one node's loop runs (the others are slow): e.g. a producer hears an
        abort while the consumer makes no progress on the WRITE it is receiving."""
        node = ([self.consumer] + [p.node for p in self.producers])[which]
        for _ in range(turns):
            if not node.closed:
                node.step(0.002)

    @rule(which=st.integers(0, 1), consumer_side=st.booleans())
    def kill_session(self, which: int, consumer_side: bool) -> None:
        """The connection under one side's session drops, the way a ZeroMQ heartbeat
        timeout drops it (its DEALER torn down, a PeerLost at the next poll); the other
        side learns of it only from the protocol (a dead session's answer, deadlines)."""
        prod = self.producers[which]
        if prod.node.closed:
            return
        node, peer = ((self.consumer, prod.id) if consumer_side
                      else (prod.node, self.consumer.local_id))
        dealer = node.control._dealers.peers.get(peer)
        if dealer is not None:  # the path a heartbeat timeout takes: a PeerLost next poll
            node.control._dealers.lose(dealer, "killed by the test")

    @precondition(lambda self: bool(self.open))
    @rule()
    def restart_consumer(self) -> None:
        """The consumer node closes with fetches open (each gets its one result; one no
        session held, a TransportError "node closed") and a new one takes its place."""
        self.consumer.close(timeout=5.0)
        self._settle()
        assert not self.open, f"fetches without a result after close: {self.open}"
        self._start_consumer(self._node(config()))

    @precondition(lambda self: len(self._live()) == 2)
    @rule(which=st.integers(0, 1))
    def close_producer(self, which: int) -> None:
        prod = self.producers[which]
        prod.parked.clear()
        prod.node.close(timeout=5.0)

    @rule(target_=st.integers(0, 2),
          kind=st.sampled_from(["garbage", "other host", "other id", "bad id"]))
    def hostile_identity(self, target_: int, kind: str) -> None:
        node = ([self.consumer] + [p.node for p in self.producers])[target_]
        if node.closed:
            return
        port = closed_port("127.0.0.1")
        ident = {"other host": f"127.0.0.2:{port}", "bad id": f"not an id {port}"}.get(
            kind, f"127.0.0.1:{port}")
        names = {"other host": ident, "other id": f"127.0.0.1:{closed_port('127.0.0.1')}"}
        frame = b"\x93garbage" if kind == "garbage" else encode(Connect(
            peer_id=names.get(kind, ident), agent_metadata=b"x", base_addr=0, num_blocks=4,
            block_len=BLOCK, config_fingerprint="", hash_seed=SEED))
        self.hostile.add(ident)
        before = sum(node.control.drop_counts.values())
        dealer = self.zctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, ident.encode())
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"tcp://127.0.0.1:0;{node.local_id}")
        dealer.send(frame)
        # Dropped at the door, or (a bug) let in: either way the node has seen it.
        drive_nodes([n for n in self.nodes if not n.closed],
                    lambda: (sum(node.control.drop_counts.values()) > before
                             or ident in node.opened), f"the {kind} frame handled", QUIET_S)

    @rule(which=st.integers(0, 1),
          kind=st.sampled_from(["fetch at the region's end", "fetch past the region",
                                "own metadata", "own metadata renamed"]))
    def hostile_frame_in_session(self, which: int, kind: str) -> None:
        """A frame after the handshake, over a live session's own connection: a fetch
        naming a block index at or past the consumer's region (the producer must refuse
        it: no FetchArrived, no write), or a connect of a new incarnation of the
        producer carrying the consumer's own NIXL metadata and memory, under the
        agent's name or another (the consumer must never register its own agent)."""
        prod = self.producers[which]
        if prod.node.closed or self.consumer.closed:
            return
        sender, receiver = ((self.consumer, prod.node) if kind.startswith("fetch")
                            else (prod.node, self.consumer))
        peer = receiver.sessions.get(sender.local_id)
        if peer is None or not peer.ready or receiver.local_id not in sender.control._dealers.peers:
            return  # no live session over a connection to send on
        self.serial += 1
        if kind.startswith("fetch"):
            past = DEST + (0 if kind == "fetch at the region's end" else 1 + self.serial)
            rid = f"hostile{self.serial}"
            prod.hostile_rids.add(rid)
            frame = encode(FetchFrame(rid, (demo_key(0), demo_key(1)), (0, past), 0))
        else:
            md = self.consumer.data.metadata
            name, _ = agent_name_of(md)
            if kind == "own metadata renamed":  # the same length: the header stays valid
                md = md.replace(name.encode(), name[::-1].encode(), 1)
                if name[::-1] == name:
                    return
            layout = self.consumer.data.layout
            frame = encode(Connect(
                peer_id=prod.id, agent_metadata=md, base_addr=layout.base_addr,
                num_blocks=DEST, block_len=BLOCK, config_fingerprint="", hash_seed=SEED,
                incarnation=self.serial, layout=layout.wire(), layout_names=layout.names))
        before = len(receiver.received)
        dropped = sum(receiver.control.drop_counts.values())
        if not sender.control.send(receiver.local_id, frame):
            return  # the connection failed under it: the sender takes its peer for lost
        drive_nodes([n for n in self.nodes if not n.closed],
                    lambda: len(receiver.received) > before or receiver.closed
                    or sum(receiver.control.drop_counts.values()) > dropped,
                    f"the hostile {kind} handled", QUIET_S)
        self._run(3)  # what it set off (a registration refused, a disconnect) goes on
        assert not prod.fetched_hostile, f"{prod.id} handed a {kind} to its host"

    # ------------------------------------------------------------- invariants
    def _settle(self) -> None:
        """Take in the fetches that ended: check them, give their blocks back."""
        for job in [j for j in self.open if j.future.done()]:
            self.open.remove(job)
            job.settled = True
            self.done.append(job)
            assert not job.future.cancelled(), f"{job.rid}: its future was cancelled"
            exc = job.future.exception()
            if job.handle is not None:  # the awaited outcome is the node's, to the end
                final = job.handle.final
                assert final.done() and not final.cancelled(), f"{job.rid}: no final result"
                assert (final.exception() is exc if exc is not None
                        else final.result() is job.future.result()), f"{job.rid}: final differs"
            if isinstance(exc, LocalProtocolError) and job.via == "threadsafe":
                self.free.extend(job.dest)  # refused when it started: the session was over
                continue
            if exc is not None:  # only a job no session held, when its node closed
                assert job.node.closed and "node closed" in str(exc), f"{job.rid}: {exc!r}"
                continue
            res = job.future.result()
            region = None if job.node.closed else self._mem(job.node)
            assert isinstance(res, LoadResult) and res.kv_request_id == job.rid, (job.rid, res)
            if res.success:
                assert all(b < HELD for b in job.blocks), f"{job.rid}: a missing key loaded"
                if region is not None:
                    for b, d in zip(job.blocks, job.dest, strict=True):
                        assert region.read(d) == demo_block(b, BLOCK), \
                            f"{job.rid}: wrong bytes in block {d}"
            if job.node is not self.consumer:
                continue  # its blocks went with its node
            if res.released:
                for d in job.dest:
                    if region is not None:
                        region.write(d, sentinel(d))
                    self.free.append(d)
                    self.expect.pop(d, None)
            else:
                self.quarantined.update(job.dest)

    @invariant()
    def one_result_per_job(self) -> None:
        self._settle()
        for node in self.nodes:
            loads = [r.job_id for r in node.heard if isinstance(r, LoadResult)]
            stores = [r.job_id for r in node.heard if isinstance(r, StoreResult)]
            assert len(loads) == len(set(loads)), f"{node.local_id}: a second load result"
            assert len(stores) == len(set(stores)), f"{node.local_id}: a second store result"
            dropped = node.metrics.snapshot()["counters"].get("results_dropped", 0)
            assert dropped == 0, f"{node.local_id}: {dropped} results nobody waited for"
            lookups = [r.kv_request_id for r in node.heard if isinstance(r, LookupResult)]
            assert len(lookups) == len(set(lookups)), f"{node.local_id}: a second lookup result"
        for rid, fut in self.lookups:
            assert not fut.cancelled(), f"lookup {rid} cancelled"
            if fut.done() and fut.exception() is None:
                assert fut.result().kv_request_id == rid

    @invariant()
    def no_write_after_release(self) -> None:
        if self.consumer.closed:
            return
        region = self._mem(self.consumer)
        for b in self.free:
            assert region.read(b) == sentinel(b), f"block {b} written while free"

    @invariant()
    def memory_equals_its_shadow(self) -> None:
        """Bytes, block for block, region for region: a producer's region never changes
        (nothing writes into it); each consumer block not free holds, byte by byte,
        its sentinel or the demo block its fetch named (a write in flight may have
        landed in part): never another block's bytes, nor anything for a key the
        producer lacks."""
        for prod in self.producers:
            if not prod.node.closed:
                assert self._mem(prod.node).dump() == self.shadows[prod.id], (
                    f"{prod.id}: its own memory changed")
        if self.consumer.closed:
            return
        region = self._mem(self.consumer)
        for d, b in self.expect.items():
            got = np.frombuffer(region.read(d), dtype=np.uint8)
            ok = got == np.frombuffer(sentinel(d), dtype=np.uint8)
            if b is not None:
                ok |= got == np.frombuffer(demo_block(b, BLOCK), dtype=np.uint8)
            assert ok.all(), f"block {d}: bytes of neither its sentinel nor demo block {b}"

    @invariant()
    def each_node_wakes_by_its_sessions_deadlines(self) -> None:
        """Deadlines that move earlier as well as later: a node's driver wakes no later
        than the earliest timer any of its sessions has armed (a session's deadline
        that moved earlier, by a host call or a frame, is the driver's too)."""
        for node in self.nodes:
            if node.closed or node._driver.busy:
                continue  # inputs still queued (timers handed out): its next turn feeds them
            due = [d for s in node.sessions.values() if (d := s.next_deadline()) is not None]
            wake = node._driver.next_deadline()
            assert not due or (wake is not None and wake <= min(due)), (
                f"{node.local_id} wakes at {wake}, after a session deadline {min(due)}")

    @invariant()
    def no_node_registers_its_own_agent(self) -> None:
        """No node's data plane takes its own NIXL agent for a peer's, under any name
        (a WRITE to that peer would land in its own memory)."""
        for node in self.nodes:
            own = agent_name_of(self._own_metadata(node))
            for peer_id, md in node.registered:
                theirs = agent_name_of(md)
                assert theirs[0] != own[0] and theirs[1] != own[1], (
                    f"{node.local_id} registered its own agent as peer {peer_id}")

    def _own_metadata(self, node: Recorded) -> bytes:
        if node.own_metadata is None:
            node.own_metadata = node.data.metadata
        return node.own_metadata

    @invariant()
    def no_dial_back_to_a_stranger(self) -> None:
        for node in self.nodes:
            strangers = self.hostile & (set(node.opened) | set(
                node.control.peers if not node.closed else ()))
            assert not strangers, f"{node.local_id} dialled back {sorted(strangers)}"

    # -------------------------------------------------------------- teardown
    def teardown(self) -> None:
        try:
            self._quiesce()
        finally:
            self._close_all()
        self.one_result_per_job()
        for job in self.open + self.done:
            assert job.future.done() and not job.future.cancelled(), f"{job.rid}: no result"
        self.no_dial_back_to_a_stranger()
        for rid, fut in self.lookups:
            assert fut.done(), f"lookup {rid}: no result"
        for prod in self.producers:
            assert all(f.done() for f in prod.stores), "a supply without its result"

    def _quiesce(self) -> None:
        """Every held-back supply given, the fetches from a closed producer (waiting for
        its session to open again) cancelled, the nodes run until every job has its
        result and no WRITE is in flight (the sessions' own deadlines bound this)."""
        for which in range(len(self.producers)):
            self.give_held_supply(which)
        gone = {p.id for p in self.producers if p.node.closed}
        for job in self.open:
            if job.producer in gone:
                assert job.future.cancel() is False
        live = [n for n in self.nodes if not n.closed]
        try:
            drive_nodes(live, lambda: all(j.future.done() for j in self.open)
                        and all(f.done() for _, f in self.lookups)
                        and not any(n.data.in_flight for n in live), "every job's result",
                        QUIET_S)
        except AssertionError as exc:
            waiting = [(j.rid, j.producer) for j in self.open if not j.future.done()]
            states = {n.local_id: {p: s.state for p, s in n.sessions.items()} for n in live}
            raise AssertionError(f"{exc}: open fetches {waiting}, lookups "
                                 f"{[r for r, f in self.lookups if not f.done()]}, "
                                 f"sessions {states}") from None
        self.one_result_per_job()
        self.no_write_after_release()

    def _close_all(self) -> None:
        for node in self.nodes:
            if not node.closed:
                node.close(timeout=5.0)
        self.zctx.destroy(linger=0)
        self.loop.close()


def test_nodes_interleaved() -> None:
    run_state_machine_as_test(NodesMachine, settings=SETTINGS)


@pytest.mark.slow
def test_nodes_interleaved_long() -> None:
    """The longer search (``pytest -m slow -k interleaved_long``): 60 examples of up to
    60 steps, twenty in each layout, not derandomized (each run searches afresh)."""
    run_state_machine_as_test(NodesMachine, settings=settings(
        SETTINGS, max_examples=60, stateful_step_count=60, derandomize=False))


def test_an_abort_leaves_a_stalled_write_running() -> None:
    """The machine's rules in the order that reaches the window the search rarely
    does: the consumer aborts a fetch, the producer's supply then starts the first WRITE
    to it (which stays running until the consumer's UCX progresses), and only the
    producer runs, so it hears the abort while its WRITE runs. The cancel must leave the
    WRITE running and the source pinned (no StoreResult) until the consumer progresses;
    then the fetch ends with its one result and every check of the machine holds."""
    state = NodesMachine("one region")
    try:
        prod = state.producers[0]
        job = state.fetch(which=0, first=1, count=2, hold=True, absent=False)
        assert isinstance(job, Fetch)
        drive_nodes(state.nodes, lambda: bool(prod.parked), "the held-back fetch", QUIET_S)
        state.cancel(job)  # the abort is on its way to the producer
        state.give_held_supply(0)
        assert prod.node.data.in_flight == 1, "the first WRITE to the consumer did not stall"
        (store,) = prod.stores
        # The producer alone runs until it has read the abort (and handled it: a step
        # handles what it read in the same turn).
        drive_nodes([prod.node], lambda: AbortFetch.TYPE in prod.node.received, "the abort",
                    QUIET_S)
        assert prod.node.data.in_flight == 1, "the aborted round's running WRITE was released"
        assert not store.done(), "the source was unpinned while its WRITE ran"
        drive_nodes(state.nodes, lambda: job.future.done() and store.done(), "the results",
                    QUIET_S)
        state.one_result_per_job()
        state.no_write_after_release()
        assert job.future.result().reason is not None
        state.teardown()
    finally:
        state._close_all()


def test_a_fetch_submitted_just_before_the_node_closes_gets_its_result() -> None:
    """A fetch submitted through ``node.threadsafe`` (and cancelled through its
    submitted future) that the driving thread has not started when the node closes is
    carried out by the close, and gets its one result like every job the close ends.
    Found by this file's search: the close dropped the submitted call, and the future
    never resolved."""
    state = NodesMachine("one region")
    try:
        job = state.fetch(which=0, first=1, count=2, hold=True, absent=False,
                          via="threadsafe", cancel_at_once=True)
        plain = state.fetch(which=1, first=2, count=1, hold=False, absent=False,
                            via="threadsafe")
        state.consumer.close(timeout=5.0)
        assert job.future.done() and plain.future.done(), "a submitted fetch got no result"
        state._settle()
        assert not state.open
    finally:
        state._close_all()


def test_a_fetch_after_a_forgotten_one_sided_loss_gets_its_result() -> None:
    """The producer's side of the session is lost (its DEALER dropped, as by a heartbeat
    timeout); the consumer's stays ready (the producer's ROUTER still answers its
    heartbeats). Long after the control plane's own memory of the loss (``_LOST_KEEP_S``,
    60 s, aged here), the consumer's next frame still reaches the producer's dead
    session, as the node still holds it, and its answer (a disconnect, dialled back)
    ends the consumer's session: the fetch gets its one result. Found by this file's
    session kills; before the fix the frame was dropped as "not a connect" and the fetch
    waited for as long as the connection lived."""
    state = NodesMachine("one region")
    try:
        prod = state.producers[1]
        peer = state.consumer.local_id
        control = prod.node.control
        control._dealers.lose(control._dealers.peers[peer], "heartbeat timeout (simulated)")
        drive_nodes(state.nodes, lambda: not prod.node.sessions[peer].alive,
                    "the producer's session ending", QUIET_S)
        when, key = control._dealers.lost[peer]
        control._dealers.lost[peer] = (when - 61.0, key)  # 61 s later
        job = state.fetch(which=1, first=3, count=1, hold=False, absent=False)
        assert isinstance(job, Fetch)
        # Far past the load deadline (2 s) and an abort_ack deadline (1 s) after it.
        drive_nodes(state.nodes, job.future.done, "the fetch's result", 15.0)
        state.teardown()
    finally:
        state._close_all()
