"""The release notice after a producer crash: a load in flight when its producer is
killed ends ``released=False``; once the producer's new incarnation is back on its
address, the node releases that destination (DestinationReleased, cause
peer_restarted) through ``on_released`` and ``Node.release_of``, and the gauge of held
destinations goes back to zero. A real Node in this process against
:func:`node_peers.peer_main` producers in child processes (ZeroMQ and NIXL on
127.0.0.1), killed by their PID; every wait bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.demo_blocks import demo_key
from p2pfsm.errors import LocalProtocolError
from p2pfsm.executor.node import Node, NodeConfig
from p2pfsm.session import DestinationReleased, FailReason, ReleaseCause, Timeouts

from . import Child, free_port
from .node_peers import peer_main

needs_nixl_and_torch()

BLOCK = 4096
HELD = 16
WAIT_S = 60.0



def _producer(children: list[Child], port: int, withhold: tuple[int, ...]) -> str:
    cfg = NodeConfig(f"tcp://127.0.0.1:{port}", 32, BLOCK)
    child = Child(peer_main, cfg, HELD, withhold, name=f"producer-{len(children)}")
    children.append(child)
    _, peer_id = child.expect("ready", WAIT_S)
    return str(peer_id)


def _drive(node: Node, done: Callable[[], bool], what: str) -> None:
    if not node.run_until(done, WAIT_S):
        raise AssertionError(f"no {what} within {WAIT_S} s; deaths={dict(node.deaths)}")


def test_a_killed_producers_destination_is_released_when_it_comes_back(
        children: list[Child]) -> None:
    port = free_port()
    peer = _producer(children, port, withhold=(2,))
    notices: list[tuple[str, DestinationReleased]] = []

    def on_released(peer_id: str, notice: DestinationReleased) -> None:
        notices.append((peer_id, notice))

    cfg: dict[str, Any] = {"timeouts": Timeouts(load=30), "reconnect_backoff_s": (0.05, 0.5)}
    with Node(NodeConfig("tcp://127.0.0.1:0", 8, BLOCK, **cfg), on_released=on_released) as node:
        session = node.connect(peer)
        _drive(node, lambda: session.ready or not session.alive, "handshake")
        fut = node.fetch(peer, "r1", [demo_key(i) for i in range(4)], range(4))
        producer = children[0]
        producer.expect("fetch", WAIT_S)  # it parked block 2: the round stays open
        producer.proc.kill()
        producer.proc.join(10)
        _drive(node, fut.done, "result of the fetch whose producer died")
        res = fut.result()
        assert (res.success, res.released, res.reason) == (False, False,
                                                           FailReason.SESSION_ENDED)
        released = node.release_of(res.job_id)
        assert not released.done() and node.held_destinations() == {peer: 1}
        with pytest.raises(LocalProtocolError, match="no held destination"):
            node.release_of(res.job_id + 1000)
        _producer(children, port, withhold=())  # the new incarnation, same address
        _drive(node, released.done, "release notice")
        notice = released.result()
        assert notice == DestinationReleased(res.job_id, "r1", 0, ReleaseCause.PEER_RESTARTED)
        _drive(node, lambda: bool(notices), "on_released")
        assert notices == [(peer, notice)] and node.held_destinations() == {}
        node.step(0.01)
        snap = node.metrics.snapshot()
        assert snap["counters"]["destinations_released"] == 1
        assert snap["gauges"]["destinations_held"] == 0
