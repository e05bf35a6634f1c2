"""A userspace network emulator: one link between two namespaces, made of two TUN devices.

This kernel has no ``sch_netem`` (nor tc classifiers/actions, iptables or nft), so random
loss, delay and reordering are applied by a process instead: each namespace holds one
end, a persistent TUN device (``ip -n NS tuntap add dev D mode tun``, point-to-point
addresses, a large MTU), and :func:`forwarder_main`, a spawned child, attaches to both
(``setns`` into a namespace, ``open /dev/net/tun``, ``TUNSETIFF`` with ``IFF_TUN |
IFF_NO_PI``, ``setns`` back: the fd stays bound to its device whatever namespace the
process is in). It reads every IP packet one end's kernel sends and writes it into the
other end, where the kernel receives it as if from a wire, after applying the current
:class:`Faults`:

* ``loss``: each packet is dropped with this probability;
* ``delay_s`` +- ``jitter_s`` (uniform): each packet is held that long;
* ``reorder``: with this probability a packet is held back ``reorder_s`` (uniform range)
  longer, so later packets overtake it;
* ``partition``: everything read is dropped, and so is everything queued when it starts.

All random choices come from one ``random.Random(seed)``. The two kernels' TCP stacks see
real lost, late and out-of-order segments and recover as they would on a wire.

The forwarder counts per direction (``ab``: a's kernel to b's, ``ba``): packets read,
forwarded, dropped for loss, dropped by the partition, held back, and *reordered* (written
after a packet that was read later in the same direction: measured at the output, not
inferred from the decision), plus bytes forwarded and failed writes.

Control is a pipe: ``("faults", dict)`` -> ``("counters", dict)`` (the counters at the
switch), ``("counters",)`` -> ``("counters", dict)``, ``("stop",)``. Every wait has a
bound: ``select`` at most 50 ms at a time, and the forwarder exits on its own after
``lifetime_s`` or when the test's end of the pipe closes. :meth:`Link.stop` ends it by
its PID (ask, then SIGKILL) and is called from teardown.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import heapq
import multiprocessing
import multiprocessing.connection
import os
import random
import select
import socket
import struct
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

_SPAWN = multiprocessing.get_context("spawn")
_CLONE_NEWNET = 0x40000000
_TUNSETIFF = 0x400454CA  # _IOW('T', 202, int)
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
_MAX_PACKET = 65536
_POLL_S = 0.05
DIRECTIONS = ("ab", "ba")


@dataclass(frozen=True)
class Faults:
    """What the link does to every packet from now on (the default: nothing)."""

    loss: float = 0.0
    delay_s: float = 0.0
    jitter_s: float = 0.0
    reorder: float = 0.0
    reorder_s: tuple[float, float] = (0.005, 0.020)
    partition: bool = False

    def describe(self) -> str:
        if self.partition:
            return "partition (drop all)"
        parts = []
        if self.loss:
            parts.append(f"loss {self.loss:.0%}")
        if self.delay_s or self.jitter_s:
            parts.append(f"delay {self.delay_s * 1e3:.0f}+-{self.jitter_s * 1e3:.0f} ms")
        if self.reorder:
            lo, hi = self.reorder_s
            parts.append(f"reorder {self.reorder:.0%} +{lo * 1e3:.0f}-{hi * 1e3:.0f} ms")
        return ", ".join(parts) or "clean"


@dataclass
class Counters:
    """One direction's counts since the forwarder started."""

    read: int = 0
    forwarded: int = 0
    bytes: int = 0
    lost: int = 0  # dropped for ``loss``
    cut: int = 0  # dropped by a partition
    held: int = 0  # given the extra ``reorder_s`` delay
    reordered: int = 0  # written after a packet read later
    write_errors: int = 0

    @property
    def dropped(self) -> int:
        return self.lost + self.cut

    def minus(self, before: Counters) -> Counters:
        return Counters(**{f.name: getattr(self, f.name) - getattr(before, f.name)
                           for f in dataclasses.fields(self)})

    def plus(self, other: Counters) -> Counters:
        return Counters(**{f.name: getattr(self, f.name) + getattr(other, f.name)
                           for f in dataclasses.fields(self)})


@dataclass
class Snapshot:
    """Both directions' counters at one moment."""

    ab: Counters = field(default_factory=Counters)
    ba: Counters = field(default_factory=Counters)

    @classmethod
    def of(cls, raw: dict[str, dict[str, int]]) -> Snapshot:
        return cls(Counters(**raw["ab"]), Counters(**raw["ba"]))

    def minus(self, before: Snapshot) -> Snapshot:
        return Snapshot(self.ab.minus(before.ab), self.ba.minus(before.ba))

    @property
    def both(self) -> Counters:
        return self.ab.plus(self.ba)


def _setns(fd: int, what: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns({what}): {os.strerror(err)}")


def open_tun(netns: str, dev: str) -> int:
    """A non-blocking fd on the TUN device ``dev`` of namespace ``netns``.

    The process enters the namespace only to attach (``TUNSETIFF`` looks the name up in
    the caller's namespace) and is back in its own before this returns.
    """
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(there, netns)
        try:
            fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
            try:
                fcntl.ioctl(fd, _TUNSETIFF,
                            struct.pack("16sH", dev.encode(), _IFF_TUN | _IFF_NO_PI))
            except OSError:
                os.close(fd)
                raise
        finally:
            _setns(home, "the forwarder's own")
    finally:
        os.close(there)
        os.close(home)
    return fd


def socket_in(netns: str, kind: socket.SocketKind = socket.SOCK_DGRAM) -> socket.socket:
    """An IPv4 socket of namespace ``netns`` (a socket belongs to the namespace it was
    made in; the calling thread goes there for the ``socket()`` call and comes back)."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    there = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(there, netns)
        try:
            return socket.socket(socket.AF_INET, kind)
        finally:
            _setns(home, "the test's own")
    finally:
        os.close(there)
        os.close(home)


class _Forwarder:
    """The forwarding loop's state (lives in the forwarder process)."""

    def __init__(self, fd_a: int, fd_b: int, seed: int) -> None:
        self.out = {fd_a: fd_b, fd_b: fd_a}
        self.dir = {fd_a: "ab", fd_b: "ba"}
        self.rng = random.Random(seed)
        self.faults = Faults()
        self.counts = {d: Counters() for d in DIRECTIONS}
        self.arrivals = dict.fromkeys(DIRECTIONS, 0)  # packets read so far
        self.latest = dict.fromkeys(DIRECTIONS, -1)  # highest arrival number written
        self.queue: list[tuple[float, int, str, int, bytes]] = []  # due, n, dir, fd, pkt

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {d: dataclasses.asdict(c) for d, c in self.counts.items()}

    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        if faults.partition:  # whatever is on the wire is lost with it
            for _, _, d, _, _ in self.queue:
                self.counts[d].cut += 1
            self.queue.clear()

    def receive(self, fd: int, now: float) -> None:
        """Read what ``fd``'s kernel has sent (at most 256 packets) and schedule it."""
        d, f = self.dir[fd], self.faults
        c = self.counts[d]
        for _ in range(256):
            try:
                pkt = os.read(fd, _MAX_PACKET)
            except BlockingIOError:
                return
            n = self.arrivals[d]
            self.arrivals[d] += 1
            c.read += 1
            if f.partition:
                c.cut += 1
                continue
            if f.loss and self.rng.random() < f.loss:
                c.lost += 1
                continue
            # Timed from this packet's own read, not from the turn's start: a packet read
            # late in a long batch (a busy machine) would otherwise be held too briefly.
            now = time.monotonic()
            due = now + f.delay_s
            if f.jitter_s:
                due += self.rng.uniform(-f.jitter_s, f.jitter_s)
            if f.reorder and self.rng.random() < f.reorder:
                due += self.rng.uniform(*f.reorder_s)
                c.held += 1
            heapq.heappush(self.queue, (max(due, now), n, d, self.out[fd], pkt))

    def release(self, now: float) -> float | None:
        """Write every packet that is due; the time the next one is (None: none queued)."""
        while self.queue and self.queue[0][0] <= now:
            _, n, d, out, pkt = heapq.heappop(self.queue)
            c = self.counts[d]
            if n < self.latest[d]:
                c.reordered += 1
            else:
                self.latest[d] = n
            try:
                os.write(out, pkt)
            except OSError:
                c.write_errors += 1
                continue
            c.forwarded += 1
            c.bytes += len(pkt)
        return self.queue[0][0] if self.queue else None


def forwarder_main(conn: Connection, ends: tuple[str, str, str, str], seed: int,
                   lifetime_s: float) -> None:
    """Forward between the TUN devices ``ends`` = (ns_a, dev_a, ns_b, dev_b)."""
    fd_a = open_tun(ends[0], ends[1])
    fd_b = open_tun(ends[2], ends[3])
    fw = _Forwarder(fd_a, fd_b, seed)
    ctl = conn.fileno()
    end = time.monotonic() + lifetime_s
    heal_at: float | None = None  # a timed partition ends then ("partition" command)
    try:
        conn.send(("ready", os.getpid()))
        while (now := time.monotonic()) < end:
            if heal_at is not None and now >= heal_at:
                heal_at = None
                fw.set_faults(Faults())
                conn.send(("healed", fw.snapshot()))
            nxt = fw.release(now)
            if heal_at is not None:
                nxt = heal_at if nxt is None else min(nxt, heal_at)
            wait = _POLL_S if nxt is None else min(_POLL_S, max(0.0, nxt - now))
            ready, _, _ = select.select([fd_a, fd_b, ctl], [], [], wait)
            now = time.monotonic()
            for fd in ready:
                if fd != ctl:
                    fw.receive(fd, now)
            if ctl in ready:
                cmd = conn.recv()
                if cmd[0] == "stop":
                    return
                if cmd[0] == "faults":
                    conn.send(("counters", fw.snapshot()))
                    fw.set_faults(Faults(**cmd[1]))
                    heal_at = None
                elif cmd[0] == "partition":
                    conn.send(("counters", fw.snapshot()))
                    fw.set_faults(Faults(partition=True))
                    heal_at = time.monotonic() + cmd[1]
                elif cmd[0] == "counters":
                    conn.send(("counters", fw.snapshot()))
    except (EOFError, BrokenPipeError):
        pass  # the test is gone
    finally:
        os.close(fd_a)
        os.close(fd_b)


class Link:
    """The test's handle on a forwarder child between two TUN ends."""

    def __init__(self, ns_a: str, dev_a: str, ns_b: str, dev_b: str, seed: int,
                 lifetime_s: float = 900.0) -> None:
        self.conn, child_end = _SPAWN.Pipe()
        self.proc = _SPAWN.Process(target=forwarder_main,
                                   args=(child_end, (ns_a, dev_a, ns_b, dev_b), seed,
                                         lifetime_s),
                                   name="tun-forwarder", daemon=True)
        self.proc.start()
        child_end.close()
        self.faults = Faults()

    def _reply(self, tag: str, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise AssertionError(f"forwarder (pid {self.proc.pid}, alive="
                                 f"{self.proc.is_alive()}): no {tag!r} within {timeout} s")
        got = self.conn.recv()
        assert got[0] == tag, got
        return got[1]

    def ready(self, timeout: float = 30.0) -> None:
        self._reply("ready", timeout)

    def set(self, faults: Faults) -> Snapshot:
        """Switch the faults; the counters at the switch."""
        self.conn.send(("faults", dataclasses.asdict(faults)))
        self.faults = faults
        return Snapshot.of(self._reply("counters", 10.0))

    def partition(self, seconds: float) -> Snapshot:
        """Cut the link for ``seconds``, timed by the forwarder's own loop, and return
        once it reports the heal (the clean link); the counters at the heal."""
        self.conn.send(("partition", seconds))
        self.faults = Faults(partition=True)
        self._reply("counters", 10.0)
        healed = Snapshot.of(self._reply("healed", seconds + 10.0))
        self.faults = Faults()
        return healed

    def counters(self) -> Snapshot:
        self.conn.send(("counters",))
        return Snapshot.of(self._reply("counters", 10.0))

    def stop(self, timeout: float = 5.0) -> None:
        """End the forwarder by its PID: ask, then SIGKILL."""
        if self.proc.is_alive():
            with contextlib.suppress(OSError, ValueError):
                self.conn.send(("stop",))
            self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout)
        self.conn.close()
