"""Authenticated peers: ZeroMQ CURVE with a ZAP allow-list, on 127.0.0.1.

Keys come from ``p2pfsm keygen``. An allowed key completes a real ``p2pfsm serve`` /
``p2pfsm fetch``; a key not in the allow-list, and a peer with no key at all (NULL
security, what vLLM speaks), are refused in the ZMTP handshake: nothing reaches a
session of a real :class:`Node`, and each refusal is logged on ``p2pfsm.zmq``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth

from p2pfsm.errors import ConfigError
from p2pfsm.protocol import Connect, encode

if importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None:
    pytest.skip("NIXL is not installed (.ci/install.sh installs it)", allow_module_level=True)
pytest.importorskip("torch")

from p2pfsm.executor.node import Node, NodeConfig

from . import drive

CLI = [sys.executable, "-m", "p2pfsm.tools.cli"]
BLOCK = 4096
SEED = "vllm-none-hash"


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """server, client and stranger keypairs, written by ``p2pfsm keygen``."""
    out = tmp_path_factory.mktemp("keys")
    for name in ("server", "client", "stranger"):
        ran = subprocess.run([*CLI, "keygen", str(out / name), "--name", name],
                             capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        assert (out / name / f"{name}.key").is_file()
        assert (out / name / f"{name}.key_secret").stat().st_mode & 0o077 == 0
    again = subprocess.run([*CLI, "keygen", str(out / "server"), "--name", "server"],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "not overwriting" in again.stderr
    return out


def pub(keys: Path, name: str) -> str:
    return str(keys / name / f"{name}.key")


def sec(keys: Path, name: str) -> str:
    return str(keys / name / f"{name}.key_secret")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.warnings: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if record.levelno >= logging.WARNING:
            self.warnings.append(record.getMessage())


@pytest.fixture
def zmq_log() -> Iterator[Records]:
    logger = logging.getLogger("p2pfsm.zmq")
    records, level = Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)




def connect_frame(peer_id: str) -> bytes:
    return encode(Connect(peer_id=peer_id, agent_metadata=b"x", base_addr=4096,
                          num_blocks=16, block_len=BLOCK, config_fingerprint="",
                          hash_seed=SEED))


def test_bad_curve_config_is_refused_by_name(keys: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.key"
    junk.write_text("not a key\n")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"curve_allow": (pub(keys, "client"),)}, "curve_secret_key"),
        ({"curve_secret_key": sec(keys, "server")}, "curve_allow"),
        ({"curve_secret_key": pub(keys, "server"), "curve_allow": (pub(keys, "client"),)},
         "curve_secret_key"),
        ({"curve_secret_key": sec(keys, "server"), "curve_allow": (str(junk),)}, "curve_allow"),
        ({"curve_secret_key": sec(keys, "server"), "curve_allow": (str(tmp_path / "no"),)},
         "curve_allow"),
        ({"curve_secret_key": sec(keys, "server"), "curve_allow": pub(keys, "client")},
         "curve_allow"),
        ({"curve_secret_key": sec(keys, "server"), "curve_allow": (pub(keys, "client"),),
          "curve_peer_key": str(junk)}, "curve_peer_key"),
    ]
    for kw, field in cases:
        with pytest.raises(ConfigError, match=field):
            NodeConfig("tcp://127.0.0.1:0", 1, 1, **kw)
    ok = NodeConfig("tcp://127.0.0.1:0", 1, 1, curve_secret_key=sec(keys, "server"),
                    curve_allow=(str(keys / "client"), pub(keys, "stranger")))
    curve = ok.curve_keys()
    assert curve is not None and len(curve.allow) == 2


def test_allowed_key_fetches_through_the_cli(keys: Path) -> None:
    serve = subprocess.Popen(
        [*CLI, "serve", "--bind", "tcp://127.0.0.1:0", "--blocks", "16", "--block-len",
         str(BLOCK), "--curve-secret", sec(keys, "server"), "--allow", str(keys / "client")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert serve.stdout is not None
        ready, _, _ = select.select([serve.stdout], [], [], 60.0)
        line = serve.stdout.readline() if ready else ""
        assert line.startswith("serving"), f"serve did not start: {line!r}"
        server = line.strip().rsplit(" ", 1)[1]
        fetch = subprocess.run(
            [*CLI, "fetch", "--connect", server, "--keys", "0-7", "--block-len", str(BLOCK),
             "--curve-secret", sec(keys, "client"), "--allow", pub(keys, "server"),
             "--timeout", "20"],
            capture_output=True, text=True, timeout=120)
        assert fetch.returncode == 0, fetch.stderr
        report = json.loads(fetch.stdout.strip().splitlines()[-1])
        assert report["success"] and report["verified"], report
        # A stranger's key is refused: the fetch fails (no handshake), the server lives.
        refused = subprocess.run(
            [*CLI, "fetch", "--connect", server, "--keys", "0", "--block-len", str(BLOCK),
             "--curve-secret", sec(keys, "stranger"), "--allow", pub(keys, "server"),
             "--timeout", "3", "--connect-timeout", "3"],
            capture_output=True, text=True, timeout=120)
        assert refused.returncode != 0, refused.stdout
        assert "our CURVE key is not in its allow-list" in refused.stderr, refused.stderr
        # An allowed client that holds another key for the server is told exactly that.
        wrong = subprocess.run(
            [*CLI, "fetch", "--connect", server, "--keys", "0", "--block-len", str(BLOCK),
             "--curve-secret", sec(keys, "client"), "--allow", pub(keys, "server"),
             "--peer-key", pub(keys, "stranger"), "--timeout", "3", "--connect-timeout", "3"],
            capture_output=True, text=True, timeout=120)
        assert wrong.returncode != 0, wrong.stdout
        assert "not the server key we hold for it" in wrong.stderr, wrong.stderr
    finally:
        serve.terminate()
        try:
            _, err = serve.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            serve.kill()
            _, err = serve.communicate(timeout=10)
    assert serve.returncode == 0, err
    assert "not in the allow-list" in err, err


def test_unknown_and_missing_keys_never_reach_a_session(keys: Path, zmq_log: Records) -> None:
    node = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED,
                           curve_secret_key=sec(keys, "server"),
                           curve_allow=(pub(keys, "client"),)))
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        server_pub, _ = zmq.auth.load_certificate(pub(keys, "server"))
        held: list[zmq.Socket[bytes]] = []  # a collected socket would close mid-handshake

        def dealer(name: str | None, ident: str) -> zmq.Socket[bytes]:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, ident.encode())
            s.setsockopt(zmq.LINGER, 0)
            if name is not None:
                public, secret = zmq.auth.load_certificate(sec(keys, name))
                assert secret is not None
                s.setsockopt(zmq.CURVE_PUBLICKEY, public)
                s.setsockopt(zmq.CURVE_SECRETKEY, secret)
                s.setsockopt(zmq.CURVE_SERVERKEY, server_pub)
            s.connect(f"tcp://{node.local_id}")
            s.send(connect_frame(ident))
            held.append(s)
            return s

        dealer("stranger", "127.0.0.1:40001")
        dealer(None, "127.0.0.1:40002")
        # The stranger is refused by ZAP; the NULL client in its ZMTP handshake, which
        # libzmq reports as a mechanism mismatch or (depending on timing) another
        # handshake error: both are refusals before any frame.
        null_refusals = ("refused: no CURVE key", "refused: handshake failed")

        def both_refused() -> bool:
            drops = node.control.drop_counts
            return "refused: key not allowed" in drops and any(k in drops for k in null_refusals)

        drive(node, both_refused, 10.0, "both refusals")
        # Well past the refusals, nothing has come in.
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            node.step(0.05)
        assert node.sessions == {} and node.control.peers == ()
        counters = node.metrics.snapshot()["counters"]
        assert counters.get("handshakes", 0) == 0 and counters.get("violations", 0) == 0
        text = "\n".join(zmq_log.lines)
        assert ("refused a connection from 127.0.0.1: CURVE key" in text
                and "not in the allow-list" in text), text
        assert ("the peer offered no CURVE key (NULL security)" in text
                or "CURVE handshake failed" in text
                or "ended before its CURVE handshake did" in text), text

        # The allowed key gets through the same door (so the checks above could fail):
        # its connect reaches a session, which dials back with that key.
        dealer("client", "127.0.0.1:40003")
        drive(node, lambda: "127.0.0.1:40003" in node.sessions, 10.0, "the allowed connect")
        assert set(node.sessions) == {"127.0.0.1:40003"}
    finally:
        ctx.destroy(linger=0)
        node.close(timeout=1.0)


def test_null_to_null_is_unchanged_and_curve_to_null_fails(keys: Path) -> None:
    """Default nodes (NULL security) still handshake; a CURVE node cannot talk to one."""
    from p2pfsm.tools.demo.host import DemoServer

    server = DemoServer(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED)).node
    plain = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED))
    curved = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED,
                             curve_secret_key=sec(keys, "client"),
                             curve_allow=(pub(keys, "server"),), connect_timeout_ms=3000))
    try:
        for client in (plain, curved):
            session = client.connect(server.local_id)
            deadline = time.monotonic() + 20.0
            while (session.alive and not session.ready) and time.monotonic() < deadline:
                client.step(0.01)
                server.step(0.01)
            if client is plain:
                assert session.ready, client.deaths
            else:
                assert not session.alive and not session.ready
                assert "transport lost" in client.deaths[server.local_id].reason
        assert list(server.sessions) == [plain.local_id]
    finally:
        for node in (plain, curved, server):
            node.close(timeout=1.0)
    assert os.path.exists(pub(keys, "server"))


def test_a_port_probe_is_not_logged_as_a_refusal(keys: Path, zmq_log: Records) -> None:
    """A TCP connect that closes at once (the CLI's reachability probe) ends a CURVE
    handshake that never began: counted, logged at INFO, never warned of as a refusal."""
    node = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED,
                           curve_secret_key=sec(keys, "server"),
                           curve_allow=(pub(keys, "client"),)))
    try:
        host, port = node.local_id.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=5.0).close()
        drive(node, lambda: "refused: handshake failed" in node.control.drop_counts, 10.0,
              "the probe's end")
        assert not [w for w in zmq_log.warnings if "refused a connection on" in w]
        assert any("ended before its CURVE handshake did" in line for line in zmq_log.lines)
    finally:
        node.close()


@pytest.mark.parametrize(("client", "cause"), [
    ({"curve_secret_key": "stranger", "curve_allow": ("server",)},
     "our CURVE key is not in its allow-list"),
    ({"curve_secret_key": "client", "curve_allow": ("stranger",)},
     "its key is not the server key we hold for it"),
    ({}, "the peer"),  # no CURVE: "requires CURVE" or "closed ... during the handshake"
])
def test_a_refused_handshake_says_why_in_the_death_and_the_results(
        keys: Path, client: dict[str, Any], cause: str) -> None:
    """The cause of a CURVE refusal is in SessionDead.reason and in the result of a
    fetch that waited for the session, not only in a log line."""
    server = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED,
                             curve_secret_key=sec(keys, "server"),
                             curve_allow=(pub(keys, "client"),)))
    curve = {"curve_secret_key": sec(keys, client["curve_secret_key"]),
             "curve_allow": tuple(pub(keys, n) for n in client["curve_allow"])} if client else {}
    node = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED,
                           connect_timeout_ms=5000, reconnect_backoff_s=None, **curve))
    try:
        session = node.connect(server.local_id)
        load = node.fetch(server.local_id, "req-1", [b"k"], [0])
        deadline = time.monotonic() + 30.0
        while session.alive and time.monotonic() < deadline:
            node.step(0.01)
            server.step(0.01)
        reason = node.deaths[server.local_id].reason
        assert reason.startswith("transport lost: handshake failed: "), reason
        assert cause in reason, reason
        if not client:
            assert "requires CURVE" in reason or "during the handshake" in reason, reason
        drive(node, load.done, 10.0, "the fetch's result")
        assert not load.result().success and cause in load.result().detail, load.result()
    finally:
        node.close(timeout=1.0)
        server.close(timeout=1.0)


def test_a_send_after_a_refused_handshake_names_the_refusal(keys: Path) -> None:
    """A frame sent to a peer whose CURVE handshake was just refused, before any poll
    read the refusal, fails with the refusal as its cause, not as a full queue: libzmq
    drops the connection's pipe at once, so the send finds no room, and the plane reads
    the DEALER's monitor before it blames the queue."""
    server = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED,
                             curve_secret_key=sec(keys, "server"),
                             curve_allow=(pub(keys, "client"),)))
    client = Node(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, hash_seed=SEED,
                             curve_secret_key=sec(keys, "stranger"),
                             curve_allow=(pub(keys, "server"),)))
    try:
        plane = client.control
        plane.connect(server.local_id)
        frame = connect_frame(client.local_id)
        reason = None
        deadline = time.monotonic() + 30.0
        while reason is None and time.monotonic() < deadline:
            server.step(0.01)  # its ZAP handler refuses our key; our plane is not polled
            reason = plane.try_send(server.local_id, frame)
        assert reason is not None, "the refused connection kept taking frames for 30 s"
        assert reason.startswith("handshake failed: "), reason
        assert "our CURVE key is not in its allow-list" in reason, reason
        assert server.local_id not in plane.peers
        assert not [e for e in plane.poll(0) if getattr(e, "peer_id", None) == server.local_id]
    finally:
        client.close(timeout=1.0)
        server.close(timeout=1.0)
