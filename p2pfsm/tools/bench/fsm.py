"""Benchmark: the cost of one control event through the machines, vs open rounds.

One "event" is a whole load round seen by the consumer session: HostFetch (a
client_round fires host_fetch; a fetch frame is produced) then the peer's
transfer_done frame (decoded, validated, gated by the session machine, fired on
the round, LoadResult out). It is timed with 0, 100 and 10 000 other rounds open
in the same session (the counts interleaved, one batch of each per repeat), and
compared, in the same run, with the raw operations it contains: decoding the
transfer_done frame with msgpack alone, and one trigger through a
``transitions.Machine`` built from the same model.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import msgpack

from p2pfsm.fsm import machine
from p2pfsm.fsm.build import build_transitions_machine
from p2pfsm.protocol import Connect, ConnectAck, Fetch, TransferDone, encode
from p2pfsm.session import (
    FrameReceived,
    HostFetch,
    HostStart,
    HostSupply,
    RegistrationFinished,
    Session,
    SessionConfig,
    StartWrite,
    WriteFinished,
)


@dataclass(frozen=True)
class FsmBenchRow:
    open_rounds: int
    per_round_us: float
    per_event_us: float
    vs_msgpack_decode: float
    vs_transitions_trigger: float


def _ready_session(num_blocks: int) -> Session:
    cfg = SessionConfig("127.0.0.1:1", b"us", 0, num_blocks, 64)
    s = Session(cfg)
    s.handle(HostStart(), 0.0)
    peer = Connect("127.0.0.1:2", b"them", 0, num_blocks, 64, "", cfg.hash_seed)
    s.handle(FrameReceived(encode(peer)), 0.0)
    s.handle(RegistrationFinished(True), 0.0)
    s.handle(FrameReceived(encode(ConnectAck("127.0.0.1:2"))), 0.0)
    assert s.ready
    return s


class _RoundDriver:
    """One whole load round per call on a ready session."""

    def __init__(self, session: Session, key: tuple[bytes, ...]) -> None:
        self.session = session
        self.key = key
        self.i = 0

    def __call__(self) -> None:
        self.i += 1
        rid = f"bench-{self.i}"
        self.session.handle(HostFetch(self.i, rid, self.key, (0,)), 1.0)
        out = self.session.handle(FrameReceived(encode(TransferDone(rid, True, 0))), 1.0)
        if not out:
            raise RuntimeError("benchmark round produced no result")


class _ServeDriver:
    """One whole serve round per call on a ready session (the producer's side): the
    peer's fetch frame, the host's supply, the write's end (seven machine steps)."""

    def __init__(self, session: Session, key: tuple[bytes, ...]) -> None:
        self.session = session
        self.key = key
        self.i = 0
        self.xfer = 0

    def serving(self) -> str:
        """A new round left serving with its write in flight; its request id."""
        self.i += 1
        rid = f"serve-{self.i}"
        self.session.handle(FrameReceived(encode(Fetch(rid, self.key, (0,), 0))), 1.0)
        out = self.session.handle(HostSupply(self.i, rid, self.key, (0,)), 1.0)
        self.xfer = next(o.xfer for o in out if type(o) is StartWrite)
        return rid

    def __call__(self) -> None:
        self.serving()
        if not self.session.handle(WriteFinished(self.xfer, True), 1.0):
            raise RuntimeError("benchmark serve round produced no reply")


def _median_ns(fn: object, repeat: int, number: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()  # type: ignore[operator]
        samples.append((time.perf_counter_ns() - t0) / number)
    return statistics.median(samples)


def run(open_counts: tuple[int, ...] = (0, 100, 10_000), number: int = 2000,
        repeat: int = 7) -> list[FsmBenchRow]:
    """Measure; return one row per open-round count."""
    key = (b"k" * 36,)
    done_frame = encode(TransferDone("r", True, 0))
    decode_ns = _median_ns(lambda: msgpack.unpackb(done_frame, raw=False), repeat, number)

    class Model:
        """The native profile's answers to the load round's guards."""

        def reports_at_abort_send(self, *_args: object, **_kw: object) -> bool:
            return False

        def ack_timeout_ends_session(self, *_args: object, **_kw: object) -> bool:
            return False

        def waits_for_handshake(self, *_args: object, **_kw: object) -> bool:
            return False

    spec = machine("client_round")
    model = Model()
    build_transitions_machine(spec, model)

    model.trigger("host_fetch")  # type: ignore[attr-defined]
    model.trigger("timer_load")  # type: ignore[attr-defined]

    def one_trigger() -> None:  # aborting --host_finish--> aborting (internal)
        model.trigger("host_finish")  # type: ignore[attr-defined]

    trigger_ns = _median_ns(one_trigger, repeat, number)
    drivers = []
    for n_open in open_counts:
        s = _ready_session(num_blocks=1)
        for i in range(n_open):
            s.handle(HostFetch(10_000_000 + i, f"open-{i}", key, (0,)), 0.0)
        drivers.append(_RoundDriver(s, key))
    # Interleaved: each repeat times every open-round count once, so that all rows see
    # the same minute of machine load (a row measured alone drifted by up to 30 %).
    samples: list[list[float]] = [[] for _ in drivers]
    for _ in range(repeat):
        for driver, got in zip(drivers, samples, strict=True):
            got.append(_median_ns(driver, 1, number))
    rows = []
    for n_open, driver, got in zip(open_counts, drivers, samples, strict=True):
        per_round = statistics.median(got)
        per_event = per_round / 2
        rows.append(FsmBenchRow(n_open, per_round / 1000, per_event / 1000,
                                per_event / decode_ns, per_event / trigger_ns))
        if driver.session.open_counts()["client_round"] != n_open:
            raise RuntimeError("benchmark leaked rounds")
    return rows


def format_rows(rows: list[FsmBenchRow]) -> str:
    head = (f"{'open rounds':>12} {'µs/round':>9} {'µs/event':>9} "
            f"{'x msgpack decode':>17} {'x transitions trigger':>22}")
    lines = [head]
    for r in rows:
        lines.append(f"{r.open_rounds:>12} {r.per_round_us:>9.2f} {r.per_event_us:>9.2f} "
                     f"{r.vs_msgpack_decode:>17.1f} {r.vs_transitions_trigger:>22.2f}")
    return "\n".join(lines)
