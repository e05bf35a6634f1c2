"""A real ``p2pfsm serve`` process under attack, and the checks run after every scenario.

``server`` (module scope) starts ``python -m p2pfsm.tools.cli serve`` on a free loopback port,
stderr to a file (read per scenario for the server's own account of what it rejected;
a pipe could fill and block it). After a warm-up fetch it records the baseline: open
fds (``/proc/PID/fd``) and ``VmRSS``.

``hostile`` (per test) hands the scenario an attacker context (raw pyzmq peers, real
NIXL agents, helper processes: everything registered is closed before the checks) and
``hostile.verify()`` then checks, in order:

1. the server process is alive;
2. a fresh legitimate client (a p2pfsm Node in this process, bound on
   ``AFTER_CHECK_HOST``) completes a handshake and fetches demo blocks 0-3, verified
   byte for byte;
3. within ``SETTLE_S``, polling: the server's fd count is back to the baseline exactly
   and its RSS is within an allowance of the RSS it had when this scenario started
   (re-taken per scenario, so no verdict depends on which scenarios ran before it):
   ``RSS_TOLERANCE`` by default; a scenario that makes the server queue a known volume
   passes an allowance computed from that volume (``queued_allowance``). Whether
   memory is kept for good is checked by repetition (a leak grows with each round, an
   allocator's high-water mark does not): ``test_slow_reader_repeated_does_not_grow``.

A scenario that forgets ``verify()`` gets it at teardown. A scenario that kills the
server fails, and the next one gets a fresh server. The terminal summary prints one
row per scenario: its name, the reaction seen (from the attacker's side, plus the
server's first log line about it) and the verdict.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.polling import poll_until
from helpers.requires import needs_nixl_and_torch
from helpers.serve_process import ServeProcess

from .wire import BLOCK_LEN, SERVED_BLOCKS, RawPeer

needs_nixl_and_torch()

CONNECT_TIMEOUT_S = 2.0   # serve --connect-timeout: a dial-back that never comes up
START_TIMEOUT_S = 60.0
SETTLE_S = 20.0           # fds/RSS back to the baseline within this
RSS_TOLERANCE = 96 << 20
"""Bytes above the scenario's starting RSS still counted as "back" for a scenario that
queues little: handshakes, NIXL registrations and small frames (glibc keeps what it
freed in its arenas, so RSS does not return to where it was exactly)."""
COPIES_HELD = 3
"""How many times a byte the server queued may still count in its RSS once freed: in
libzmq's buffers (its I/O thread's arena), as the Python frame, and decoded; glibc
keeps freed arena pages, so each copy can stay resident as a high-water mark."""


ZMTP_BUFFERS_PER_CONNECTION = 2 * 8192
"""What libzmq allocates for one connection's engine by its defaults: a decoder buffer of
``ZMQ_IN_BATCH_SIZE`` and an encoder buffer of ``ZMQ_OUT_BATCH_SIZE`` (8 KiB each)."""


def connections_allowance(connections: int) -> int:
    """The RSS allowance of a scenario that makes the server take ``connections`` TCP
    connections (inbound or its dial-backs) whose number depends on scheduling (a flood
    going on while other work proceeds): libzmq's configured buffers for each, as a
    high-water mark the allocator may keep, plus the ordinary tolerance."""
    return RSS_TOLERANCE + connections * ZMTP_BUFFERS_PER_CONNECTION


def queued_allowance(volume: int) -> int:
    """The RSS allowance of a scenario that makes the server hold up to ``volume`` bytes
    of frames at once (in and out): how much is queued before the peer is dropped, and so
    the high-water mark it leaves, depends on scheduling; the bound is what can be held,
    ``COPIES_HELD`` times over, plus the ordinary tolerance."""
    return RSS_TOLERANCE + COPIES_HELD * volume
LEGIT_TIMEOUT_S = 20.0
PATIENT_S = 180.0
"""A patient legitimate client's handshake and load deadline (``legit_fetch``)."""
AFTER_CHECK_HOST = "127.0.0.3"
"""The after-check's client binds here, a loopback host no scenario attacks from: the
server charges new identities to their source host (max_new_peers_per_s, the pending
budget), so an attack from 127.0.0.1 that the server is still working through cannot
turn the check into a failure of its own."""

_ROWS = pytest.StashKey[list[tuple[str, str, str]]]()
_REACTIONS = pytest.StashKey[dict[str, str]]()


class Server(ServeProcess):
    """One ``p2pfsm serve`` process, with its fd and memory baseline."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir / f"serve-{uuid.uuid4().hex[:8]}.log", SERVED_BLOCKS,
                         BLOCK_LEN, ("--connect-timeout", str(CONNECT_TIMEOUT_S)),
                         START_TIMEOUT_S)
        try:
            # Two warm-up fetches: NIXL/UCX open some descriptors with the first remote
            # agent and keep them. The baseline is the count once it holds still.
            legit_fetch(self.addr)
            legit_fetch(self.addr)
            self.base_fds = self.steady_fds()
            self.base_links = set(open_fds(self.pid))
        except BaseException:
            self.stop()
            raise
        self._log_pos = 0

    def new_log(self) -> list[str]:
        """Log lines written since the last call."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_pos)
            data = f.read()
        cut = data.rfind(b"\n") + 1
        self._log_pos += cut
        return data[:cut].decode("utf-8", "replace").splitlines()


def legit_fetch(addr: str, blocks: range = range(4), timeout: float = LEGIT_TIMEOUT_S,
                host: str = "127.0.0.1", patient: bool = False) -> None:
    """A fresh p2pfsm Node bound on ``host``: handshake, fetch ``blocks``, verify every
    byte. ``patient``: the handshake and the load may each take ``PATIENT_S`` (a server
    working through a flood on a loaded machine serves late, and late is not the
    failure such a scenario looks for)."""
    from p2pfsm.executor.node import Node, NodeConfig
    from p2pfsm.session import Timeouts
    from p2pfsm.tools.demo.host import run_fetch

    extra: dict[str, Any] = {}
    if patient:
        timeout = PATIENT_S
        extra["timeouts"] = Timeouts(handshake=PATIENT_S, load=PATIENT_S)
    node = Node(NodeConfig(f"tcp://{host}:0", num_blocks=len(blocks), block_len=BLOCK_LEN,
                           connect_timeout_ms=2000, **extra))
    try:
        report = run_fetch(node, addr, list(blocks), "pd", timeout)
    finally:
        node.close()
    assert report.success and report.verified, f"legitimate fetch failed: {report}"


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
               "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
               "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def _tcp_address(text: str) -> str:
    host, port = text.split(":")
    if len(host) == 8:  # IPv4, little-endian hex
        ip = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
    else:
        ip = f"[{host}]"
    return f"{ip}:{int(port, 16)}"


def open_fds(pid: int) -> dict[str, str]:
    """Each descriptor of ``pid`` by its link (``socket:[INODE]``, a path, ...), TCP
    sockets described from ``/proc/net/tcp``: local -> remote, state, bytes unread."""
    tcp: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            col = row.split()
            rx = int(col[4].split(":")[1], 16)
            tcp[col[9]] = (f"tcp {_tcp_address(col[1])} -> {_tcp_address(col[2])} "
                           f"{_TCP_STATES.get(col[3], col[3])} unread {rx}")
    out: dict[str, str] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        inode = link[len("socket:["):-1] if link.startswith("socket:[") else ""
        out[link] = f"fd {fd}: {tcp.get(inode, link)}"
    return out


@dataclass
class ServerBox:
    """The module's server; replaced when a scenario killed it or failed (a server a
    failed scenario left behind, still working through its attack, would fail the
    scenarios after it too)."""

    log_dir: Path
    current: Server | None = None

    def get(self) -> Server:
        if self.current is None or not self.current.alive():
            if self.current is not None:
                self.current.stop()
            self.current = Server(self.log_dir)
        return self.current

    def retire(self) -> None:
        """Stop the server; the next scenario starts a fresh one."""
        if self.current is not None:
            self.current.stop()
            self.current = None


@pytest.fixture(scope="module")
def server_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerBox]:
    box = ServerBox(tmp_path_factory.mktemp("hostile"))
    try:
        yield box
    finally:
        if box.current is not None:
            box.current.stop()


@dataclass
class Hostile:
    """One scenario's attacker context and its after-checks."""

    server: Server
    start_rss: int = 0  # the server's RSS when the scenario started
    ctx: zmq.Context[Any] = field(default_factory=zmq.Context)
    closers: list[Callable[[], None]] = field(default_factory=list)
    reaction: str = ""
    verified: bool = False
    log: list[str] = field(default_factory=list)  # server log lines of the attack

    @property
    def addr(self) -> str:
        return self.server.addr

    def peer(self, **kwargs: Any) -> RawPeer:
        p = RawPeer(self.ctx, self.server.addr, **kwargs)
        self.closers.append(p.close)
        return p

    def agent(self) -> Any:
        """A real NIXL agent with a 64-block region: real metadata and base_addr for a
        connect frame, and memory the server's writes land in."""
        from p2pfsm.executor.nixl.plane import DataPlane

        plane = DataPlane(f"hostile-{uuid.uuid4().hex[:12]}", SERVED_BLOCKS, BLOCK_LEN)
        self.closers.append(plane.close)
        return plane

    def ready(self) -> tuple[RawPeer, Any]:
        """A raw peer that completed the handshake with a real agent: (peer, agent)."""
        plane = self.agent()
        peer = self.peer()
        peer.handshake(plane.metadata, plane.base_addr)
        return peer, plane

    def on_close(self, fn: Callable[[], None]) -> None:
        self.closers.append(fn)

    def react(self, text: str) -> None:
        self.reaction = text

    def release(self) -> None:
        """Close everything the attacker holds (last opened first)."""
        while self.closers:
            fn = self.closers.pop()
            try:
                fn()
            except Exception as exc:  # one failed close must not keep the rest open
                print(f"hostile: close failed: {exc!r}")
        self.ctx.destroy(linger=0)

    def verify(self, settle_s: float = SETTLE_S, rss_allowance: int = RSS_TOLERANCE) -> None:
        """The after-checks of every scenario (see the module docstring); ``settle_s``:
        how long fds and RSS may take to come back (a scenario whose residue only the
        ROUTER's own heartbeat can end passes a longer one); ``rss_allowance``:
        bytes above the scenario's starting RSS still counted as back."""
        self.verified = True
        self.log = self.server.new_log()  # the attack's own lines, before ours
        self.release()
        srv = self.server
        assert srv.alive(), f"the server died (exit {srv.proc.returncode})"
        legit_fetch(srv.addr, host=AFTER_CHECK_HOST)

        def settled(reading: tuple[int, int]) -> bool:
            return reading[0] == srv.base_fds and reading[1] <= self.start_rss + rss_allowance

        last = poll_until(lambda: (srv.fds(), srv.rss()), settled, settle_s,
                          "fds/RSS back to baseline", at_deadline="last")
        if not settled(last):
            extra = [d for link, d in open_fds(srv.pid).items() if link not in srv.base_links]
            raise AssertionError(
                f"server not back to baseline: fds {last[0]} (baseline {srv.base_fds}), "
                f"RSS {last[1] >> 20} MiB (at the start {self.start_rss >> 20} MiB, "
                f"allowed +{rss_allowance >> 20} MiB); "
                f"descriptors not in the baseline: {extra}")
        assert srv.alive()


@pytest.fixture
def hostile(server_box: ServerBox, request: pytest.FixtureRequest) -> Iterator[Hostile]:
    srv = server_box.get()
    srv.new_log()
    h = Hostile(srv, srv.rss())
    try:
        yield h
    finally:
        try:
            if not h.verified:
                h.release()
        finally:
            seen = h.log if h.verified else srv.new_log()
            lines = [ln for ln in seen if "WARNING" in ln or "ERROR" in ln]
            note = h.reaction or "-"
            if lines:
                first = lines[0].split(" node: ", 1)[-1]
                note += f" | server: {first[:90]}" + (f" (+{len(lines) - 1})"
                                                      if len(lines) > 1 else "")
            request.config.stash.setdefault(_REACTIONS, {})[request.node.nodeid] = note
            if getattr(request.node, "_hostile_outcome", "passed") == "FAILED":
                server_box.retire()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "teardown":
        rows = item.config.stash.setdefault(_ROWS, [])
        reaction = item.config.stash.get(_REACTIONS, {}).get(item.nodeid)
        if reaction is not None:
            outcome = getattr(item, "_hostile_outcome", "passed")
            if report.failed:
                outcome = "ERROR"
            rows.append((item.name, reaction, outcome))
    elif report.when == "call" or (report.when == "setup" and not report.passed):
        verdict = "passed" if report.passed else "FAILED"
        if hasattr(report, "wasxfail"):
            verdict = "xfail" if report.skipped else "XPASS"
        elif report.skipped:
            verdict = "skipped"
        item._hostile_outcome = verdict  # type: ignore[attr-defined]
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    rows = config.stash.get(_ROWS, [])
    if not rows:
        return
    terminalreporter.section("p2pfsm hostile peers")
    width = max(len(r[0]) for r in rows)
    terminalreporter.write_line(f"{'scenario':<{width}}  {'verdict':<7}  reaction")
    for name, reaction, verdict in rows:
        terminalreporter.write_line(f"{name:<{width}}  {verdict:<7}  {reaction}")
    counts: dict[str, int] = {}
    for _, _, verdict in rows:
        counts[verdict] = counts.get(verdict, 0) + 1
    terminalreporter.write_line(", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
