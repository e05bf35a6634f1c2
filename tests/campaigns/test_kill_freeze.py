"""Kill / freeze campaign: SIGKILL and SIGSTOP (then SIGCONT or SIGKILL) of a real producer
or consumer process at random points of its transfers.

The victim always runs in a child process (:mod:`.procs`) and is observed from the
survivor, a node in the test process:

* producer victim: the test's :class:`~.hosts.Consumer` (``NodeConfig(memory=tensor)``,
  canary blocks around each destination) fetches from a child :class:`~.hosts.Producer`;
* consumer victim: the test's Producer serves a child Consumer; the child reports its own
  guard when it survives (SIGCONT).

Each trial draws (seeded) the fetches (2-6, of 1-24 blocks, some via lookup first, some
with a block the producer lacks), the producer's supply delays, the fault point (a
random delay, the moment the producer hears the k-th fetch, or the k-th result) and, for
SIGSTOP, whether SIGCONT or SIGKILL follows and after how long. Checks per trial:

1. every job got exactly one result (counted at ``on_result``), all of them within
   the deadline after the fault (:func:`result_deadline`);
2. no write after free: every ``released=True`` destination is checksummed when its
   result is handed out and again after the node kept stepping ``SETTLE_S``; canaries
   never change; every success is byte-exact;
3. no pin outlives its round: on the producer every supply and lookup-pin future
   resolves, every session's ``open_counts()`` and the ``open_stores`` / ``open_loads``
   gauges return to zero.
"""

from __future__ import annotations

import random
import signal
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.executor.node import NodeConfig
from p2pfsm.session import Timeouts

from .conftest import seed, trials
from .hosts import Consumer, Producer, settled, step_for
from .procs import Child

torch = needs_nixl_and_torch()

BLOCK = 16 * 1024
BLOCKS = 192          # each side's region
HELD = 64             # the producer holds demo blocks 0..63
MISSING = 100         # a block nobody holds (its fetch fails with transfer_done(false))
HB_IVL_MS, HB_TIMEOUT_MS = 100, 600
TIMEOUTS = Timeouts(handshake=5.0, load=1.0, abort_ack=1.0, lookup=1.0, lookup_pending=0.5)
SLACK_S = 1.5         # scheduling slack on a loaded 2-core box
SETTLE_S = 0.3        # the node keeps stepping this long before the after-free check
SURVIVOR_S = 8.0      # bound on the survivor's own clean-up checks
FINGERPRINT = "campaign00000000"


def node_kwargs() -> dict[str, Any]:
    return {"bind": "tcp://127.0.0.1:0", "num_blocks": BLOCKS, "block_len": BLOCK,
            "fingerprint": FINGERPRINT, "timeouts": TIMEOUTS,
            "heartbeat_ivl_ms": HB_IVL_MS, "heartbeat_timeout_ms": HB_TIMEOUT_MS}


def result_deadline(fault: str) -> float:
    """Seconds after the (first) fault by which every job must have its result."""
    hb = (HB_TIMEOUT_MS + HB_IVL_MS) / 1000
    if fault == "stop-cont":  # the session may survive: the load deadlines bound it
        return hb + TIMEOUTS.load + TIMEOUTS.abort_ack + SLACK_S
    return hb + SLACK_S


@dataclass
class Plan:
    fetches: list[tuple[float, str, list[int], bool]]  # (offset s, rid, blocks, sym)
    point: str            # "delay" | "heard" | "result"
    point_arg: float      # delay in s, or k (as float) for heard/result
    fault: str            # "kill" | "stop-cont" | "stop-kill"
    second_after: float   # for stop-*: the SIGCONT / SIGKILL this long after SIGSTOP
    supply_delay_s: float


def draw(rng: random.Random, kind: str, trial: int) -> Plan:
    fetches = []
    for i in range(rng.randint(2, 6)):
        n = rng.randint(1, 24)
        blocks = rng.sample(range(HELD), n)
        if rng.random() < 0.1:
            blocks[-1] = MISSING
        fetches.append((rng.uniform(0.0, 0.15), f"t{trial}-f{i}", blocks, rng.random() < 0.3))
    fetches.sort()
    point = rng.choice(["delay", "heard", "result"])
    arg = rng.uniform(0.0, 0.2) if point == "delay" else float(rng.randint(1, len(fetches)))
    fault = "kill" if kind == "kill" else rng.choice(["stop-cont", "stop-kill"])
    return Plan(fetches, point, arg, fault, rng.uniform(0.1, 1.2), rng.uniform(0.0, 0.1))


@dataclass
class Figures:
    trials: int = 0
    signals: dict[str, int] = field(default_factory=dict)
    points: dict[str, int] = field(default_factory=dict)
    jobs: int = 0
    exactly_one: int = 0
    succeeded: int = 0
    released: int = 0
    writes_after_free: int = 0
    canaries_changed: int = 0
    supplies: int = 0
    pins: int = 0
    store_one: int = 0  # producer store jobs (supplies + pins) with exactly one result
    max_latency: float = 0.0
    survivor_sessions: int = 0  # CONT'd victims whose session survived the freeze
    redials: int = 0  # sessions the consumer's node opened again by itself
    supplies_dropped: int = 0  # parked supplies of a round that ended (on_round_ended)

    def sent(self, sig: str) -> None:
        self.signals[sig] = self.signals.get(sig, 0) + 1

    def line(self) -> str:
        sigs = ", ".join(f"{k} {v}" for k, v in sorted(self.signals.items()))
        pts = ", ".join(f"{k} {v}" for k, v in sorted(self.points.items()))
        return (f"{self.trials} trials, faults injected: {sigs} (points: {pts}); "
                f"{self.jobs} jobs, exactly one result: {self.exactly_one}, succeeded "
                f"{self.succeeded}, released {self.released}; writes after free: "
                f"{self.writes_after_free}, canaries changed: {self.canaries_changed}; "
                f"producer store jobs: {self.supplies} supplies + {self.pins} lookup "
                f"pins, exactly one result: {self.store_one}; slowest result after the "
                f"fault "
                f"{self.max_latency:.2f} s; sessions that survived a freeze: "
                f"{self.survivor_sessions}; redials: {self.redials}; parked supplies "
                f"dropped at their round's end: {self.supplies_dropped}")


class Spares:
    """Children started one trial ahead, so a trial never waits for a whole start."""

    def __init__(self, spec: Callable[[int], dict[str, Any]], name: str) -> None:
        self.spec, self.name, self.serial = spec, name, 0
        self.spare: Child | None = None
        self.started: list[Child] = []

    def _start(self) -> Child:
        self.serial += 1
        child = Child(self.spec(self.serial), f"{self.name}-{self.serial}")
        self.started.append(child)
        return child

    def take(self) -> Child:
        child = self.spare or self._start()
        self.spare = self._start()
        child.ready()
        return child

    def close(self) -> None:
        for child in self.started:
            child.stop()


class Fault:
    """The fault of one trial: SIGKILL, or SIGSTOP and later SIGCONT / SIGKILL."""

    def __init__(self, victim: Child, plan: Plan, figures: Figures) -> None:
        self.victim, self.plan, self.figures = victim, plan, figures
        self.at: float | None = None
        self.second_at: float | None = None
        self.done = False

    def inject(self) -> None:
        self.at = time.monotonic()
        if self.plan.fault == "kill":
            self.victim.signal(signal.SIGKILL)
            self.figures.sent("SIGKILL")
            self.done = True
        else:
            self.victim.signal(signal.SIGSTOP)
            self.figures.sent("SIGSTOP")

    def tick(self) -> None:
        if self.at is None or self.done:
            return
        if time.monotonic() >= self.at + self.plan.second_after:
            sig = signal.SIGCONT if self.plan.fault == "stop-cont" else signal.SIGKILL
            self.victim.signal(sig)
            self.figures.sent(sig.name)
            self.second_at = time.monotonic()
            self.done = True

    @property
    def killed(self) -> bool:
        return self.plan.fault != "stop-cont"


def trial_seed(kind: str, victim: str, trial: int) -> int:
    return zlib.crc32(f"{seed()}/{kind}/{victim}/{trial}".encode())


# -- producer victim: the consumer in this process ------------------------------------------


def run_producer_victim(kind: str, n: int, report: Callable[[str], None]) -> Figures:
    figures = Figures()
    spares = Spares(lambda s: {"role": "producer", "cfg": node_kwargs(), "held": HELD,
                               "seed": s, "supply_delay_s": 0.1}, "producer")
    memories: list[Any] = []  # kept alive: a late write must never land in freed memory
    try:
        for trial in range(n):
            rng = random.Random(trial_seed(kind, "producer", trial))
            plan = draw(rng, kind, trial)
            victim = spares.take()
            tensor = torch.zeros((BLOCKS, BLOCK), dtype=torch.uint8)
            memories.append(tensor)
            consumer = Consumer(NodeConfig(memory=tensor, **node_kwargs()), tensor.numpy())
            try:
                producer_victim_trial(consumer, victim, plan, figures, trial)
            finally:
                consumer.node.close(timeout=1.0)
                victim.stop()
    finally:
        spares.close()
    report(figures.line())
    return figures


def producer_victim_trial(consumer: Consumer, victim: Child, plan: Plan, figures: Figures,
                          trial: int) -> None:
    peer = victim.local_id
    assert peer is not None
    assert consumer.connect(peer, 10.0), consumer.node.deaths.get(peer)
    first = consumer.node.sessions[peer]  # the node may replace it with a redialled one
    fault = Fault(victim, plan, figures)
    figures.trials += 1
    figures.points[plan.point] = figures.points.get(plan.point, 0) + 1
    start = time.monotonic()
    pending = list(plan.fetches)
    heard = 0

    longest = [0.0]  # the longest single step: a node blocked inside a call shows here

    def step(w: float) -> None:
        t0 = time.monotonic()
        consumer.step(peer, w)
        longest[0] = max(longest[0], time.monotonic() - t0)

    hard_end = start + 5.0 + plan.second_after + result_deadline(plan.fault)
    while time.monotonic() < hard_end:
        now = time.monotonic()
        while pending and now - start >= pending[0][0]:
            _, rid, blocks, sym = pending.pop(0)
            consumer.fetch(peer, rid, blocks, sym)
        if fault.at is None:
            heard += len(victim.take("heard"))
            results = sum(j.result is not None for j in consumer.guard.jobs)
            if ((plan.point == "delay" and now - start >= plan.point_arg)
                    or (plan.point == "heard" and heard >= plan.point_arg)
                    or (plan.point == "result" and results >= plan.point_arg)
                    or (not pending and consumer.jobs_done())):  # nothing left to hit
                fault.inject()
        fault.tick()
        if fault.done and not pending and consumer.jobs_done():
            break
        step(0.005)
    assert fault.at is not None
    assert not pending and consumer.jobs_done(), (
        f"trial {trial} ({plan}): jobs without a result after the deadline: "
        f"{[j.rid for j in consumer.guard.jobs if j.result is None]}; longest step "
        f"{longest[0]:.2f} s; session {consumer.node.sessions[peer].state}, open "
        f"{consumer.node.sessions[peer].open_counts()}, deaths {consumer.node.deaths}, "
        f"fault at +{fault.at - start:.2f} s, second signal at "
        f"{None if fault.second_at is None else round(fault.second_at - start, 2)}")
    last = max((j.at for j in consumer.guard.jobs if j.result is not None), default=fault.at)
    latency = max(0.0, last - fault.at)
    figures.max_latency = max(figures.max_latency, latency)
    assert latency <= result_deadline(plan.fault) + (
        plan.second_after if plan.fault == "stop-cont" else 0.0), (
        f"trial {trial}: last result {latency:.2f} s after the fault ({plan})")
    step_for(step, SETTLE_S)
    if fault.killed:
        victim.reap()
    got = consumer.report()
    check_guard(got, figures, trial, plan)
    if not fault.killed:
        # The producer survived its freeze: it must have cleaned up on its own, and a new
        # fetch must work (on the old session if it survived, else on a new one).
        figures.survivor_sessions += consumer.node.sessions[peer] is first and first.alive
        deadline = time.monotonic() + SURVIVOR_S
        while not settled(state := victim.request("state", reply="state", step=step)[1]):
            assert time.monotonic() < deadline, f"trial {trial}: producer not settled: {state}"
            step(0.02)
        assert not state["duplicates"] and state["results_dropped"] == 0, state
        figures.supplies += state["supplies"]
        figures.pins += state["pins"]
        figures.store_one += state["supplies"] + state["pins"]  # all done, none twice
        figures.supplies_dropped += state["supply_dropped"]
        recover(consumer, peer, trial)
    figures.redials += consumer.node.metrics.snapshot()["counters"]["redials"]


def recover(consumer: Consumer, peer: str, trial: int) -> None:
    # The node opens a lost session again by itself (NodeConfig.reconnect_backoff_s, on
    # by default; the host never calls connect again): wait, bounded, until one is
    # ready (a session opened during the freeze may first time out its handshake; the
    # next attempt follows).
    node = consumer.node
    if not node.sessions[peer].ready:
        assert node.run_until(lambda: node.sessions[peer].ready, 30.0), (
            f"trial {trial}: no session to the producer after its SIGCONT: "
            f"{node.deaths.get(peer)}")
    if not consumer.guard.fits(2):
        return
    job = consumer.fetch(peer, f"t{trial}-again", [0, 1])
    end = time.monotonic() + 10.0
    while job.result is None and time.monotonic() < end:
        consumer.step(peer, 0.01)
    assert job.result is not None and job.result.success and job.verified, (
        f"trial {trial}: fetch after the freeze: {job.result}")


def check_guard(got: dict[str, Any], figures: Figures, trial: int, plan: Plan) -> None:
    figures.jobs += got["jobs"]
    figures.exactly_one += got["exactly_one"]
    figures.succeeded += got["succeeded"]
    figures.released += got["released"]
    figures.writes_after_free += got["writes_after_free"]
    figures.canaries_changed += got["canaries_changed"]
    where = f"trial {trial} ({plan})"
    assert got["exactly_one"] == got["jobs"] == got["results"], f"{where}: {got}"
    assert not got["duplicates"] and got["results_dropped"] == 0, f"{where}: {got}"
    assert got["lookups_done"] == got["lookups"], f"{where}: {got}"
    assert got["writes_after_free"] == 0, f"{where}: a released range changed: {got}"
    assert got["canaries_changed"] == 0, f"{where}: a canary changed: {got}"
    assert got["unverified"] == 0, f"{where}: a success with wrong bytes: {got}"


# -- consumer victim: the producer in this process ------------------------------------------


def run_consumer_victim(kind: str, n: int, report: Callable[[str], None]) -> Figures:
    figures = Figures()
    spares = Spares(lambda s: {"role": "consumer", "cfg": node_kwargs()}, "consumer")
    tensor = torch.zeros((BLOCKS, BLOCK), dtype=torch.uint8)
    producer = Producer(NodeConfig(memory=tensor, **node_kwargs()), tensor.numpy(), HELD,
                        trial_seed(kind, "consumer", -1), supply_delay_s=0.1)
    try:
        for trial in range(n):
            rng = random.Random(trial_seed(kind, "consumer", trial))
            plan = draw(rng, kind, trial)
            victim = spares.take()
            try:
                consumer_victim_trial(producer, victim, plan, figures, trial)
            finally:
                victim.stop()
        # The producer's own totals over the whole campaign.
        state = producer.state()
        figures.supplies_dropped = state["supply_dropped"]
        assert settled(state) and not state["duplicates"], state
        assert state["results_dropped"] == 0, state
    finally:
        spares.close()
        producer.node.close(timeout=1.0)
    report(figures.line())
    return figures


def consumer_victim_trial(producer: Producer, victim: Child, plan: Plan, figures: Figures,
                          trial: int) -> None:
    peer = producer.node.local_id
    ok, why = victim.request("connect", peer, 10.0, reply="connected", timeout=15.0,
                             step=producer.step)[1:]
    assert ok, f"trial {trial}: consumer could not connect: {why}"
    me = victim.local_id
    assert me is not None
    first = producer.node.sessions.get(me)  # a redial of the victim's replaces it
    fault = Fault(victim, plan, figures)
    figures.trials += 1
    figures.points[plan.point] = figures.points.get(plan.point, 0) + 1
    supplies0, pins0 = len(producer.supplies), len(producer.pins)
    heard0 = len(producer.fetches_heard)
    start = time.monotonic()
    pending = list(plan.fetches)
    results = 0
    hard_end = start + 5.0 + plan.second_after + result_deadline(plan.fault)
    while time.monotonic() < hard_end:
        now = time.monotonic()
        while pending and now - start >= pending[0][0]:
            _, rid, blocks, sym = pending.pop(0)
            if fault.at is None or fault.plan.fault == "stop-cont":
                victim.send("fetch", peer, rid, blocks, sym)
            # else: the victim is dead or frozen for good; that fetch never happens
        results += len(victim.take("result"))
        if fault.at is None:
            heard = len(producer.fetches_heard) - heard0
            if ((plan.point == "delay" and now - start >= plan.point_arg)
                    or (plan.point == "heard" and heard >= plan.point_arg)
                    or (plan.point == "result" and results >= plan.point_arg)
                    or (not pending and results >= len(plan.fetches))):
                fault.inject()
        fault.tick()
        if fault.done and not pending:
            break
        producer.step(0.005)
    assert fault.done, f"trial {trial}: the fault never completed ({plan})"
    # The survivor's guarantee: every pin it took for this consumer is released within
    # the deadline (the session ends by TCP close or heartbeat for a dead/frozen victim).
    assert fault.at is not None
    deadline = fault.at + plan.second_after + result_deadline(plan.fault) + (
        TIMEOUTS.load if plan.fault == "stop-cont" else 0.0)
    mine = producer.supplies[supplies0:] + producer.pins[pins0:]

    def clean() -> bool:
        open_now = producer.node.sessions.get(me)
        dead_or_idle = open_now is None or not open_now.alive or fault.plan.fault == "stop-cont"
        return dead_or_idle and all(f.done() for f in mine) and not producer.parked_for(me)

    while not clean():
        assert time.monotonic() < deadline + SLACK_S, (
            f"trial {trial} ({plan}): producer pins/supplies still open "
            f"{sum(not f.done() for f in mine)} of {len(mine)}; {producer.state()}")
        producer.step(0.01)
    figures.max_latency = max(figures.max_latency, time.monotonic() - fault.at)
    if fault.killed:
        victim.reap()
        wait_settled(producer, trial, plan)
        count_stores(producer, supplies0, pins0, figures)
        return
    # The consumer survived its freeze: its own guarantees, from its own report.
    session = producer.node.sessions.get(me)
    figures.survivor_sessions += bool(session is first and session and session.alive)
    got = None
    end = time.monotonic() + SURVIVOR_S
    while time.monotonic() < end:
        got = victim.request("state", reply="state", step=producer.step)[1]
        if got["lookups_done"] == got["lookups"] and got["results"] == got["jobs"]:
            break
        producer.step(0.02)
    got = victim.request("report", SETTLE_S, peer, reply="report", timeout=10.0,
                         step=producer.step)[1]
    check_guard(got, figures, trial, plan)
    figures.redials += got["redials"]
    victim.stop()  # a graceful close: every pin of the consumer's requests ends with it
    wait_settled(producer, trial, plan)
    count_stores(producer, supplies0, pins0, figures)


def count_stores(producer: Producer, supplies0: int, pins0: int, figures: Figures) -> None:
    """The producer's store jobs of this trial: each resolved, none twice."""
    mine = producer.supplies[supplies0:] + producer.pins[pins0:]
    figures.supplies += len(producer.supplies) - supplies0
    figures.pins += len(producer.pins) - pins0
    assert all(f.done() for f in mine)
    figures.store_one += sum(
        producer.counted.per_job.get(("StoreResult", f.result().job_id), 1) == 1
        for f in mine)


def wait_settled(producer: Producer, trial: int, plan: Plan) -> None:
    deadline = time.monotonic() + SURVIVOR_S
    while not settled(state := producer.state()) or state["parked"]:
        assert time.monotonic() < deadline, f"trial {trial} ({plan}): not settled: {state}"
        producer.step(0.02)
    assert not state["duplicates"] and state["results_dropped"] == 0, state


# -- the tests ---------------------------------------------------------------------------


@pytest.fixture
def report(campaign_report: Callable[[str], None]) -> Iterator[Callable[[str], None]]:
    yield campaign_report


@pytest.mark.parametrize("kind", ["kill", "freeze"])
def test_producer_victim(kind: str, report: Callable[[str], None]) -> None:
    figures = run_producer_victim(kind, trials(slow=False), report)
    assert figures.trials == trials(slow=False)


@pytest.mark.parametrize("kind", ["kill", "freeze"])
def test_consumer_victim(kind: str, report: Callable[[str], None]) -> None:
    figures = run_consumer_victim(kind, trials(slow=False), report)
    assert figures.trials == trials(slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["producer", "consumer"])
@pytest.mark.parametrize("kind", ["kill", "freeze"])
def test_long(victim: str, kind: str, report: Callable[[str], None]) -> None:
    run = run_producer_victim if victim == "producer" else run_consumer_victim
    figures = run(kind, trials(slow=True), report)
    assert figures.trials == trials(slow=True)


def test_the_guard_sees_a_write_after_free_and_a_canary() -> None:
    """The checks can fail: a byte changed in a released range, or in a canary, counts."""
    import numpy as np

    from p2pfsm.session import LoadResult

    from .hosts import Guard

    guard = Guard(np.zeros((16, 64), dtype=np.uint8), 64)
    a, b = guard.place("a", [1, 2]), guard.place("b", [3])
    guard.on_result(a, LoadResult(1, "a", False, True))
    guard.on_result(b, LoadResult(2, "b", False, False))  # not released: may change
    guard.view[b.lo] = 9
    assert guard.verify()["writes_after_free"] == 0
    guard.view[a.lo + 1, 5] = 1
    assert guard.verify()["writes_after_free"] == 1
    guard.view[guard.canaries[0], 0] = 0
    assert guard.verify()["canaries_changed"] == 1
