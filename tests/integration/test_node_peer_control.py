"""Reconnects under the host's control: the peer-state callback, lookups held while a
peer is redialled, ``disconnect`` (no more redials), ``reconnect_max_attempts`` (the
peer given up), ``redial_now``, and a dial under a name the peer does not call itself.

A ``p2pfsm serve`` process killed and restarted on its port (stopped by its PID), and
nodes of this process stepped in turn; real ZeroMQ and NIXL on 127.0.0.1, every wait
bounded.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.demo_blocks import demo_key
from p2pfsm.executor.node import Node, NodeConfig
from p2pfsm.session import FailReason, Timeouts
from p2pfsm.tools.demo.host import DemoServer
from tests.helpers.serve_process import ServeProcess

from . import drive_nodes, free_port

needs_nixl_and_torch()

BLOCK = 4096
HELD = 16
WAIT_S = 60.0



class States:
    """What ``on_peer_state`` reported, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def __call__(self, peer_id: str, state: str, detail: str) -> None:
        self.seen.append((peer_id, state, detail))

    def names(self) -> list[str]:
        return [state for _, state, _ in self.seen]


def test_a_lookup_waits_through_failed_redials_and_disconnect_stops_them(
        tmp_path: Path) -> None:
    port = free_port()
    peer = f"127.0.0.1:{port}"
    server = ServeProcess(tmp_path / "serve-1.log", HELD, BLOCK, port=port)
    states = States()
    node = Node(NodeConfig("tcp://127.0.0.1:0", 4, BLOCK, timeouts=Timeouts(lookup=60),
                           reconnect_backoff_s=(0.05, 0.2)), on_peer_state=states)
    try:
        session = node.connect(peer)
        assert node.run_until(lambda: session.ready or not session.alive, WAIT_S)
        assert states.names() == ["connecting", "ready"] and states.seen[0][0] == peer
        server.kill()
        # Wait until at least two redials have failed: the lookup below then meets them.
        assert node.run_until(lambda: states.names().count("lost") >= 2, WAIT_S), states.seen
        lookup = node.lookup(peer, "held", [demo_key(3), b"not-held"])
        assert node.run_until(lambda: states.names().count("lost") >= 4, WAIT_S), states.seen
        assert not lookup.done()  # held through the failed attempts, as fetches are
        server = ServeProcess(tmp_path / "serve-2.log", HELD, BLOCK, port=port)
        assert node.run_until(lookup.done, WAIT_S)
        result = lookup.result()
        assert result.answered and result.hits == (True, False), result
        assert states.names()[-1] == "ready"
        assert set(states.names()) == {"connecting", "ready", "lost"}
        snap = node.metrics.snapshot()
        assert snap["counters"]["restarts"] == 1  # a new process
        assert [snap["counters"][n] for n in ("lookups_answered", "lookups_failed",
                                              "lookup_keys_hit", "lookup_keys_missed")] \
            == [1, 0, 1, 1]
        assert snap["histograms"]["lookup_seconds"]["count"] == 1

        server.kill()
        assert node.run_until(lambda: states.names()[-1] == "lost", WAIT_S), states.seen
        node.disconnect(f"tcp://{peer}")
        assert node.run_until(lambda: states.names()[-1] == "given up", WAIT_S)
        assert states.seen[-1][2] == "disconnected by the host"
        redials = node.metrics.snapshot()["counters"]["redials"]
        fut = node.fetch(peer, "after", [demo_key(1)], [0])  # the dead session refuses
        assert node.run_until(fut.done, WAIT_S)
        assert fut.result().reason is FailReason.SESSION_ENDED
        node.run_until(lambda: False, 1.0)  # a while of turns: no redial comes
        assert node.metrics.snapshot()["counters"]["redials"] == redials
        assert states.names()[-1] == "given up" and not node.sessions[peer].alive
    finally:
        server.stop()
        node.close(timeout=1.0)


def test_a_peer_is_given_up_after_max_attempts_and_connect_starts_afresh() -> None:
    peer = f"127.0.0.1:{free_port()}"  # nobody listens: every attempt is refused
    states = States()
    node = Node(NodeConfig("tcp://127.0.0.1:0", 4, BLOCK, timeouts=Timeouts(load=60),
                           reconnect_backoff_s=(0.01, 0.05), reconnect_max_attempts=3),
                on_peer_state=states)
    try:
        node.connect(peer)
        fut = node.fetch(peer, "never", [demo_key(1)], [0])
        assert node.run_until(lambda: "given up" in states.names(), WAIT_S), states.seen
        assert states.names() == ["connecting", "lost"] * 3 + ["connecting", "given up"]
        assert "3 attempts in a row failed; the last: transport lost: connection refused" \
            in states.seen[-1][2]
        assert node.run_until(fut.done, WAIT_S)
        result = fut.result()
        assert result.reason is FailReason.SESSION_ENDED and "refused" in result.detail
        assert node.metrics.snapshot()["counters"]["redials"] == 3
        node.connect(peer)  # the host tries again: three more attempts
        assert node.run_until(lambda: states.names().count("given up") == 2, WAIT_S)
        assert node.metrics.snapshot()["counters"]["redials"] == 6
    finally:
        node.close(timeout=1.0)


def test_redial_now_opens_the_session_without_its_backoff() -> None:
    port = free_port()
    peer = f"127.0.0.1:{port}"
    states = States()
    # After a failed attempt the next waits 30 to 60 s: within the 20 s bound below
    # only redial_now can open the session.
    consumer = Node(NodeConfig("tcp://127.0.0.1:0", 4, BLOCK,
                               reconnect_backoff_s=(60.0, 60.0)), on_peer_state=states)
    nodes = [consumer]
    try:
        consumer.connect(peer)  # refused, redialled at once, refused: the next waits
        drive_nodes(nodes, lambda: states.names().count("lost") == 2, "two failed attempts")
        assert not consumer.redial_now("127.0.0.1:1")  # no redial of it waits
        nodes.append(DemoServer(NodeConfig(f"tcp://{peer}", HELD, BLOCK)).node)
        assert consumer.redial_now(peer)
        drive_nodes(nodes, lambda: states.names()[-1] == "ready", "the session", 20.0)
        assert states.names() == ["connecting", "lost", "connecting", "lost", "connecting",
                                  "ready"]
    finally:
        for node in nodes:
            node.close(timeout=1.0)


def test_a_dial_under_another_name_of_the_peer_fails_at_once_saying_so() -> None:
    try:
        names = {info[4][0] for info in socket.getaddrinfo("localhost", None)}
    except OSError:
        names = set()
    if "127.0.0.1" not in names:
        pytest.skip("localhost does not resolve to 127.0.0.1 here")
    server = DemoServer(NodeConfig("tcp://127.0.0.1:0", HELD, BLOCK)).node
    port = server.local_id.rpartition(":")[2]
    states = States()
    client = Node(NodeConfig("tcp://127.0.0.1:0", 4, BLOCK), on_peer_state=states)
    try:
        session = client.connect(f"localhost:{port}")
        drive_nodes([client, server], lambda: not session.alive, "the session's end", WAIT_S)
        reason = client.deaths[f"localhost:{port}"].reason
        assert f"calls itself 127.0.0.1:{port}" in reason, reason
        assert f"connect to '127.0.0.1:{port}'" in reason, reason
        assert states.names() == ["connecting", "given up"]
        assert client.metrics.snapshot()["counters"].get("redials", 0) == 0
    finally:
        client.close(timeout=1.0)
        server.close(timeout=1.0)


def test_a_fingerprint_mismatch_names_the_fields_on_both_sides() -> None:
    server = DemoServer(NodeConfig("tcp://127.0.0.1:0", HELD, BLOCK,
                                   model_config={"model": "m", "dtype": "fp16"})).node
    client = Node(NodeConfig("tcp://127.0.0.1:0", 4, BLOCK,
                             model_config={"model": "m", "dtype": "bf16", "tp": 2}))
    try:
        session = client.connect(server.local_id)
        drive_nodes([client, server], lambda: not session.alive and client.local_id
                    in server.deaths, "both ends' deaths", WAIT_S)
        for node, only in ((client, "only ours: tp"), (server, "only the peer's: tp")):
            dead = next(iter(node.deaths.values()))
            assert dead.mismatch is not None and dead.mismatch.field == "config_fingerprint"
            assert "fields that differ: dtype" in dead.reason and only in dead.reason, dead
    finally:
        client.close(timeout=1.0)
        server.close(timeout=1.0)
