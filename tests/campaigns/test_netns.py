"""Network faults between two "hosts" in network namespaces this test creates.

Setup (fixture ``hosts``, torn down even on failure): namespaces ``p2pc<pid>a`` and
``p2pc<pid>b``, each with lo up and one end of an emulated link: a persistent TUN device
(``p2pc<pid>ta`` 10.78.0.1 peer 10.78.0.2, ``p2pc<pid>tb`` the reverse, MTU 9000), and a
forwarder child (:mod:`.tunlink`) that moves every IP packet between the two devices
under the faults the test switches on: seeded random loss, delay with jitter, reordering,
a partition. The producer child enters namespace a (``setns`` before any socket exists),
the consumer child namespace b; both run UCX over TCP only (``UCX_TLS=tcp``,
``UCX_NET_DEVICES`` = the TUN device of their namespace), so every block byte and every
control message crosses the forwarder, and the two kernels' TCP stacks see the faults.

This kernel has no ``sch_netem`` (nor tc classifiers/actions, iptables or nft): the
forwarder stands in for it (docs/explanation/reliability.md, section 2).

Phases, with fetches running through each (one result per fetch, bytes verified for
successes, no write after free, canaries intact), each proved by the forwarder's counters
(packets dropped, held back, delivered out of order):

* ``loss 1 %``, ``loss 5 %``, ``loss 10 %``: the session survives, fetches succeed;
* ``delay 20 +- 10 ms``; ``reorder``: 25 % of the packets held back 5-20 ms more;
* ``throttle``: a tbf qdisc on both TUN ends (queueing delay and tail drop);
* a ``short partition`` (< heartbeat timeout): the session survives, TCP retransmits;
* a ``long partition`` (> heartbeat timeout), then heal: both sides drop the session
  (``transport lost: disconnected``), the fetches in flight fail, and the consumer's node
  opens the session again by itself (``NodeConfig.reconnect_backoff_s``, on by default;
  counted in ``redials``): the test never calls ``connect`` again, it waits (bounded)
  for the new session to be ready; after that fetches work.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import shutil
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from p2pfsm.session import Timeouts

from .conftest import seed, trials
from .procs import Child, enter_netns
from .tunlink import Counters, Faults, Link, Snapshot, socket_in

if importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None:
    pytest.skip("NIXL is not installed (.ci/install.sh installs it)", allow_module_level=True)

BLOCK = 16 * 1024
HELD = 64  # the producer's blocks
PER_FETCH = 8
MTU = 9000
HB_IVL_MS, HB_TIMEOUT_MS = 200, 2000
TIMEOUTS = Timeouts(handshake=5.0, load=3.0, abort_ack=2.0, lookup=3.0, lookup_pending=1.0)
RESULT_S = (HB_TIMEOUT_MS + HB_IVL_MS) / 1000 + TIMEOUTS.load + TIMEOUTS.abort_ack + 2.0
ADDR_A, ADDR_B = "10.78.0.1", "10.78.0.2"
SHORT_CUT_S, LONG_CUT_S = 0.5, 4.0
# Bound on the consumer's own redial after the heal: an attempt made during the cut dies
# at the connect timeout (3 s) or its handshake deadline (5 s), the next follows after at
# most the default backoff's 5 s; then the handshake itself. Generous for a loaded box.
REDIAL_S = 3.0 + TIMEOUTS.handshake + 5.0 + 10.0
EXTRA_BATCHES = 4  # most extra batches of a phase whose fault (or fetch) left no trace yet
BATCH, CUT_BATCH, SHORT_BATCH = 20, 6, 5


def consumer_blocks(rounds: int) -> int:
    """Destination blocks for every fetch the campaign may make (each between canaries:
    ``PER_FETCH + 1`` apiece); untouched ones are never written (``np.zeros``)."""
    traced = 4 * BATCH * (1 + EXTRA_BATCHES)  # three loss phases and the reorder phase
    retried = EXTRA_BATCHES * (2 * BATCH + SHORT_BATCH)  # delay, reorder, after heal
    per_round = (traced + retried + 2 * BATCH + 2 * CUT_BATCH + SHORT_BATCH + 1
                 + EXTRA_BATCHES)
    return 2 + (PER_FETCH + 1) * ((1 + EXTRA_BATCHES) * SHORT_BATCH + rounds * per_round)


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=10)


def tc(ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", ns, "tc", *args], check=check,
                          capture_output=True, text=True, timeout=10)


@dataclass
class Hosts:
    ns_a: str
    ns_b: str
    dev_a: str
    dev_b: str
    link: Link | None = None
    children: list[Child] = field(default_factory=list)

    @property
    def wire(self) -> Link:
        assert self.link is not None
        return self.link

    def qdisc(self, *spec: str) -> bool:
        """Put ``spec`` as the root qdisc of both TUN ends; False when the kernel refuses."""
        for ns, dev in ((self.ns_a, self.dev_a), (self.ns_b, self.dev_b)):
            if tc(ns, "qdisc", "replace", "dev", dev, "root", *spec, check=False).returncode:
                self.clear()
                return False
        return True

    def qdisc_dropped(self) -> int:
        """Packets the root qdiscs of both ends dropped so far."""
        total = 0
        for ns, dev in ((self.ns_a, self.dev_a), (self.ns_b, self.dev_b)):
            out = tc(ns, "-s", "qdisc", "show", "dev", dev, check=False).stdout
            for part in out.split("(dropped ")[1:]:
                total += int(part.split(",", 1)[0])
        return total

    def queue_drops(self) -> int:
        """Packets the kernel dropped at the TUN devices themselves (tx: the queue to the
        forwarder overflowed; rx: a packet the forwarder wrote was refused): faults not
        of the forwarder's making, reported beside its counters."""
        total = 0
        for ns, dev in ((self.ns_a, self.dev_a), (self.ns_b, self.dev_b)):
            stats = json.loads(ip("-s", "-j", "link", "show", "dev", dev, ns=ns).stdout)
            total += stats[0]["stats64"]["tx"]["dropped"] + stats[0]["stats64"]["rx"]["dropped"]
        return total

    def clear(self) -> None:
        for ns, dev in ((self.ns_a, self.dev_a), (self.ns_b, self.dev_b)):
            tc(ns, "qdisc", "del", "dev", dev, "root", check=False)


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun: the emulated link needs TUN devices"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    if probe.returncode:
        return f"ip netns is unavailable: {probe.stderr.strip()}"
    return None


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    tag = f"p2pc{os.getpid() % 100000}"
    h = Hosts(f"{tag}a", f"{tag}b", f"{tag}ta", f"{tag}tb")
    try:
        for ns, dev, addr, peer in ((h.ns_a, h.dev_a, ADDR_A, ADDR_B),
                                    (h.ns_b, h.dev_b, ADDR_B, ADDR_A)):
            ip("netns", "add", ns)
            ip("tuntap", "add", "dev", dev, "mode", "tun", ns=ns)
            # No IPv6 link-local address: no router solicitations on the counted link.
            ip("link", "set", "dev", dev, "mtu", str(MTU), "addrgenmode", "none", ns=ns)
            ip("addr", "add", addr, "peer", peer, "dev", dev, ns=ns)
            ip("link", "set", "dev", dev, "up", ns=ns)
            ip("link", "set", "dev", "lo", "up", ns=ns)
        # A backstop only (it also exits when the test's end of its pipe closes): long
        # enough for the slow run's rounds at ~15 s each.
        lifetime = 600.0 + 60.0 * max(1, trials(slow=True) // 10)
        h.link = Link(h.ns_a, h.dev_a, h.ns_b, h.dev_b, seed(), lifetime)
        h.link.ready()
        yield h
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot build the namespaces: {exc.stderr.strip()}")
    finally:
        for child in h.children:
            child.stop()
        if h.link is not None:
            h.link.stop()
            assert not h.link.proc.is_alive(), "the forwarder outlived its stop"
        for ns in (h.ns_a, h.ns_b):
            ip("netns", "del", ns, check=False)  # takes its TUN device with it
        left = ip("netns", "list", check=False).stdout
        assert h.ns_a not in left and h.ns_b not in left, f"namespaces left: {left}"


def spec(role: str, ns: str, dev: str, addr: str, blocks: int) -> dict[str, Any]:
    return {"role": role, "netns": ns, "held": HELD, "seed": 5, "supply_delay_s": 0.0,
            "env": {"UCX_TLS": "tcp", "UCX_NET_DEVICES": dev},
            "cfg": {"bind": f"tcp://{addr}:0", "num_blocks": blocks, "block_len": BLOCK,
                    "fingerprint": "netns0000000000", "timeouts": TIMEOUTS,
                    "heartbeat_ivl_ms": HB_IVL_MS, "heartbeat_timeout_ms": HB_TIMEOUT_MS,
                    "connect_timeout_ms": 3000}}


@dataclass
class Phase:
    name: str
    faults: Faults = field(default_factory=Faults)
    fetches: int = 0
    results: int = 0
    succeeded: int = 0
    failed_released: int = 0  # failed, the destination handed back (abort_ack came)
    failed_held: int = 0  # failed, the destination not handed back (session over)
    rids: list[str] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)  # the failed_released ones
    retried: int = 0  # fetches sent again after a clean failure (``must_verify`` phases)
    seconds: float = 0.0
    died: bool = False
    producer_died: bool = False
    reconnected: bool = False
    wire: Counters = field(default_factory=Counters)  # both directions, this phase
    wire_ab: Counters = field(default_factory=Counters)  # producer -> consumer
    tc_dropped: int = 0

    def line(self) -> str:
        if self.died:
            tail = "session died on both sides" if self.producer_died else "session died"
            tail += ", opened again by the consumer's node" if self.reconnected else ""
        else:
            tail = "session survived"
        w = self.wire
        tbf = f", {self.tc_dropped} dropped by tbf" if self.tc_dropped else ""
        fails = (f" ({self.failed_released} failed released, {self.failed_held} failed "
                 f"not released)" if self.failed_released + self.failed_held else "")
        fails += f", {self.retried} of them sent again" if self.retried else ""
        return (f"{self.name}: {self.fetches} fetches, {self.results} results, "
                f"{self.succeeded} verified{fails} in {self.seconds:.1f} s; link: "
                f"{w.read} packets, "
                f"{w.lost} lost, {w.cut} cut, {w.held} held back, {w.reordered} reordered"
                f"{tbf}, {self.wire_ab.bytes / 2**20:.1f} MiB producer->consumer; {tail}")


class Pair:
    """The two children and the consumer's view of the session."""

    def __init__(self, h: Hosts, rounds: int) -> None:
        self.h = h
        self.producer = Child(spec("producer", h.ns_a, h.dev_a, ADDR_A, HELD), "ns-producer")
        h.children.append(self.producer)
        self.consumer = Child(spec("consumer", h.ns_b, h.dev_b, ADDR_B,
                                   consumer_blocks(rounds)), "ns-consumer")
        h.children.append(self.consumer)
        self.peer = self.producer.ready()
        self.consumer_id = self.consumer.ready()
        self.serial = 0

    def connect(self) -> tuple[bool, str | None]:
        _, ok, why = self.consumer.request("connect", self.peer, 10.0, reply="connected",
                                           timeout=15.0)
        return bool(ok), why

    def fetches(self, phase: Phase, n: int, during: Callable[[], None] | None = None) -> None:
        """``n`` fetches of 8 blocks; ``during`` (the fault) runs once they are sent."""
        for _ in range(n):
            self.serial += 1
            blocks = [(self.serial * PER_FETCH + k) % HELD for k in range(PER_FETCH)]
            phase.rids.append(f"ns-{self.serial}")
            self.consumer.send("fetch", self.peer, phase.rids[-1], blocks, False)
        phase.fetches += n
        if during is not None:
            during()
        for _ in range(n):
            _, rid, success, released, verified = self.consumer.wait("result", RESULT_S)
            phase.results += 1
            if success:
                assert verified, f"{phase.name}: a success with wrong bytes"
                phase.succeeded += 1
            elif released:
                phase.failed_released += 1
                phase.aborted.append(rid)
            else:
                phase.failed_held += 1

    def counts(self) -> tuple[int, int, int]:
        """The consumer's session deaths and redials, the producer's deaths, so far."""
        got = self.consumer.request("state", reply="state")[1]
        producer = self.producer.request("state", reply="state")[1]
        return int(got["deaths"]), int(got["redials"]), int(producer["counters"]["deaths"])

    def settle(self, phase: Phase, before: tuple[int, int, int]) -> None:
        """After a phase: did the session die (on both sides)? Then wait for the one the
        consumer's node opens again by itself.

        Deaths are read from the counters, not from ``alive``: the node redials the
        moment its session dies, so by now the session it shows may be a new one."""
        deaths, redials, producer_deaths = before
        phase.died = self.counts()[0] > deaths
        if not phase.died:
            return
        # Both sides run the same heartbeat timeout: the producer's verdict is due within
        # about one heartbeat interval of the consumer's, or it comes when the redial's
        # connect reaches it after the heal (a reconnect ends the old session too).
        deadline = time.monotonic() + REDIAL_S
        while not phase.producer_died and time.monotonic() < deadline:
            phase.producer_died = self.counts()[2] > producer_deaths
        got = self.consumer.request("state", reply="state")[1]
        while not got["ready"].get(self.peer, False) and time.monotonic() < deadline:
            got = self.consumer.request("state", reply="state")[1]
        assert got["ready"].get(self.peer, False), (
            f"{phase.name}: the consumer's node opened no new session within "
            f"{REDIAL_S:.0f} s of the phase's end: {got}")
        assert got["redials"] > redials, f"{phase.name}: ready without a redial: {got}"
        phase.reconnected = True

    def report(self) -> dict[str, Any]:
        got: dict[str, Any] = self.consumer.request("report", 0.3, self.peer, reply="report",
                                                    timeout=15.0)[1]
        return got


def cut(link: Link, seconds: float) -> Callable[[], None]:
    """A partition of ``seconds``, then the heal (the clean link)."""
    def run() -> None:
        link.partition(seconds)

    return run


def network_faults(hosts: Hosts, campaign_report: Callable[[str], None], rounds: int) -> None:
    link = hosts.wire
    pair = Pair(hosts, rounds)
    ok, why = pair.connect()
    assert ok, f"no session over the TUN link with UCX_TLS=tcp: {why}"
    phases: list[Phase] = []

    def run(phase: Phase, n: int, during: Callable[[], None] | None = None,
            again: Callable[[Phase, Counters], bool] | None = None,
            must_verify: bool = False) -> Phase:
        """``n`` fetches under ``phase.faults``; while ``again`` (of the phase and its
        counters so far) says so, up to EXTRA_BATCHES more batches.

        ``must_verify``: a phase whose every fetch must succeed. A fetch that failed
        cleanly (aborted, its blocks handed back) is sent again, up to EXTRA_BATCHES
        times: on a loaded machine a fetch over the Python forwarder can outlive the
        3 s load timeout, and that abort is the protocol working, not a fault of the
        link. A failure that kept the blocks, or a death, is never retried."""
        counts = pair.counts()
        before = link.set(phase.faults)
        tc_before = hosts.qdisc_dropped()
        start = time.monotonic()
        pair.fetches(phase, n, during)
        for _ in range(EXTRA_BATCHES):
            if again is None or not again(phase, link.counters().minus(before).both):
                break
            pair.fetches(phase, n)
        for _ in range(EXTRA_BATCHES if must_verify else 0):
            missing = phase.fetches - phase.retried - phase.succeeded
            if missing == 0 or phase.failed_held:
                break
            phase.retried += missing
            pair.fetches(phase, missing)
        phase.seconds = time.monotonic() - start
        delta: Snapshot = link.set(Faults()).minus(before)
        phase.wire, phase.wire_ab = delta.both, delta.ab
        phase.tc_dropped = hosts.qdisc_dropped() - tc_before
        hosts.clear()
        pair.settle(phase, counts)
        phases.append(phase)
        campaign_report(phase.line())
        return phase

    def nothing_lost(_: Phase, c: Counters) -> bool:  # a random fault may miss a batch
        return c.lost == 0

    def nothing_reordered(_: Phase, c: Counters) -> bool:
        return c.reordered == 0

    def no_success(p: Phase, _: Counters) -> bool:
        return p.succeeded == 0

    def all_verified(p: Phase) -> bool:
        return p.fetches - p.retried == p.succeeded and not p.failed_held and not p.died

    healthy = run(Phase("clean"), SHORT_BATCH, must_verify=True)
    assert all_verified(healthy), healthy.line()
    assert healthy.wire.dropped == 0 and healthy.wire.reordered == 0, healthy.line()
    for r in range(rounds):
        tag = f"[round {r + 1}/{rounds}] " if rounds > 1 else ""
        for loss in (0.01, 0.05, 0.10):
            faults = Faults(loss=loss)
            p = run(Phase(f"{tag}{faults.describe()}", faults), BATCH, again=nothing_lost)
            assert p.wire.lost > 0, f"{p.name}: the forwarder dropped nothing"
            assert p.succeeded > 0 and not p.died, p.line()
        faults = Faults(delay_s=0.020, jitter_s=0.010)
        p = run(Phase(f"{tag}{faults.describe()}", faults), BATCH, must_verify=True)
        assert all_verified(p), p.line()
        assert p.wire.forwarded > 0 and p.wire.dropped == 0, p.line()
        faults = Faults(reorder=0.25, reorder_s=(0.005, 0.020))
        p = run(Phase(f"{tag}{faults.describe()}", faults), BATCH, again=nothing_reordered,
                must_verify=True)
        assert p.wire.held > 0 and p.wire.reordered > 0, f"nothing reordered: {p.line()}"
        assert all_verified(p), p.line()
        assert hosts.qdisc("tbf", "rate", "8mbit", "burst", "16kb", "limit", "16kb"), "no tbf"
        p = run(Phase(f"{tag}throttle (tbf 8mbit, 16 KiB queue on both TUN ends)"), BATCH)
        assert p.succeeded > 0 and not p.died, p.line()
        p = run(Phase(f"{tag}short partition {SHORT_CUT_S} s (< heartbeat timeout "
                      f"{HB_TIMEOUT_MS} ms)"), CUT_BATCH, cut(link, SHORT_CUT_S))
        assert p.wire.cut > 0 and not p.died, p.line()
        p = run(Phase(f"{tag}long partition {LONG_CUT_S} s (> heartbeat timeout "
                      f"{HB_TIMEOUT_MS} ms), heal"), CUT_BATCH, cut(link, LONG_CUT_S))
        assert p.wire.cut > 0, p.line()
        assert p.died and p.producer_died, \
            f"the session outlived a partition longer than its heartbeats: {p.line()}"
        # The new session reuses the NIXL agent and its UCX TCP connection, which may sit
        # in retransmission backoff from the partition (WRITEs were on it at the cut):
        # its first fetch can time out. One fetch at a time until one succeeds.
        p = run(Phase(f"{tag}first fetch after heal"), 1, again=no_success)
        assert p.succeeded == 1, f"no fetch works after the heal: {p.line()}"
        after = run(Phase(f"{tag}after heal"), SHORT_BATCH, must_verify=True)
        assert all_verified(after), after.line()

    verified = sum(p.succeeded for p in phases)
    sent = sum(p.wire_ab.bytes for p in phases)
    campaign_report(f"forwarder carried {sent / 2**20:.1f} MiB producer->consumer for "
                    f"{verified} verified fetches of {PER_FETCH} x {BLOCK >> 10} KiB "
                    f"(UCX_TLS=tcp over TUN devices, MTU {MTU})")
    assert sent >= verified * PER_FETCH * BLOCK, "the blocks did not cross the emulated link"
    got = pair.report()
    producer = pair.producer.request("state", reply="state")[1]
    late = set(got["after_free_rids"])
    for phase in phases:
        if mine := sorted(late & set(phase.rids)):
            campaign_report(f"  {phase.name}: WRITTEN AFTER RELEASE: {', '.join(mine)}")
    served = producer["counters"].get("served_bytes", 0) // (PER_FETCH * BLOCK)
    campaign_report(
        f"totals: {got['jobs']} fetches, exactly one result: {got['exactly_one']}, writes "
        f"after free: {got['writes_after_free']} ({len(got['after_free_whole'])} of them the "
        f"fetch's whole blocks), canaries changed: {got['canaries_changed']}; consumer "
        f"deaths: {got['deaths']}; producer WRITEs reported DONE: {served}; packets dropped "
        f"by the kernel at the TUN devices (not by the forwarder): {hosts.queue_drops()}")
    assert got["exactly_one"] == got["jobs"] == got["results"], got
    assert got["canaries_changed"] == 0, got
    assert got["unverified"] == 0 and not got["duplicates"], got
    assert not producer["duplicates"] and producer["results_dropped"] == 0, producer
    aborted = {rid for phase in phases for rid in phase.aborted}
    assert late <= aborted, f"written after release, not after an abort: {late - aborted}"
    assert not late, f"written after release: {sorted(late)}"


def test_network_faults(hosts: Hosts, campaign_report: Callable[[str], None]) -> None:
    network_faults(hosts, campaign_report, rounds=1)


@pytest.mark.slow
def test_network_faults_long(hosts: Hosts, campaign_report: Callable[[str], None]) -> None:
    network_faults(hosts, campaign_report, rounds=max(1, trials(slow=True) // 10))


def udp_through(h: Hosts, faults: Faults, n: int = 200, wait_s: float = 2.0
                ) -> tuple[list[int], list[float], Counters]:
    """Send ``n`` numbered datagrams from a to b under ``faults``: the numbers in arrival
    order, each one's latency, and the forwarder's a->b counters for them."""
    link = h.wire
    tx, rx = socket_in(h.ns_a), socket_in(h.ns_b)
    with tx, rx:
        rx.bind((ADDR_B, 0))
        rx.setblocking(False)
        before = link.set(faults)
        for i in range(n):
            tx.sendto(struct.pack("!Id", i, time.monotonic()), rx.getsockname())
        seqs: list[int] = []
        lat: list[float] = []
        deadline = time.monotonic() + wait_s
        gone = 0  # dropped by the forwarder so far
        while len(seqs) + gone < n and time.monotonic() < deadline:
            if select.select([rx], [], [], 0.05)[0]:
                while True:
                    try:
                        seq, sent = struct.unpack("!Id", rx.recv(64))
                    except BlockingIOError:
                        break
                    seqs.append(seq)
                    lat.append(time.monotonic() - sent)
            else:
                gone = link.counters().minus(before).ab.dropped
        ab = link.set(Faults()).minus(before).ab
    return seqs, lat, ab


def test_emulated_link_applies_its_faults(hosts: Hosts,
                                          campaign_report: Callable[[str], None]) -> None:
    """The forwarder alone, with numbered UDP datagrams: each fault does what it says,
    seen by the receiver, and the counters agree with what the receiver saw."""
    n = 200
    seqs, lat, ab = udp_through(hosts, Faults(), n)
    assert seqs == list(range(n)) and ab.forwarded == n and ab.dropped == 0, (seqs, ab)
    figures = [f"clean: {len(seqs)} in order, median {1e3 * sorted(lat)[n // 2]:.1f} ms"]

    seqs, _, ab = udp_through(hosts, Faults(loss=0.2), n)
    assert ab.read == n and len(seqs) == ab.forwarded == n - ab.lost, (seqs, ab)
    assert 0.1 * n <= ab.lost <= 0.3 * n, ab
    assert seqs == sorted(seqs), "loss alone reordered"
    figures.append(f"loss 20 %: {ab.lost} lost, {len(seqs)} arrived")

    seqs, lat, ab = udp_through(hosts, Faults(delay_s=0.030, jitter_s=0.005), n)
    assert len(seqs) == n and min(lat) >= 0.025, (min(lat), ab)
    figures.append(f"delay 30+-5 ms: latency {1e3 * min(lat):.1f}-{1e3 * max(lat):.1f} ms")

    seqs, _, ab = udp_through(hosts, Faults(reorder=0.3, reorder_s=(0.005, 0.020)), n)
    late = sum(1 for k in range(1, len(seqs)) if seqs[k] < max(seqs[:k]))
    assert sorted(seqs) == list(range(n)) and ab.held > 0 and ab.reordered > 0, ab
    assert late > 0, "the receiver saw everything in order"
    figures.append(f"reorder 30 %: {ab.held} held back, {ab.reordered} reordered, the "
                   f"receiver saw {late} late")

    seqs, _, ab = udp_through(hosts, Faults(partition=True), n, wait_s=0.3)
    assert seqs == [] and ab.cut == n, (seqs, ab)
    figures.append(f"partition: {ab.cut} cut, {len(seqs)} arrived")
    campaign_report(f"emulated link alone, {n} UDP datagrams a->b per fault: "
                    + "; ".join(figures))


def test_setns_refuses_a_missing_namespace() -> None:
    """The child's way into a namespace fails loudly, not silently in the root one."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    with pytest.raises(OSError):
        enter_netns("p2pfsm-no-such-namespace")
