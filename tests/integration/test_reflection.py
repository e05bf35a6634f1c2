"""No reflection, no lock-out: what a node dials back, and who may crowd its peer table.

A real :class:`Node` on 127.0.0.1 (driven from the test's thread) or a real
``p2pfsm serve``; the attackers are raw pyzmq DEALERs with chosen identities, and the
ports their identities name are plain TCP listeners bound by the test, so "no dial-back"
is checked where it would show: no TCP connection arrives there within a bounded wait.
Both 127.0.0.1 and 127.0.0.2 are loopback addresses, so a connection from "another
host" is one whose source the DEALER binds to 127.0.0.2.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq

from p2pfsm.protocol import Connect, encode

if importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None:
    pytest.skip("NIXL is not installed (.ci/install.sh installs it)", allow_module_level=True)
pytest.importorskip("torch")

from p2pfsm.executor.node import Node, NodeConfig

from . import drive

BLOCK = 4096
SEED = "vllm-none-hash"
NO_DIAL_WAIT = 1.0  # seconds a listener waits for a dial-back that must not come
CLI = [sys.executable, "-m", "p2pfsm.tools.cli"]


def connect_frame(peer_id: str, block_len: int = BLOCK) -> bytes:
    """A well-formed connect that our node would accept the handshake of."""
    return encode(Connect(peer_id=peer_id, agent_metadata=b"not-really-nixl", base_addr=0,
                          num_blocks=16, block_len=block_len, config_fingerprint="",
                          hash_seed=SEED))


def listener(host: str = "127.0.0.1") -> socket.socket:
    """A TCP listener that never accepts on its own: a dial-back shows as a pending
    connection in its backlog."""
    s = socket.socket()
    s.bind((host, 0))
    s.listen(8)
    s.setblocking(False)
    return s


def ident_of(s: socket.socket) -> str:
    host, port = s.getsockname()[:2]
    return f"{host}:{port}"


def dialled(s: socket.socket, node: Node | None, within: float) -> bool:
    """Whether a TCP connection reaches ``s`` within ``within`` s (the node is driven
    meanwhile)."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        if node is not None:
            node.step(min(max(left, 0.0), 0.02))
        ready, _, _ = select.select([s], [], [], 0 if node is not None else max(left, 0.0))
        if ready:
            conn, _ = s.accept()
            conn.close()
            return True
        if left <= 0:
            return False




_HELD: list[zmq.Socket[bytes]] = []  # the test's DEALERs: a collected one would close


@pytest.fixture
def zctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        yield ctx
    finally:
        _HELD.clear()
        ctx.destroy(linger=0)


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for s in opened:
            s.close()


@pytest.fixture
def make_node() -> Iterator[Callable[..., Node]]:
    made: list[Node] = []

    def make(**kw: Any) -> Node:
        kw.setdefault("connect_timeout_ms", 30_000)
        node = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED, **kw))
        made.append(node)
        return node

    try:
        yield make
    finally:
        for node in made:
            node.close(timeout=1.0)


def dealer(ctx: zmq.Context[zmq.Socket[bytes]], identity: str, target: str,
           source: str | None = None) -> zmq.Socket[bytes]:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, identity.encode())
    s.setsockopt(zmq.LINGER, 1000)
    s.connect(f"tcp://{'' if source is None else source + ':0;'}{target}")
    _HELD.append(s)
    return s


def test_garbage_from_an_unknown_identity_dials_nobody(
        make_node: Callable[..., Node], zctx: Any, sockets: list[socket.socket]) -> None:
    node = make_node()
    victim, control = listener(), listener()
    sockets += [victim, control]
    garbage = [b"garbage", b"\x93\x01\x02\x03", encode(Connect(
        peer_id="127.0.0.1:1", agent_metadata=b"", base_addr=0, num_blocks=1,
        block_len=BLOCK, config_fingerprint="", hash_seed=SEED))]  # a connect naming another id
    s = dealer(zctx, ident_of(victim), node.local_id)
    for frame in garbage:
        s.send(frame)
    drive(node, lambda: node.control.drop_counts.get("not a connect", 0) >= len(garbage),
          10.0, "the garbage dropped")
    assert not dialled(victim, node, NO_DIAL_WAIT), "a garbage frame made the node dial out"
    assert node.control.peers == () and node.sessions == {}

    # The same node does dial back a well-formed connect naming its sender (so the
    # checks above could have failed).
    dealer(zctx, ident_of(control), node.local_id).send(connect_frame(ident_of(control)))
    assert dialled(control, node, 10.0), "a real connect was not dialled back"
    assert ident_of(control) in node.sessions
    assert ident_of(victim) not in node.control.peers


def test_a_connect_naming_another_host_is_not_dialled_back(
        make_node: Callable[..., Node], zctx: Any, sockets: list[socket.socket]) -> None:
    node = make_node()
    elsewhere = listener("127.0.0.2")
    sockets.append(elsewhere)
    third_party = ident_of(elsewhere)
    # From 127.0.0.1, claiming to be 127.0.0.2:PORT.
    squatter = dealer(zctx, third_party, node.local_id, source="127.0.0.1")
    squatter.send(connect_frame(third_party))
    drive(node, lambda: node.control.drop_counts.get("address mismatch", 0) >= 1, 10.0,
          "the mismatched source dropped")
    assert not dialled(elsewhere, node, NO_DIAL_WAIT), "dialled a host the frame did not come from"
    assert node.control.peers == () and node.sessions == {}
    # Its connection holds the id while open (a second one under it is never read).
    squatter.close(0)

    # From 127.0.0.2 itself it is dialled back: a peer connecting again until it is (its
    # first connection may reach the ROUTER before the squatter's close).
    for _ in range(5):
        dealer(zctx, third_party, node.local_id, source="127.0.0.2").send(
            connect_frame(third_party))
        if dialled(elsewhere, node, 2.0):
            break
    else:
        raise AssertionError("a connect from the host it names was not dialled")
    assert third_party in node.sessions


def test_dial_back_any_host_relaxes_the_source_check(
        make_node: Callable[..., Node], zctx: Any, sockets: list[socket.socket]) -> None:
    node = make_node(dial_back_any_host=True)
    natted = listener("127.0.0.2")
    sockets.append(natted)
    ident = ident_of(natted)
    dealer(zctx, ident, node.local_id, source="127.0.0.1").send(connect_frame(ident))
    assert dialled(natted, node, 10.0), "dial_back_any_host did not dial the named host"
    assert "address mismatch" not in node.control.drop_counts


def test_a_node_on_another_address_handshakes_and_fetches() -> None:
    """Our DEALERs connect from our bind address: a node bound on 127.0.0.2 is dialled
    back by one on 127.0.0.1 although the kernel would pick 127.0.0.1 as the source."""
    from p2pfsm.demo_blocks import demo_block, demo_key
    from p2pfsm.tools.demo.host import DemoServer

    server = DemoServer(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED)).node
    client = Node(NodeConfig("tcp://127.0.0.2:0", 16, BLOCK, hash_seed=SEED))
    try:
        session = client.connect(server.local_id)

        def both(done: Callable[[], bool], timeout: float, what: str) -> None:
            deadline = time.monotonic() + timeout
            while not done():
                assert time.monotonic() < deadline, f"no {what}; deaths {dict(client.deaths)}"
                client.step(0.01)
                server.step(0.01)

        both(lambda: session.ready or not session.alive, 20.0, "handshake")
        assert session.ready, client.deaths
        load = client.fetch(server.local_id, "r", [demo_key(i) for i in range(4)], range(4))
        both(load.done, 20.0, "fetch")
        assert load.result().success
        assert all(bytes(client.region[i].numpy()) == demo_block(i, BLOCK) for i in range(4))
        assert server.control.drop_counts.get("address mismatch", 0) == 0
    finally:
        client.close(timeout=1.0)
        server.close(timeout=1.0)


def test_a_flood_from_one_host_never_evicts_a_handshake_from_another(
        zctx: Any, sockets: list[socket.socket], caplog: pytest.LogCaptureFixture) -> None:
    """A server with a budget of 4 unfinished handshakes; a client on 127.0.0.2 connects,
    and while its handshake and then its fetch are open, bursts of 12 connects from
    127.0.0.1 (identities naming silent listeners) reach the server, each burst queued
    there before the server reads any of it. The budget is charged to the host each
    connection came from and a host evicts only its own (or a bigger host's), so the
    client's handshake completes and its fetch verifies. With oldest-first eviction the
    first burst pushed the client's dial-back out (its handshake died: evicted)."""
    from p2pfsm.demo_blocks import demo_block, demo_key
    from p2pfsm.tools.demo.host import DemoServer

    caplog.set_level(logging.INFO, logger="p2pfsm.zmq")
    server = DemoServer(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED,
                                   max_pending_peers=4, connect_timeout_ms=120_000)).node
    client = Node(NodeConfig("tcp://127.0.0.2:0", 16, BLOCK, hash_seed=SEED))
    flood: list[str] = []

    def burst() -> None:
        """12 connects under new ids; returns once each DEALER's ZMTP handshake with
        the server's ROUTER is done (its frame then goes out), without the server
        having been stepped."""
        monitors = []
        for _ in range(12):
            silent = listener()
            sockets.append(silent)
            ident = ident_of(silent)
            d = zctx.socket(zmq.DEALER)
            _HELD.append(d)
            d.setsockopt(zmq.IDENTITY, ident.encode())
            d.setsockopt(zmq.LINGER, 1000)
            monitors.append((d, d.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)))
            d.connect(f"tcp://{server.local_id}")  # watched from before it connects
            d.send(connect_frame(ident))
            flood.append(ident)
        for d, mon in monitors:
            try:
                assert mon.poll(20_000), "a flood DEALER's handshake with the server"
            finally:
                d.disable_monitor()  # before its PAIR goes (libzmq#3575)
                mon.close(linger=0)

    def both(done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        turns = 0
        while not done():
            assert time.monotonic() < deadline, (
                f"no {what}; client deaths {dict(client.deaths)}, server's death of the "
                f"client {server.deaths.get(client.local_id)}")
            if turns % 10 == 0 and len(flood) < 120:
                burst()  # the flood goes on
            turns += 1
            client.step(0.01)
            server.step(0.01)

    try:
        session = client.connect(server.local_id)
        deadline = time.monotonic() + 20.0
        while client.local_id not in server.sessions:  # its connect is in, its dial-back out
            assert time.monotonic() < deadline, "the client's connect never reached the server"
            client.step(0.01)
            server.step(0.01)
        both(lambda: session.ready or not session.alive, 30.0, "handshake")
        assert session.ready, (client.deaths, server.deaths.get(client.local_id))
        load = client.fetch(server.local_id, "r", [demo_key(i) for i in range(4)], range(4))
        both(load.done, 30.0, "fetch")
        assert load.result().success, (load.result(), server.deaths.get(client.local_id))
        assert all(bytes(client.region[i].numpy()) == demo_block(i, BLOCK) for i in range(4))
        assert server.sessions[client.local_id].ready
        evicted = [r.args[0] for r in caplog.records if r.msg.startswith("evicting")]
        # The flood pressed the budget: more of it was evicted than the budget holds (a
        # host's dial-backs in flight are capped too, so not every connect gets that far).
        assert len(evicted) > 4, f"the flood hardly filled the budget: {evicted}"
        assert set(evicted) <= set(flood), evicted
        assert len(server.control.peers) <= 4 + 1 + 1  # pending, the client, done grace
    finally:
        client.close(timeout=1.0)
        server.close(timeout=1.0)


def read_until(fd: int, done: Callable[[str], bool], timeout: float, what: str) -> str:
    """What the process writes to ``fd`` until ``done(text so far)``, within ``timeout``."""
    deadline = time.monotonic() + timeout
    text = ""
    while not done(text):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0.0))
        chunk = os.read(fd, 65536).decode(errors="replace") if ready else ""
        if not chunk and (left <= 0 or ready):
            raise AssertionError(f"no {what} within {timeout:.0f} s ({len(text)} chars, "
                                 f"{text.count(chr(10))} lines): {text[-1500:]}")
        text += chunk
    return text


def test_300_unfinished_handshakes_do_not_lock_a_legitimate_peer_out(
        zctx: Any, sockets: list[socket.socket]) -> None:
    """A ``p2pfsm serve`` (default budgets: 128 peers, 32 pending) gets 300 garbage frames
    from 300 identities and 300 valid connects from identities whose dial-backs never
    finish (silent listeners; the connect timeout is set past the test). A legitimate
    client still handshakes and fetches, verified, promptly."""
    proc = subprocess.Popen(
        [*CLI, "serve", "-v", "--bind", "tcp://127.0.0.1:0", "--blocks", "16",
         "--block-len", str(BLOCK), "--connect-timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        err = proc.stderr.fileno()
        line = read_until(proc.stdout.fileno(), lambda t: "\n" in t, 60.0, "serving line")
        assert line.startswith("serving"), line
        server = line.strip().rsplit("tcp://", 1)[1]

        # Kept open until the context goes (_HELD): a closed DEALER's linger could
        # expire before a busy server has taken its frame.
        for i in range(300):
            dealer(zctx, f"127.0.0.1:{20000 + i}", server).send(b"not a frame %d" % i)
        silent = [listener() for _ in range(300)]
        sockets.extend(silent)
        for lst in silent:
            dealer(zctx, ident_of(lst), server).send(connect_frame(ident_of(lst)))
        # The server evicts an unfinished handshake for each new one past 32 (here the
        # oldest: one host, no dial-back up); eviction lines are rate-limited, so wait for
        # the first: the flood is past the budget when the legitimate peer comes. (With
        # libzmq's default listen backlog of 100, some of these 600 simultaneous
        # connects stalled for tens of seconds: the ROUTER's backlog is 1024.)
        log = read_until(err, lambda t: "evicting 127.0.0.1:" in t, 60.0,
                         "evictions of the flood")

        started = time.monotonic()
        with Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED)) as client:
            from p2pfsm.tools.demo.host import run_fetch

            report = run_fetch(client, server, list(range(8)), "pd", 20.0)
        elapsed = time.monotonic() - started
        assert report.success and report.verified, (report, log[-3000:])
        assert elapsed < 15.0, f"the legitimate fetch took {elapsed:.1f} s"
    finally:
        proc.terminate()
        try:
            _, rest = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, rest = proc.communicate(timeout=10)
    assert proc.returncode == 0, rest[-3000:]
    # Only the legitimate peer became ready; the flood's garbage opened nothing.
    assert (log + rest.decode(errors="replace")).count(" ready") == 1, rest[-3000:]


def test_interop_shape_connect_first_is_what_a_vllm_peer_sends() -> None:
    """vLLM's client sends its connect as the first frame on a new DEALER, naming its
    own identity: exactly what is_connect_from admits (the interop suite runs the real
    thing)."""
    from p2pfsm.executor.zmq.admission import is_connect_from

    frame = connect_frame("10.0.0.7:5555")
    assert is_connect_from("10.0.0.7:5555", frame)
    assert not is_connect_from("10.0.0.8:5555", frame)
    assert not is_connect_from("10.0.0.7:5555", b"\x80")
