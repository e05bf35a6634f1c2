"""Scheduler threads submit host calls while another thread drives the node.

A consumer Node in this process fetches from a ``p2pfsm serve`` process (real ZeroMQ
and NIXL on 127.0.0.1). One thread drives the consumer — with ``serve()``, with a host's
own ``select`` loop on ``fileno()`` / ``next_deadline()`` calling ``step(0)``, or with an
asyncio loop through ``AsyncNode`` — and several scheduler threads submit fetches,
lookups and finishes through ``node.threadsafe``; every byte of every fetch is checked.
Direct calls from a thread that does not drive the node are refused at once. Every wait
is bounded; the server is stopped by its PID and every thread is joined.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import LocalProtocolError
from p2pfsm.executor.node import Node, NodeConfig
from tests.helpers.serve_process import ServeProcess

needs_nixl_and_torch()

BLOCK = 4096
HELD = 32  # the server holds demo blocks 0..31
THREADS = 4
FETCHES = 150  # per thread: with a lookup and a finish each, 1,800 submitted calls
WAIT_S = 60.0  # a bound on every wait, far past what any one call needs


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    proc = ServeProcess(tmp_path_factory.mktemp("threads") / "serve.log", HELD, BLOCK)
    try:
        yield proc
    finally:
        proc.stop()


OWN = 2 * THREADS  # a destination no scheduler thread uses


def consumer_config() -> NodeConfig:
    # Each scheduler thread owns its own 2 destination blocks.
    return NodeConfig("tcp://127.0.0.1:0", 2 * THREADS + 1, BLOCK)


def consumer() -> Node:
    return Node(consumer_config())


def scheduler(node: Node, peer: str, worker: int, errors: list[str]) -> None:
    """Look up, fetch and finish FETCHES requests; check each block's bytes."""
    api = node.threadsafe
    dest = [2 * worker, 2 * worker + 1]
    try:
        for i in range(FETCHES):
            blocks = [(worker * 7 + i) % HELD, (worker * 7 + i + 1) % HELD]
            rid = f"w{worker}-{i}"
            keys = [demo_key(b) for b in blocks]
            answer = api.lookup(peer, rid, keys).result(WAIT_S)
            if answer.hits != (True, True):
                errors.append(f"{rid}: lookup {answer}")
                return
            result = api.fetch(peer, rid, keys, dest).result(WAIT_S)
            if not result.success:
                errors.append(f"{rid}: fetch {result}")
                return
            for d, b in zip(dest, blocks, strict=True):
                if bytes(node.region[d].numpy()) != demo_block(b, BLOCK):
                    errors.append(f"{rid}: block {b} at {d} is not its bytes")
                    return
            api.finish(peer, rid).result(WAIT_S)
    except Exception as exc:  # reported to the test, which fails with it
        errors.append(f"worker {worker}: {type(exc).__name__}: {exc}")


def run_schedulers(node: Node, peer: str) -> list[str]:
    errors: list[str] = []
    workers = [threading.Thread(target=scheduler, args=(node, peer, w, errors))
               for w in range(THREADS)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(WAIT_S * FETCHES)
    assert not any(t.is_alive() for t in workers), "a scheduler thread did not end"
    return errors


def connected(node: Node, peer: str) -> None:
    node.threadsafe.connect(peer).result(WAIT_S)


def drive_in_thread(target: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # the test asserts none
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, raised


@contextlib.contextmanager
def served_on_a_thread(node: Node) -> Iterator[None]:
    """``node.serve()`` on a thread of its own for the block; then the node is closed
    through ``threadsafe.close()``, which ends ``serve()``, and the thread, having raised
    nothing, is joined."""
    driver, raised = drive_in_thread(node.serve)
    try:
        yield
    finally:
        node.threadsafe.close().result(WAIT_S)
        driver.join(WAIT_S)
    assert not driver.is_alive() and raised == []


def test_scheduler_threads_while_serve_drives(server: ServeProcess) -> None:
    node = consumer()
    peer = server.addr
    with served_on_a_thread(node):
        connected(node, peer)
        assert run_schedulers(node, peer) == []
        assert not node.violations and node.sessions[peer].ready


def test_direct_calls_from_another_thread_are_refused(server: ServeProcess) -> None:
    node = consumer()
    peer = server.addr
    with served_on_a_thread(node):
        connected(node, peer)
        refused: list[tuple[str, Callable[[], object]]] = [
            ("threadsafe.fetch", lambda: node.fetch(peer, "x", [demo_key(1)], [0])),
            ("threadsafe.lookup", lambda: node.lookup(peer, "x", [demo_key(1)])),
            ("threadsafe.supply", lambda: node.supply(peer, "x", [demo_key(1)], [0])),
            ("threadsafe.finish", lambda: node.finish(peer, "x")),
            ("threadsafe.decline", lambda: node.decline(peer, "x", 0)),
            ("threadsafe.resolve_lookup", lambda: node.resolve_lookup(peer, 1)),
            ("threadsafe.connect", lambda: node.connect("127.0.0.1:9")),
            ("threadsafe.close", lambda: node.close()),
            ("another thread drives", lambda: node.step(0)),
            ("another thread drives", lambda: node.run_until(lambda: False, 0.1)),
        ]
        for needle, call in refused:
            with pytest.raises(LocalProtocolError, match=needle):
                call()
        # Nothing changed: the session works on, through the thread-safe API.
        key = demo_key(3)
        result = node.threadsafe.fetch(peer, "after", [key], [0]).result(WAIT_S)
        assert result.success and bytes(node.region[0].numpy()) == demo_block(3, BLOCK)
        assert not node.violations
        # A submitted call that the node refuses gives its error to its own future.
        with pytest.raises(LocalProtocolError, match="outside our 9 blocks"):
            node.threadsafe.fetch(peer, "bad", [key], [99]).result(WAIT_S)
    with pytest.raises(LocalProtocolError, match="closed"):
        node.threadsafe.fetch(peer, "late", [demo_key(1)], [0])


def test_scheduler_threads_while_a_host_loop_steps(server: ServeProcess) -> None:
    """The host's own loop: select on fileno() until next_deadline(), then step(0). A
    submission wakes it through fileno()."""
    node = consumer()
    peer = server.addr
    stop = threading.Event()

    def host_loop() -> None:
        while not stop.is_set() and not node.closed:
            wait = max(0.0, node.next_deadline() - time.monotonic())
            select.select([node.fileno()], [], [], min(wait, 1.0))
            node.step(0)

    driver, raised = drive_in_thread(host_loop)
    try:
        connected(node, peer)
        assert run_schedulers(node, peer) == []
        assert not node.violations
    finally:
        closing = node.threadsafe.close()
        driver.join(WAIT_S)
        stop.set()
    assert closing.done() and closing.exception() is None
    assert not driver.is_alive() and raised == []


def test_scheduler_threads_while_asyncio_drives(server: ServeProcess) -> None:
    """AsyncNode on an event loop in its own thread; scheduler threads submit through
    its node's threadsafe API, and coroutines on the loop keep using the async API."""
    from p2pfsm.aio import AsyncNode

    peer = server.addr
    started: Future[AsyncNode] = Future()
    finished: Future[bool] = Future()

    async def main() -> None:
        async with AsyncNode(consumer_config()) as anode:
            try:
                await anode.connect(peer)
            except BaseException as exc:
                started.set_exception(exc)
                raise
            started.set_result(anode)
            loop = asyncio.get_running_loop()
            done = loop.run_in_executor(None, finished.result, WAIT_S * FETCHES)
            # The loop's own coroutine fetches meanwhile, on the same node.
            own = await anode.fetch(peer, "loop-0", [demo_key(5)], [OWN])
            assert own.success
            await done

    driver, raised = drive_in_thread(lambda: asyncio.run(main()))
    try:
        anode = started.result(WAIT_S)
        assert run_schedulers(anode.node, peer) == []
        assert not anode.node.violations
    finally:
        finished.set_result(True)
        driver.join(WAIT_S)
    assert not driver.is_alive() and raised == []


def test_a_submission_runs_when_the_node_is_driven() -> None:
    """Nothing is carried out until a thread drives the node; then the call's error
    (no session to that peer) reaches its future."""
    node = consumer()
    try:
        fut = node.threadsafe.finish("127.0.0.1:9", "x")
        assert not fut.done()
        with pytest.raises(TimeoutError, match=r"nothing drives the node: call node\.run_until"):
            fut.result(0.01)  # a wait that cannot end says why
        with pytest.raises(TimeoutError, match="nothing drives the node"):
            fut.exception(0.01)
        node.step(0)
        with pytest.raises(LocalProtocolError, match="no session"):
            fut.result(WAIT_S)
    finally:
        node.close()
