"""Shared fixtures for the scenario tests.

Two ways to drive sessions:

* :class:`World` -- the seeded :class:`~p2pfsm.sim.world.SimWorld` (two sessions
  ``a`` and ``b`` over FIFO channels, with its safety checks), plus a record of every
  output and every frame each node ever sent, wire decoding of the channels, and
  lookup answers that a test may hold back and give by hand;
* :class:`Driver` -- one bare :class:`~p2pfsm.session.Session` fed events one by one
  at a controlled time, for the cases where a test plays the peer itself.

Everything here is deterministic; every loop is bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from p2pfsm.demo_blocks import demo_key
from p2pfsm.protocol import Connect, ConnectAck, Message, decode, encode
from p2pfsm.session import (
    DEFAULT_HASH_SEED,
    FrameReceived,
    HostAnswerLookup,
    HostStart,
    Input,
    LoadResult,
    LookupRequest,
    Output,
    RegistrationFinished,
    SendFrame,
    Session,
    SessionConfig,
    TimerFired,
    TimerId,
)
from p2pfsm.sim.world import SimWorld

T = TypeVar("T")

MAX_STEPS = 1_000
"""Bound on every helper loop."""

LOCAL_ID = "127.0.0.1:7000"
PEER_ID = "127.0.0.1:7001"
LOCAL_METADATA = b"agent-local"
PEER_METADATA = b"agent-peer"
BLOCK_LEN = 16
NUM_BLOCKS = 64


def key(i: int) -> bytes:
    """The demo key of block ``i`` (both helpers use the simulator's block model)."""
    return demo_key(i)


def keys(ids: Iterable[int]) -> tuple[bytes, ...]:
    return tuple(demo_key(i) for i in ids)


def of_type(items: Iterable[object], cls: type[T]) -> list[T]:
    """The items that are instances of ``cls``, in order."""
    return [x for x in items if isinstance(x, cls)]


def sent(outputs: Iterable[object]) -> list[Message]:
    """The messages of the SendFrame outputs, in order."""
    return [o.message for o in outputs if isinstance(o, SendFrame)]


def wire_types(messages: Iterable[Message]) -> list[str]:
    return [m.TYPE for m in messages]


# ---------------------------------------------------------------------- world
class World(SimWorld):
    """A SimWorld that records outputs and sent frames, and may hold lookups back.

    Args:
        auto_answer: when False, LookupRequests are not answered by the simulated host;
            they wait in :attr:`held` until :meth:`answer` gives an answer.
        kwargs: as :class:`SimWorld`.
    """

    def __init__(self, seed: int = 0, *, auto_answer: bool = True, **kwargs: Any) -> None:
        self.auto_answer = auto_answer
        self.outputs: dict[str, list[Output]] = {"a": [], "b": []}
        self.sent: dict[str, list[Message]] = {"a": [], "b": []}
        self.held: dict[str, list[LookupRequest]] = {"a": [], "b": []}
        super().__init__(seed, **kwargs)

    # plumbing overrides ------------------------------------------------
    def feed(self, node: str, event: Input) -> list[Output]:
        outputs = super().feed(node, event)
        self.outputs[node].extend(outputs)
        self.sent[node].extend(sent(outputs))
        return outputs

    def _answer_lookup(self, node: str, req: LookupRequest) -> None:
        if self.auto_answer:
            super()._answer_lookup(node, req)
        else:
            self.held[node].append(req)

    # observation -------------------------------------------------------
    def wire(self, src: str) -> list[Message]:
        """The frames queued from ``src`` to its peer, decoded, oldest first."""
        return [decode(f) for f in self.channels[(src, self.other(src))]]

    def types(self, src: str) -> list[str]:
        return wire_types(self.wire(src))

    def out(self, node: str, cls: type[T]) -> list[T]:
        """Every output of class ``cls`` that ``node``'s session produced so far."""
        return of_type(self.outputs[node], cls)

    def sent_of(self, node: str, cls: type[T]) -> list[T]:
        """Every message of class ``cls`` that ``node`` ever sent."""
        return of_type(self.sent[node], cls)

    def xfers(self, src: str) -> list[int]:
        """Writes of ``src`` still in flight, oldest first."""
        return sorted(x for (n, x) in self.writes if n == src)

    def counts(self, node: str) -> dict[str, int]:
        return self.sessions[node].open_counts()

    # actions -----------------------------------------------------------
    def load(self, node: str, kv_request_id: str, key_ids: Iterable[int]) -> int:
        """:meth:`fetch` that must find room; returns the load job."""
        job = self.fetch(node, kv_request_id, key_ids)
        assert job is not None, "no free destination blocks"
        return job

    def result(self, node: str, job: int) -> LoadResult:
        return self.hosts[node].load_results[job]

    def handshake(self) -> None:
        """Start both sessions and run the handshake to completion."""
        self.start()
        self.stabilize()
        assert self.sessions["a"].ready and self.sessions["b"].ready

    def deliver_all(self, src: str) -> int:
        """Deliver every frame queued from ``src`` (and those it causes from ``src``)."""
        for n in range(MAX_STEPS):
            if not self.channels[(src, self.other(src))]:
                return n
            self.deliver(src)
        raise AssertionError("channel never drained")

    def drop_all(self, src: str) -> int:
        """Lose every frame queued from ``src``; returns how many."""
        for n in range(MAX_STEPS):
            if not self.channels[(src, self.other(src))]:
                return n
            self.drop(src)
        raise AssertionError("channel never emptied")

    def inject_msg(self, dst: str, msg: Message) -> list[Output]:
        """Hand ``dst`` the encoded ``msg`` as if its peer sent it; returns its outputs."""
        start = len(self.outputs[dst])
        self.inject(dst, encode(msg))
        return self.outputs[dst][start:]

    def finish_write(self, src: str, xfer: int, *, land: bool = True, fail: bool = False) -> None:
        """Let write ``xfer`` of ``src`` land (unless ``land`` is False), then complete it."""
        if land:
            self.land(src, xfer)
        self.complete(src, xfer, fail=fail)

    def finish_writes(self, src: str) -> int:
        """Land and complete every write of ``src`` in flight."""
        done = 0
        for xfer in self.xfers(src):
            self.finish_write(src, xfer)
            done += 1
        return done

    def answer(
        self, node: str, token: int, hit_ids: Iterable[int] = (), pending_ids: Iterable[int] = (),
    ) -> int | None:
        """Answer held lookup ``token`` of ``node``: ``hit_ids`` pinned under a new job."""
        host = self.hosts[node]
        hits = {demo_key(i): i for i in hit_ids}
        job = None
        if hits:
            job = self.new_job()
            host.store_jobs[job] = tuple(hits.values())
        pending = frozenset(demo_key(i) for i in pending_ids)
        self.feed(node, HostAnswerLookup(token, hits, job, pending))
        self._flush_answers()
        return job

    def fire_next(self, node: str, kind: str) -> TimerId:
        """Fire ``node``'s earliest armed timer of ``kind`` (e.g. "load"); returns its id."""
        armed = sorted((d, str(t), t) for t, d in self.timers[node].items() if t[0] == kind)
        assert armed, f"{node} has no {kind} timer armed: {self.timers[node]}"
        timer = armed[0][2]
        self.fire_timer(node, timer)
        return timer


def ready_world(**kwargs: Any) -> World:
    """A World whose two sessions have completed the handshake."""
    w = World(**kwargs)
    w.handshake()
    return w


# --------------------------------------------------------------- bare session
def local_config(**overrides: Any) -> SessionConfig:
    fields: dict[str, Any] = {
        "local_id": LOCAL_ID,
        "agent_metadata": LOCAL_METADATA,
        "base_addr": 0x1000,
        "num_blocks": NUM_BLOCKS,
        "block_len": BLOCK_LEN,
    }
    fields.update(overrides)
    return SessionConfig(**fields)


def peer_connect(**overrides: Any) -> Connect:
    """A compatible peer's connect; ``overrides`` change single fields."""
    fields: dict[str, Any] = {
        "peer_id": PEER_ID,
        "agent_metadata": PEER_METADATA,
        "base_addr": 0x9000,
        "num_blocks": NUM_BLOCKS,
        "block_len": BLOCK_LEN,
        "config_fingerprint": "",
        "hash_seed": DEFAULT_HASH_SEED,
    }
    fields.update(overrides)
    return Connect(**fields)


class Driver:
    """One bare Session, fed at a controlled virtual time; the test plays the peer."""

    def __init__(self, config: SessionConfig | None = None) -> None:
        self.s = Session(config or local_config())
        self.now = 0.0
        self.log: list[Output] = []

    @property
    def timers(self) -> Mapping[TimerId, float]:
        """The session's armed timers (read-only)."""
        return self.s.view.timers

    def __call__(self, event: Input) -> list[Output]:
        out = self.s.handle(event, self.now)
        self.log.extend(out)
        return out

    def recv(self, msg: Message) -> list[Output]:
        return self(FrameReceived(encode(msg)))

    def recv_raw(self, frame: bytes) -> list[Output]:
        return self(FrameReceived(frame))

    def fire(self, timer: TimerId) -> list[Output]:
        """Advance the clock to ``timer``'s deadline and fire it."""
        deadline = self.timers[timer]
        self.now = max(self.now, deadline)
        return self(TimerFired(timer))

    def armed(self, kind: str) -> list[TimerId]:
        return sorted((t for t in self.timers if t[0] == kind), key=str)

    def handshake(self, connect: Connect | None = None) -> list[Output]:
        """Start, accept the peer's connect, register it, take its ack: ready."""
        out = self(HostStart())
        out += self.recv(connect or peer_connect())
        out += self(RegistrationFinished(True))
        out += self.recv(ConnectAck(PEER_ID))
        assert self.s.ready, self.s.state
        return out


def ready_driver(config: SessionConfig | None = None) -> Driver:
    d = Driver(config)
    d.handshake()
    return d


def snapshot(s: Session) -> tuple[str, dict[str, int], bool]:
    """What a rejected frame or call must leave unchanged."""
    return s.state, s.open_counts(), s.has_pending_work


def only(items: Sequence[T]) -> T:
    assert len(items) == 1, items
    return items[0]
