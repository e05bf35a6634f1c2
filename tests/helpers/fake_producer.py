"""A scripted fake producer for the conform tests: p2pfsm's ControlPlane and a real NIXL
agent (for its metadata), every decoded frame answered by a script, served from a thread
for a bounded time."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from p2pfsm.errors import MalformedFrame
from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.executor.zmq.plane import ControlPlane, FrameIn
from p2pfsm.protocol import Connect, Message, decode, encode

BLOCK_LEN = 4096
NUM_BLOCKS = 16
"""The fake's NIXL region: this many blocks of :data:`BLOCK_LEN` bytes."""

Script = Callable[[Message | None, str, DataPlane], list[Message]]
"""The fake's answers to one frame (``None``: an unknown type), given its identity and
its data plane."""


def connect_of(me: str, data: DataPlane) -> Connect:
    """The fake's own connect: its identity and region, no fingerprint."""
    return Connect(me, data.metadata, data.base_addr, data.num_blocks, BLOCK_LEN, "",
                   "vllm-none-hash")


@contextmanager
def fake_producer(script: Script, name: str, lifetime_s: float) -> Iterator[str]:
    """Serve ``script`` on ``127.0.0.1`` from a thread (NIXL agent ``name``, at most
    ``lifetime_s``); its address. Stopped, and its thread joined, on exit."""
    stop = threading.Event()
    ready: queue.Queue[str] = queue.Queue()

    def serve() -> None:
        control = ControlPlane("tcp://127.0.0.1:0")
        data = DataPlane(name, NUM_BLOCKS, BLOCK_LEN)
        try:
            ready.put(control.local_id)
            end = time.monotonic() + lifetime_s
            while not stop.is_set() and time.monotonic() < end:
                for ev in control.poll(10):
                    if isinstance(ev, FrameIn):
                        try:
                            msg = decode(ev.frame)
                        except MalformedFrame:
                            continue
                        for out in script(msg, control.local_id, data):
                            control.send(ev.peer_id, encode(out))
        finally:
            control.close()
            data.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield ready.get(timeout=60)
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()
