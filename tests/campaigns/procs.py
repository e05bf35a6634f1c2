"""Child processes of the campaigns: a producer or a consumer host behind a pipe.

:class:`Child` starts :func:`child_main` with the ``spawn`` method (a fresh interpreter:
nothing of the test process's ZeroMQ or UCX state is inherited), optionally inside a
network namespace (``setns`` before any socket exists) and with extra environment
(``UCX_TLS``, ``UCX_NET_DEVICES``) set before NIXL is loaded. Every wait on it has a
deadline and names what it waited for; :meth:`Child.stop` always ends the process by its
PID (SIGCONT in case it is frozen, ask, then SIGKILL) and is called from teardown.

Commands (tuples) and replies:

* both: ``("stop",)``; ``("state",)`` -> ``("state", dict)`` (the host's ``state()`` /
  ``report()`` numbers).
* consumer: ``("connect", peer, timeout)`` -> ``("connected", ready, death_reason)``;
  ``("fetch", peer, rid, blocks, sym)`` -> no reply, the result comes unprompted as
  ``("result", rid, success, released, verified)``; ``("report", settle_s, peer)`` ->
  steps ``settle_s`` more, then ``("report", dict)`` (:meth:`Consumer.report`).
* producer: unprompted ``("heard", rid)`` for every fetch its host hears.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

_SPAWN = multiprocessing.get_context("spawn")
_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_REC, _MS_SLAVE, _MNT_DETACH = 0x4000, 0x80000, 2


def enter_netns(name: str) -> None:
    """Move this (single-threaded) process into the network namespace ``name``.

    As ``ip netns exec`` does, the process also gets a mount namespace of its own with
    a fresh ``/sys``: UCX checks every interface under ``/sys/class/net``, which
    otherwise still shows the namespace the process came from.
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        check(libc.setns(fd, _CLONE_NEWNET), f"setns({name})")
    finally:
        os.close(fd)
    check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    # Our mounts stop propagating back (MS_REC | MS_SLAVE on /), then a new sysfs.
    check(libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None), "mount --make-rslave /")
    check(libc.umount2(b"/sys", _MNT_DETACH), "umount /sys")
    check(libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None), "mount sysfs /sys")


class Child:
    """A spawned host process and the parent's end of its command pipe."""

    def __init__(self, spec: dict[str, Any], name: str) -> None:
        self.name = name
        self.conn, child_end = _SPAWN.Pipe()
        self.proc = _SPAWN.Process(target=child_main, args=(child_end, spec), name=name,
                                   daemon=True)
        self.proc.start()
        child_end.close()
        self.inbox: list[tuple[Any, ...]] = []
        self.local_id: str | None = None

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def pump(self) -> None:
        """Move everything the child has sent into the inbox (no wait)."""
        try:
            while self.conn.poll(0):
                self.inbox.append(self.conn.recv())
        except (EOFError, OSError):
            pass

    def take(self, tag: str) -> list[tuple[Any, ...]]:
        """Every inbox message tagged ``tag`` (removed from the inbox)."""
        self.pump()
        got = [m for m in self.inbox if m[0] == tag]
        self.inbox = [m for m in self.inbox if m[0] != tag]
        return got

    def wait(self, tag: str, timeout: float, step: Callable[[float], None] | None = None
             ) -> tuple[Any, ...]:
        """The first message tagged ``tag``; ``step`` (a node's) runs while waiting."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.take(tag)
            if got:
                self.inbox = got[1:] + self.inbox
                return got[0]
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name} (pid {self.proc.pid}, alive="
                                     f"{self.proc.is_alive()}): no {tag!r} within "
                                     f"{timeout:.1f} s; inbox {self.inbox[-5:]!r}")
            if step is not None:
                step(min(left, 0.01))
            else:
                multiprocessing.connection.wait([self.conn, self.proc.sentinel],
                                                min(left, 0.05))
            if not self.proc.is_alive() and not self.conn.poll(0):
                raise AssertionError(f"{self.name} exited ({self.proc.exitcode}) "
                                     f"before sending {tag!r}")

    def request(self, *msg: Any, reply: str, timeout: float = 10.0,
                step: Callable[[float], None] | None = None) -> tuple[Any, ...]:
        self.send(*msg)
        return self.wait(reply, timeout, step)

    def ready(self, timeout: float = 60.0) -> str:
        _, local_id = self.wait("ready", timeout)
        self.local_id = local_id
        return str(local_id)

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def reap(self, timeout: float = 10.0) -> None:
        """Wait for a killed child to be gone."""
        self.proc.join(timeout)
        assert not self.proc.is_alive(), f"{self.name} still alive after {timeout} s"

    def stop(self, timeout: float = 5.0) -> None:
        """End the child by its PID: continue it, ask it to stop, then SIGKILL."""
        if self.proc.is_alive():
            with contextlib.suppress(OSError, ValueError):
                os.kill(self.pid, signal.SIGCONT)
                self.conn.send(("stop",))
            deadline = time.monotonic() + timeout
            while self.proc.is_alive() and (left := deadline - time.monotonic()) > 0:
                ready = multiprocessing.connection.wait([self.conn, self.proc.sentinel], left)
                if self.conn in ready:
                    try:
                        self.conn.recv()  # keep it from blocking on a full pipe
                    except (EOFError, OSError):
                        self.proc.join(left)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout)
        self.conn.close()


def child_main(conn: Connection, spec: dict[str, Any]) -> None:
    """A producer or consumer host driven by one loop that also reads the pipe."""
    if spec.get("netns"):
        enter_netns(spec["netns"])
    os.environ.update(spec.get("env", {}))
    import numpy as np

    from p2pfsm.executor.nixl.memory import HostRegion
    from p2pfsm.executor.node import NodeConfig

    from .hosts import Consumer, Producer, step_for

    cfg = dict(spec["cfg"])
    arr = np.zeros((cfg["num_blocks"], cfg["block_len"]), dtype=np.uint8)
    config = NodeConfig(memory=HostRegion(arr.ctypes.data, arr.nbytes, "cpu"), **cfg)
    host: Producer | Consumer
    if spec["role"] == "producer":
        host = Producer(config, arr, spec["held"], spec.get("seed", 0),
                        spec.get("supply_delay_s", 0.0))
    else:
        host = Consumer(config, arr)
    node = host.node
    heard = 0
    reported: set[int] = set()
    peer: str | None = None
    try:
        conn.send(("ready", node.local_id))
        while True:
            while conn.poll(0):
                cmd = conn.recv()
                if cmd[0] == "stop":
                    return
                if cmd[0] == "state":
                    conn.send(("state", host.state() if isinstance(host, Producer)
                               else host.report()))
                elif cmd[0] == "connect" and isinstance(host, Consumer):
                    peer = cmd[1]
                    ok = host.connect(cmd[1], cmd[2])
                    dead = node.deaths.get(cmd[1])
                    conn.send(("connected", ok, dead.reason if dead else None))
                elif cmd[0] == "fetch" and isinstance(host, Consumer):
                    peer = cmd[1]
                    host.fetch(cmd[1], cmd[2], list(cmd[3]), cmd[4])
                elif cmd[0] == "report" and isinstance(host, Consumer):
                    step_for(functools.partial(host.step, str(cmd[2])), float(cmd[1]))
                    conn.send(("report", host.report()))
            if isinstance(host, Producer):
                host.step(0.01)
                for _, rid in host.fetches_heard[heard:]:
                    conn.send(("heard", rid))
                heard = len(host.fetches_heard)
            else:
                if peer is not None:
                    host.step(peer, 0.01)
                else:
                    node.step(0.01)
                for job in host.guard.jobs:
                    if job.result is not None and id(job) not in reported:
                        reported.add(id(job))
                        conn.send(("result", job.rid, job.result.success,
                                   job.result.released, job.verified))
    except (EOFError, BrokenPipeError):
        pass  # the test is gone
    finally:
        node.close(timeout=1.0)
