"""ControlPlane between real processes on 127.0.0.1: dial-back, hostile identities,
dead and frozen peers, bounded close."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

import pytest
import zmq

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.zmq.admission import EVICTED, is_connect_from
from p2pfsm.executor.zmq.peer_ids import parse_peer_id
from p2pfsm.executor.zmq.plane import ControlEvent, ControlPlane, FrameIn, PeerLost
from p2pfsm.protocol import Connect, encode

from . import Child, wait_until

FAST_HEARTBEATS: dict[str, Any] = {
    "heartbeat_ivl_ms": 100,
    "heartbeat_timeout_ms": 500,
    "heartbeat_ttl_ms": 500,
}


# -- the peer process ----------------------------------------------------------------


def echo_peer(conn: Connection, options: dict[str, Any], report_drops: bool) -> None:
    """A node that answers ``ping:X`` with ``pong:X`` and reports every event (and, with
    ``report_drops``, every change of its drop counters).

    Its loop waits with select() on the plane's fileno() and the command pipe, so it
    also exercises the event-loop integration (a missed wakeup shows up as a timeout
    in the parent).
    """
    plane = ControlPlane("tcp://127.0.0.1:0", **options)
    conn.send(("local_id", plane.local_id))
    drops: dict[str, int] = {}
    try:
        while True:
            timeout = plane.next_timeout_ms()
            waitables: list[Any] = [plane.fileno(), conn]
            ready, _, _ = select.select(
                waitables, [], [], None if timeout is None else timeout / 1000
            )
            while events := plane.poll(0):
                for ev in events:
                    if isinstance(ev, FrameIn):
                        conn.send(("frame", ev.peer_id, ev.frame))
                        if ev.frame.startswith(b"ping:"):
                            plane.send(ev.peer_id, b"pong:" + ev.frame[5:])
                    elif isinstance(ev, PeerLost):
                        conn.send(("lost", ev.peer_id, ev.reason))
            if report_drops and plane.drop_counts != drops:
                drops = plane.drop_counts
                conn.send(("drops", drops))
            if conn in ready or conn.poll(0):
                cmd = conn.recv()
                if cmd[0] == "stop":
                    break
                if cmd[0] == "send":
                    conn.send(("sent", plane.send(cmd[1], cmd[2])))
                elif cmd[0] == "state":
                    conn.send(("state", plane.peers, plane.drop_counts))
    finally:
        start = time.monotonic()
        plane.close()
        conn.send(("closed", time.monotonic() - start))


@pytest.fixture
def spawn_echo() -> Any:
    children: list[Child] = []

    def start(report_drops: bool = False, **options: Any) -> tuple[Child, str]:
        child = Child(echo_peer, options, report_drops, name="echo-peer")
        children.append(child)
        (_, local_id) = child.expect("local_id", 20.0)
        return child, local_id

    try:
        yield start
    finally:
        for child in children:
            child.stop()


@pytest.fixture
def plane() -> Any:
    cp = ControlPlane("tcp://127.0.0.1:0", **FAST_HEARTBEATS)
    try:
        yield cp
    finally:
        cp.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _collect(peer: Child, done: Any, timeout: float, what: str) -> list[tuple[Any, ...]]:
    """Messages from the peer process until ``done(messages)``, within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    seen: list[tuple[Any, ...]] = []
    while not done(seen):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {what} within {timeout:.1f} s; saw {seen!r}")
        seen.append(peer.recv(remaining, what))
    return seen


def _frames(events: list[Any]) -> list[bytes]:
    return [ev.frame for ev in events if isinstance(ev, FrameIn)]


# -- peer id parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        "127.0.0.1:5555",
        b"127.0.0.1:1",
        "localhost:65535",
        "node-7.example.org:80",
        "[::1]:5555",
    ],
)
def test_parse_peer_id_accepts(raw: str | bytes) -> None:
    host, port = parse_peer_id(raw)
    assert 1 <= port <= 65535 and host


@pytest.mark.parametrize(
    "raw",
    [
        b"nocolon",
        b"\xff\xfe\x80:5555",
        "h\u00f6st:5555",
        b"127.0.0.1:http",
        b"127.0.0.1:99999",
        b"127.0.0.1:0",
        b"127.0.0.1:05555",
        b"127.0.0.1:+555",
        b"127.0.0.1:",
        b":5555",
        b"1.2.3.999:5555",
        b"host name:5555",
        b"::1:5555",
        b"[zz]:5555",
        b"-bad-.org:5555",
        b"a" * 300 + b":1",
        b"\x00abc:1",
        12345,
    ],
)
def test_parse_peer_id_rejects(raw: Any) -> None:
    with pytest.raises(TransportError):
        parse_peer_id(raw)


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ConfigError):
        ControlPlane("127.0.0.1:0")
    with pytest.raises(ConfigError):
        ControlPlane("tcp://127.0.0.1:0", max_peers=0)
    with pytest.raises(ConfigError):
        ControlPlane("tcp://127.0.0.1:0", heartbeat_ttl_ms=10**8)


# -- two processes ---------------------------------------------------------------------


def test_frames_both_ways_with_dial_back(spawn_echo: Any, plane: ControlPlane) -> None:
    peer, peer_id = spawn_echo(**FAST_HEARTBEATS)
    plane.connect(peer_id)
    assert plane.send(peer_id, b"ping:0")

    # The peer never called connect(): it learns our id from the routing id and dials back.
    assert peer.expect("frame", 10.0) == ("frame", plane.local_id, b"ping:0")
    events = wait_until(
        lambda: plane.poll(100),
        lambda seen: FrameIn(peer_id, b"pong:0") in seen,
        10.0,
        "pong over the dialled-back connection",
    )
    assert all(isinstance(ev, FrameIn) for ev in events), events
    assert plane.is_connected(peer_id)

    # The peer can also speak first on the connection it dialled back.
    assert peer.request("send", plane.local_id, b"hello", reply="sent") == ("sent", True)
    wait_until(lambda: plane.poll(100), lambda s: FrameIn(peer_id, b"hello") in s, 10.0, "hello")

    # Many frames, in order, both ways. The peer reports each ping over its pipe, so
    # read that too, or the peer blocks on a full pipe.
    count = 300
    for i in range(count):
        assert plane.send(peer_id, b"ping:%d" % i)
    reported: list[tuple[Any, ...]] = []

    def step() -> list[bytes]:
        while peer.conn.poll(0):
            reported.append(peer.conn.recv())
        return _frames(plane.poll(50))

    pongs = wait_until(step, lambda seen: len(seen) >= count, 15.0, f"{count} pongs")
    assert pongs == [b"pong:%d" % i for i in range(count)]
    while len(reported) < count:
        reported.append(peer.recv(5.0, "ping reports"))
    assert reported == [("frame", plane.local_id, b"ping:%d" % i) for i in range(count)]
    (_, peers, drops) = peer.request("state", reply="state")
    assert peers == (plane.local_id,)
    assert drops == {}


def test_hostile_identities_are_dropped_and_node_survives(
    spawn_echo: Any, plane: ControlPlane
) -> None:
    # A connect timeout far past the wait's bound: the dial-back must end on the refusal.
    peer, peer_id = spawn_echo(report_drops=True, connect_timeout_ms=120_000, **FAST_HEARTBEATS)
    bad_ids = [
        b"nocolon",
        b"\xff\xfe\x80:5555",
        b"127.0.0.1:http",
        b"127.0.0.1:99999",
        b"127.0.0.1:0",
        b"1.2.3.999:5555",
        b"host name:5555",
        b"::1:5555",
    ]
    unreachable = f"127.0.0.1:{_closed_port()}"
    expected_drops = {"bad identity": len(bad_ids), "frame count": 2}
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        for ident in bad_ids:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, ident)
            s.setsockopt(zmq.LINGER, 1000)
            s.connect(f"tcp://{peer_id}")
            s.send(b"ping:bad")
        multi = ctx.socket(zmq.DEALER)
        multi.setsockopt(zmq.IDENTITY, unreachable.encode())
        multi.setsockopt(zmq.LINGER, 1000)
        multi.connect(f"tcp://{peer_id}")
        multi.send_multipart([b"a", b"b", b"c"])  # the ROUTER sees 4 frames
        multi.send_multipart([b"", b"req-style"])  # REQ-style empty delimiter: 3 frames
        multi.send(b"dial me back")  # well formed, from a port nobody listens on

        # Every bad message is dropped and counted; the one well-formed frame is
        # delivered; the dial-back to a dead port gives up on its refusal.
        seen = _collect(
            peer,
            lambda seen: (
                ("lost", unreachable, "connection refused") in seen
                and ("drops", expected_drops) in seen
            ),
            10.0,
            "drops, frame and refused dial-back",
        )
        assert [m for m in seen if m[0] != "drops"] == [
            ("frame", unreachable, b"dial me back"),
            ("lost", unreachable, "connection refused"),
        ]

        # Still fully alive (no libzmq#3575 wedge after closing a failed dial-back).
        plane.connect(peer_id)
        plane.send(peer_id, b"ping:alive")
        wait_until(
            lambda: plane.poll(100),
            lambda seen: FrameIn(peer_id, b"pong:alive") in seen,
            10.0,
            "pong after hostile traffic",
        )
        assert peer.expect("frame", 10.0) == ("frame", plane.local_id, b"ping:alive")
        (_, peers, drops) = peer.request("state", reply="state")
        assert peers == (plane.local_id,)
        assert drops == expected_drops
    finally:
        ctx.destroy(linger=0)
    assert peer.request("stop", reply="closed")[1] < 2.0


def test_peer_limit_drops_new_identities(spawn_echo: Any) -> None:
    peer, peer_id = spawn_echo(report_drops=True, max_peers=2, connect_timeout_ms=20_000)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    # Identities of silent listeners: each dial-back stays up (TCP connects, no ZMTP)
    # until the connect timeout, so the first two fill the limit. (A closed port would
    # refuse the dial-back at once and free its slot.)
    silent = [socket.socket() for _ in range(3)]
    try:
        for listener in silent:
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
        ids = [f"127.0.0.1:{listener.getsockname()[1]}" for listener in silent]
        for ident in ids:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, ident.encode())
            s.setsockopt(zmq.LINGER, 1000)
            s.connect(f"tcp://{peer_id}")
            s.send(b"hello")
            # One at a time, so which identity is over the limit is deterministic.
            if ident != ids[-1]:
                assert peer.expect("frame", 10.0) == ("frame", ident, b"hello")
        assert peer.expect("drops", 10.0) == ("drops", {"peer limit": 1})
        (_, peers, drops) = peer.request("state", reply="state")
        assert sorted(peers) == sorted(ids[:2])
        assert drops == {"peer limit": 1}
    finally:
        ctx.destroy(linger=0)
        for listener in silent:
            listener.close()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_dead_or_frozen_peer_is_reported_lost(
    spawn_echo: Any, plane: ControlPlane, sig: signal.Signals
) -> None:
    peer, peer_id = spawn_echo(**FAST_HEARTBEATS)
    plane.connect(peer_id)
    plane.send(peer_id, b"ping:warm")
    wait_until(
        lambda: plane.poll(100),
        lambda seen: FrameIn(peer_id, b"pong:warm") in seen,
        10.0,
        "warm-up pong",
    )
    assert plane.is_connected(peer_id)
    assert _established_at(int(plane.local_id.rpartition(":")[2])) == 1  # its dial-back

    os.kill(peer.pid, sig)
    # Killed: the kernel closes the socket at once. Frozen: the ZMTP heartbeat times out
    # after 500 ms of silence (nothing else would end it: its TCP connection stays up, and
    # the connect timeout is long past). The wait is a bound load cannot reach, not a
    # measure: how soon is the benchmarks' business.
    events = wait_until(
        lambda: plane.poll(100),
        lambda seen: any(isinstance(ev, PeerLost) for ev in seen),
        60.0,
        f"PeerLost after {sig.name}",
    )
    assert [ev for ev in events if isinstance(ev, PeerLost)] == [PeerLost(peer_id, "disconnected")]
    assert plane.peers == ()
    assert plane.send(peer_id, b"ping:late") is False
    assert plane.poll(0) == [PeerLost(peer_id, "not connected")]
    # try_send tells its caller alone (the node's one report of a failed send).
    assert plane.try_send(peer_id, b"ping:later") == "not connected"
    assert plane.poll(0) == []
    # The peer's own DEALER into our ROUTER goes too, even if the peer froze before its
    # first PING: the ROUTER's own (rare) PING gets no answer.
    router_port = int(plane.local_id.rpartition(":")[2])
    deadline = time.monotonic() + 10.0
    while _established_at(router_port):
        assert time.monotonic() < deadline, "inbound connection of the dead peer kept"
        plane.poll(100)


def test_held_frames_leave_in_order_at_send_held_or_before_their_dealer_closes(
    spawn_echo: Any, plane: ControlPlane
) -> None:
    """What a node's turn holds is written at ``send_held``, each DEALER's frames in
    the order held and after the frames sent before them; a DEALER removed while it
    holds frames writes them first, so a session's last frames (a disconnect) still
    leave. Nothing failed, so ``send_held`` reports nothing."""
    peer, peer_id = spawn_echo(**FAST_HEARTBEATS)
    plane.connect(peer_id)
    assert plane.send(peer_id, b"ping:0")
    count = 100  # more than a DEALER holds at once: the first batches leave early
    for i in range(1, count):
        assert plane.hold(peer_id, b"ping:%d" % i, i) is None
    assert plane.send_held() == []
    assert plane.send_held() == []  # nothing is written twice
    frames = _collect(peer, lambda seen: len(seen) >= count, 10.0, f"{count} pings")
    assert frames == [("frame", plane.local_id, b"ping:%d" % i) for i in range(count)]
    assert plane.hold(peer_id, b"ping:last", "last") is None
    plane.remove_peer(peer_id)
    assert peer.expect("frame", 10.0) == ("frame", plane.local_id, b"ping:last")
    assert plane.send_held() == []
    assert plane.hold(peer_id, b"ping:gone", "gone") == "not connected"  # as try_send


def test_a_held_frame_that_fails_comes_back_with_its_tag_and_ends_its_dealer(
    spawn_echo: Any
) -> None:
    """Toward a frozen peer the queue fills: the first held frame that does not fit
    comes back from ``send_held`` with why and its tag, the DEALER is closed (no
    PeerLost: the caller reports it), and every frame held after it fails as not
    connected, at once or from ``send_held``: each frame is reported once."""
    frozen, frozen_id = spawn_echo()
    plane = ControlPlane("tcp://127.0.0.1:0", dealer_linger_ms=0, sndhwm=4)
    try:
        plane.connect(frozen_id)
        plane.send(frozen_id, b"ping:warm")
        wait_until(lambda: plane.poll(100), lambda seen: FrameIn(frozen_id, b"pong:warm") in seen,
                   10.0, "warm-up pong")
        os.kill(frozen.pid, signal.SIGSTOP)
        big = bytes(1 << 20)  # loopback's buffers hold a few MiB: 64 MiB cannot fit
        count = 64
        at_once = [plane.hold(frozen_id, big, i) for i in range(count)]
        later = plane.send_held()
        assert {peer_id for peer_id, _, _ in later} <= {frozen_id}
        reports = sorted([(i, why) for i, why in enumerate(at_once) if why is not None]
                         + [(tag, why) for _, why, tag in later])
        assert reports, "64 MiB toward a frozen peer all fit"
        first = reports[0][0]
        assert first > 0
        assert reports == [(first, "send queue full")] + [
            (i, "not connected") for i in range(first + 1, count)]
        assert plane.peers == ()
        assert plane.poll(0) == []  # reported to the caller alone
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
        plane.close()


def _established_at(port: int) -> int:
    """ESTABLISHED TCP connections on loopback whose local port is ``port``."""
    count = 0
    with open("/proc/net/tcp", encoding="ascii") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].rpartition(":")[2], 16) == port:
                count += 1
    return count


def test_close_is_bounded_and_idempotent(spawn_echo: Any) -> None:
    frozen, frozen_id = spawn_echo()
    plane = ControlPlane("tcp://127.0.0.1:0", dealer_linger_ms=500, sndhwm=50)
    try:
        plane.connect(frozen_id)
        plane.send(frozen_id, b"ping:warm")
        wait_until(
            lambda: plane.poll(100),
            lambda seen: FrameIn(frozen_id, b"pong:warm") in seen,
            10.0,
            "warm-up pong",
        )
        os.kill(frozen.pid, signal.SIGSTOP)
        unreachable = f"127.0.0.1:{_closed_port()}"
        plane.connect(unreachable)
        big = bytes(256 * 1024)
        sent = [plane.send(frozen_id, big) for _ in range(200)]
        assert all(plane.send(unreachable, b"queued") for _ in range(20))
        # Back-pressure toward a frozen peer ends in "send queue full", not a block.
        if not all(sent):
            assert PeerLost(frozen_id, "send queue full") in plane.poll(0)
    finally:
        start = time.monotonic()
        plane.close()
        elapsed = time.monotonic() - start
    # Bounded by the 500 ms linger, not by the frozen peer (which would block forever);
    # 30 s is a bound no load reaches, not a measure.
    assert elapsed < 30.0, f"close took {elapsed:.2f} s"
    plane.close()
    assert plane.closed
    with pytest.raises(TransportError):
        plane.poll(0)
    with pytest.raises(TransportError):
        plane.send(frozen_id, b"x")


def test_poll_timeout_is_honoured(plane: ControlPlane) -> None:
    start = time.monotonic()
    assert plane.poll(150) == []
    elapsed = time.monotonic() - start
    assert 0.14 <= elapsed < 30.0, elapsed  # waited its 150 ms; an upper bound no load reaches
    with pytest.raises(TransportError):
        plane.connect(plane.local_id)
    with pytest.raises(TransportError):
        plane.connect("not-an-id")


def test_refused_connect_is_lost_at_once_and_a_silent_one_times_out() -> None:
    """A refused TCP connect ends the peer on libzmq's first retry, not at the connect
    timeout (set far past the wait's bound); a listener that accepts TCP but never
    speaks ZMTP is a timeout, not a refusal."""
    refusing = f"127.0.0.1:{_closed_port()}"
    with ControlPlane("tcp://127.0.0.1:0", connect_timeout_ms=120_000) as patient:
        patient.connect(refusing)
        assert patient.send(refusing, b"queued")  # queued until TCP is up
        seen = wait_until(lambda: patient.poll(100), lambda seen: bool(seen), 30.0,
                          "loss of the refusing peer")
        assert seen == [PeerLost(refusing, "connection refused")]
        assert patient.peers == ()
    with socket.socket() as silent, ControlPlane("tcp://127.0.0.1:0",
                                                 connect_timeout_ms=300) as hasty:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # never accepted: the kernel completes TCP, nobody answers
        quiet = f"127.0.0.1:{silent.getsockname()[1]}"
        hasty.connect(quiet)
        seen = wait_until(lambda: hasty.poll(100), lambda seen: bool(seen), 30.0,
                          "connect timeout of the silent peer")
        assert seen == [PeerLost(quiet, "connect timeout")]


# -- the pending budget under a flood --------------------------------------------------


def _connect(peer_id: str) -> bytes:
    """A well-formed connect naming ``peer_id``: what a hardened plane dials back for."""
    return encode(Connect(peer_id=peer_id, agent_metadata=b"m", base_addr=0, num_blocks=1,
                          block_len=4096, config_fingerprint="", hash_seed="s"))


class _Flood:
    """Connects from 127.0.0.1 under ever new identities, each naming a TCP listener
    on ``named`` that never accepts: the server's dial-back reaches TCP and never
    completes ZMTP, so the handshake never finishes (until the connect timeout, set past
    the test)."""

    def __init__(self, server: str, named: str = "127.0.0.1") -> None:
        self.server = server
        self.named = named
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.listeners: list[socket.socket] = []
        self.ids: list[str] = []

    def send(self, count: int) -> list[str]:
        sent = []
        for _ in range(count):
            listener = socket.socket()
            self.listeners.append(listener)
            listener.bind((self.named, 0))
            listener.listen(8)
            ident = f"{self.named}:{listener.getsockname()[1]}"
            dealer = self.ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.IDENTITY, ident.encode())
            dealer.setsockopt(zmq.LINGER, 1000)
            dealer.connect(f"tcp://{self.server}")
            dealer.send(_connect(ident))
            sent.append(ident)
        self.ids.extend(sent)
        return sent

    def close(self) -> None:
        self.ctx.destroy(linger=0)
        for listener in self.listeners:
            listener.close()


def _until_seen(server: ControlPlane, ids: list[str], what: str) -> list[Any]:
    """Poll ``server`` until a frame from every one of ``ids`` came in."""
    want = set(ids)
    return wait_until(lambda: server.poll(50),
                      lambda seen: want <= {e.peer_id for e in seen if isinstance(e, FrameIn)},
                      30.0, what)


def _handshake_survives_flood(legit_host: str, wait_for_zmtp: bool,
                              flood_names: str = "127.0.0.1") -> None:
    """A budget of 4 unfinished handshakes, full of the flood's; a legitimate client on
    ``legit_host`` connects; 12 more flood connects arrive while its handshake is open
    (3 times the budget: oldest-first eviction would push it out); then the server
    answers, the client replies, and the server marks it ready. ``flood_names``: the
    host the flood's ids name (another than 127.0.0.1: the server dials back any host)."""
    server = ControlPlane("tcp://127.0.0.1:0", max_pending=4, dial_back_check=is_connect_from,
                          connect_timeout_ms=120_000,
                          dial_back_any_host=flood_names != "127.0.0.1")
    client = ControlPlane(f"tcp://{legit_host}:0")
    flood = _Flood(server.local_id, flood_names)
    try:
        seen = _until_seen(server, flood.send(4), "the first flood")
        legit = client.local_id
        client.connect(server.local_id)
        assert client.send(server.local_id, _connect(legit))
        seen += _until_seen(server, [legit], "the legitimate connect")
        if wait_for_zmtp:  # its dial-back came up: progress the flood's never makes
            seen += wait_until(lambda: server.poll(50), lambda _: server.is_connected(legit),
                               30.0, "the dial-back's ZMTP handshake")
        seen += _until_seen(server, flood.send(12), "the flood during the handshake")
        assert server.send(legit, b"ack-from-server"), [
            e for e in seen if isinstance(e, PeerLost) and e.peer_id == legit]
        got = wait_until(lambda: client.poll(50), lambda got: any(
            isinstance(e, FrameIn) and e.frame == b"ack-from-server" for e in got),
            30.0, "the server's answer")
        assert not [e for e in got if isinstance(e, PeerLost)], got
        assert client.send(server.local_id, b"ack-from-client")
        seen += wait_until(lambda: server.poll(50), lambda s: FrameIn(legit, b"ack-from-client")
                           in s, 30.0, "the client's reply")
        assert server.mark_ready(legit)
        lost = {e.peer_id: e.reason for e in seen if isinstance(e, PeerLost)}
        assert legit not in lost, f"the legitimate handshake was evicted: {lost}"
        # The flood evicted only its own: 16 connects, 3 slots left beside the client.
        assert set(lost) <= set(flood.ids)
        assert set(lost.values()) == {EVICTED}
        assert len(lost) == 16 - 3
        assert len([p for p in server.peers if p in flood.ids]) <= 4
        assert server.is_connected(legit)
    finally:
        flood.close()
        client.close()
        server.close()


def test_a_flood_from_one_host_never_evicts_a_handshake_from_another() -> None:
    """The flood comes from 127.0.0.1, the client from 127.0.0.2: the budget is charged
    to the host each connection came from, and a host only evicts its own or those of
    a host holding more, so the client's handshake is never pushed out, whether or not
    its dial-back has come up yet."""
    _handshake_survives_flood("127.0.0.2", wait_for_zmtp=False)


def test_a_flood_is_charged_to_the_host_it_comes_from_not_the_one_its_ids_name(
        caplog: pytest.LogCaptureFixture) -> None:
    """With dial_back_any_host, the flood (from 127.0.0.1) names hosts on 127.0.0.2, the
    client's host: the budget still charges each dial-back to the address its connection
    came from (the eviction log names it), so the flood cannot pose as the client's host
    and evict it."""
    with caplog.at_level(logging.INFO, logger="p2pfsm.zmq"):
        _handshake_survives_flood("127.0.0.2", wait_for_zmtp=False, flood_names="127.0.0.2")
    evictions = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evicting")]
    assert evictions and all("(from 127.0.0.1)" in m for m in evictions), evictions


def test_a_flood_never_evicts_a_handshake_whose_dial_back_came_up() -> None:
    """Flood and client on the same host: the client's dial-back completed its ZMTP
    handshake, the flood's never do; the flood evicts its own first."""
    _handshake_survives_flood("127.0.0.1", wait_for_zmtp=True)


def test_each_frame_names_its_connection_and_a_twin_of_a_live_id_is_never_read() -> None:
    """Every frame says which connection it came on (FrameIn.conn, libzmq's descriptor):
    the same for all frames of one connection. A second connection presenting the routing
    id of an open one is never read (no ROUTER_HANDOVER): the first is read on as before.
    Once the first has closed, a new connection under the id is read (a peer that
    connected again, again until libzmq has ended the first).
    tests/hostile: test_a_twin_of_a_live_routing_id."""
    server = ControlPlane("tcp://127.0.0.1:0", connect_timeout_ms=120_000, **FAST_HEARTBEATS)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    silent = socket.socket()
    try:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the id's host:port: its dial-back stays pending, never refused
        ident = f"127.0.0.1:{silent.getsockname()[1]}".encode()
        peer_id = ident.decode()

        def dealer() -> zmq.Socket[bytes]:
            d = ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.IDENTITY, ident)
            d.setsockopt(zmq.LINGER, 0)
            d.connect(f"tcp://{server.local_id}")
            return d

        seen: list[ControlEvent] = []

        def frames(prefix: bytes) -> list[FrameIn]:
            return [e for e in seen if isinstance(e, FrameIn) and e.peer_id == peer_id
                    and e.frame.startswith(prefix)]

        def until(prefix: bytes, count: int, what: str) -> None:
            wait_until(lambda: seen.extend(server.poll(50)) or seen,
                       lambda _got: len(frames(prefix)) >= count, 20.0, what)

        first = dealer()
        for i in range(3):
            first.send(b"first-%d" % i)
        until(b"first", 3, "the first connection's frames")
        conns = {e.conn for e in frames(b"first")}
        assert len(conns) == 1 and min(conns) >= 0, conns
        twin = dealer()
        for i in range(3):
            twin.send(b"twin-%d" % i)
        # The first is read on after the twin's frames went out; the twin's never are.
        for i in range(20):
            first.send(b"first-after-%d" % i)
        until(b"first-after-", 20, "the first connection's later frames")
        assert frames(b"twin") == [], frames(b"twin")
        assert {e.conn for e in frames(b"first")} == conns
        twin.close()
        first.close()
        # libzmq ends the first connection on its I/O thread: one that arrives before then
        # is a twin too, and is never read under the id. The peer connects again, as one
        # that is not answered would, until a connection of it is read (bounded).
        deadline = time.monotonic() + 20.0
        while not frames(b"third"):
            assert time.monotonic() < deadline, "no new connection's frame once the first closed"
            third = dealer()
            third.send(b"third")
            window = time.monotonic() + 1.0
            while not frames(b"third") and time.monotonic() < window:
                seen.extend(server.poll(50))
            third.close()
        assert frames(b"twin") == []
    finally:
        ctx.destroy(linger=0)
        silent.close()
        server.close()


# -- the new-identity rate limit ---------------------------------------------------------


def test_new_identities_past_the_rate_are_dropped_while_known_peers_are_served(
        caplog: pytest.LogCaptureFixture) -> None:
    """A server admitting 5 new identities a second per source host, on a clock the test
    drives (the sockets are real, the waits are polls under deadlines). A burst of 8 new
    identities from 127.0.0.1 gets 5 in; 3 are dropped at the door (no dial-back),
    counted and logged once, while a peer already known keeps exchanging frames, our own
    dial to a new peer works, a lost peer coming back is dialled again, and a newcomer
    from 127.0.0.2 is admitted: none of them is charged. A fifth of a second later one
    more identity from 127.0.0.1 is admitted, and the one after it dropped again."""
    caplog.set_level(logging.WARNING, logger="p2pfsm.zmq")
    now = [0.0]
    server = ControlPlane("tcp://127.0.0.1:0", dial_back_check=is_connect_from,
                          connect_timeout_ms=120_000, max_new_peers_per_s=5,
                          rate_clock=lambda: now[0])
    legit = ControlPlane("tcp://127.0.0.1:0")
    other = ControlPlane("tcp://127.0.0.1:0")
    far = ControlPlane("tcp://127.0.0.2:0")
    flood = _Flood(server.local_id)
    refused = f"127.0.0.1:{_closed_port()}"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()

    def frames_from(ids: list[str], seen: list[Any]) -> set[str]:
        return {e.peer_id for e in seen if isinstance(e, FrameIn) and e.peer_id in ids}

    def exchange(what: bytes) -> None:
        """legit -> server -> legit, both ways on connections the server knows."""
        assert legit.send(server.local_id, what)
        wait_until(lambda: server.poll(50), lambda s: FrameIn(legit.local_id, what) in s,
                   30.0, f"{what!r} at the server")
        assert server.send(legit.local_id, b"re:" + what)
        wait_until(lambda: legit.poll(50), lambda s: FrameIn(server.local_id, b"re:" + what)
                   in s, 30.0, f"the server's answer to {what!r}")

    try:
        # A peer known before the burst (it took one token at t=0).
        legit.connect(server.local_id)
        exchange(_connect(legit.local_id))
        # A peer whose dial-back is refused: lost, and remembered (one more token).
        lost = ctx.socket(zmq.DEALER)
        lost.setsockopt(zmq.IDENTITY, refused.encode())
        lost.setsockopt(zmq.LINGER, 0)
        lost.connect(f"tcp://{server.local_id}")
        lost.send(_connect(refused))
        wait_until(lambda: server.poll(50), lambda s: PeerLost(refused, "connection refused")
                   in s, 30.0, "the refused dial-back")
        assert server.rate_limited == 0

        now[0] = 10.0  # the bucket is full again: 5
        burst = flood.send(8)
        seen = wait_until(lambda: server.poll(50), lambda s: len(frames_from(burst, s)) == 5
                          and server.rate_limited == 3, 30.0, "5 of the burst in, 3 dropped")
        exchange(b"ping:during")
        admitted = frames_from(burst, seen)
        assert set(server.peers) == {legit.local_id, *admitted}  # no dial-back to the 3
        assert server.drop_counts == {"new identity rate": 3}

        # With 127.0.0.1's bucket empty: our own dial to a new peer, ...
        server.connect(other.local_id)
        assert server.send(other.local_id, b"from-server")
        wait_until(lambda: other.poll(50), lambda s: FrameIn(server.local_id, b"from-server")
                   in s, 30.0, "our own dial's frame")
        # ... the lost peer coming back (dialled again, refused again), ...
        lost.send(_connect(refused))
        wait_until(lambda: server.poll(50), lambda s: PeerLost(refused, "connection refused")
                   in s, 30.0, "the lost peer's second dial-back")
        # ... and a newcomer from another host are all let in, uncharged.
        far.connect(server.local_id)
        assert far.send(server.local_id, _connect(far.local_id))
        wait_until(lambda: server.poll(50), lambda s: FrameIn(far.local_id, _connect(
            far.local_id)) in s, 30.0, "the connect from 127.0.0.2")
        assert far.local_id in server.peers
        exchange(b"ping:after")
        assert server.rate_limited == 3

        now[0] = 10.2  # one token back
        late = flood.send(2)
        seen = wait_until(lambda: server.poll(50), lambda s: len(frames_from(late, s)) == 1
                          and server.rate_limited == 4, 30.0, "1 of 2 in after the refill")
        assert len(frames_from(late, seen)) == 1
        lines = [r.getMessage() for r in caplog.records if "new identities past" in r.message]
        assert len(lines) == 1 and "5 a second" in lines[0], lines  # one line per 10 s
    finally:
        ctx.destroy(linger=0)
        flood.close()
        for plane in (far, other, legit, server):
            plane.close()


def test_the_rate_limit_is_checked_at_construction() -> None:
    for bad in (0, -5, True, 2.5, "5"):
        with pytest.raises(ConfigError, match="max_new_peers_per_s"):
            ControlPlane("tcp://127.0.0.1:0", max_new_peers_per_s=bad)
    with pytest.raises(ConfigError, match="rate_clock"):
        ControlPlane("tcp://127.0.0.1:0", max_new_peers_per_s=5, rate_clock=1.0)  # type: ignore[arg-type]


def test_a_node_counts_rate_limited_identities_in_its_metrics() -> None:
    """The node's limit comes from NodeConfig.max_new_peers_per_s, and what the door
    dropped is the node's ``identities_rate_limited`` counter (exported to Prometheus
    with every counter)."""
    if importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None:
        pytest.skip("NIXL is not installed (.ci/install.sh installs it)")
    pytest.importorskip("torch")
    from p2pfsm.executor.node import Node, NodeConfig

    node = Node(NodeConfig("tcp://127.0.0.1:0", 16, 4096, max_new_peers_per_s=1))
    flood = _Flood(node.local_id)
    try:
        flood.send(6)  # 1 a second with a burst of 1: all 6 within a second, 5 dropped
        deadline = time.monotonic() + 30.0
        while node.control.rate_limited < 1:
            assert time.monotonic() < deadline, node.control.drop_counts
            node.step(0.05)
        node.step(0.0)
        assert node.metrics.snapshot()["counters"]["identities_rate_limited"] == (
            node.control.rate_limited)
    finally:
        flood.close()
        node.close(timeout=1.0)


_SELF_CONNECT_CHILD = """
import json, time
from p2pfsm.executor.zmq.plane import ControlPlane, PeerLost
plane = ControlPlane("tcp://127.0.0.1:5555", connect_timeout_ms=60_000)
plane.connect("127.0.0.1:{port}")
lost, end = None, time.monotonic() + 60.0
while lost is None and time.monotonic() < end:
    for ev in plane.poll(100):
        if isinstance(ev, PeerLost):
            lost = ev.reason
def self_connected():
    with open("/proc/net/tcp") as f:
        return " {me} {me} 01 " in f.read()
# The plane dropped the connection; libzmq closes it on its I/O thread, which a loaded
# machine may run a little later: the plane keeps running until the kernel has let go.
while lost is not None and self_connected() and time.monotonic() < end:
    plane.poll(100)
held = self_connected()
plane.close()
print(json.dumps({{"lost": lost, "self_connected": held}}))
"""


def test_a_dial_back_connected_to_itself_is_refused() -> None:
    """A connect to a port nobody listens on can be given that port as its own source
    (TCP simultaneous open connects the socket to itself), and a DEALER completes the
    ZMTP handshake with itself. Forced here in a network namespace of our own whose
    ephemeral range is that one port: the connection is dropped as refused. (Seen in the
    hostile flood: 1 of ~12 500 dial-backs to unbound ports in the ephemeral range held
    such a connection past the scenario's settle time.)"""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (a network namespace of its own)")
    ns = f"p2pself{os.getpid() % 100000}"
    port = 40_000
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=30)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
                       check=True, timeout=30)
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                        f"net.ipv4.ip_local_port_range={port} {port}"], check=True, timeout=30)
        code = _SELF_CONNECT_CHILD.format(port=port, me=f"0100007F:{port:04X}")
        done = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report == {"lost": "connection refused", "self_connected": False}, report
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)
