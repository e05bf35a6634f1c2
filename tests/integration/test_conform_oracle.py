"""The suite catches a target that breaks the rules: a fake producer (p2pfsm's
ControlPlane and a real NIXL agent for its metadata, its answers scripted here) that
claims a round it never wrote, answers a request before its connect_ack, answers both
copies of a fetch, or answers a lookup's keys out of order, fails the case that looks at
it, naming the rule and what came."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from p2pfsm.conform.registry import CASES
from p2pfsm.conform.runner import run_case
from p2pfsm.conform.target import Target
from p2pfsm.conform.verdict import Verdict
from p2pfsm.demo.blocks import demo_key
from p2pfsm.executor.nixl_plane import DataPlane
from p2pfsm.executor.zmq_plane import ControlPlane, FrameIn
from p2pfsm.protocol import (
    Connect,
    ConnectAck,
    Fetch,
    Lookup,
    LookupResp,
    Message,
    TransferDone,
    decode,
    encode,
)

BLOCK_LEN = 4096
LIFETIME_S = 60.0  # the fake serves at most this long

Script = Callable[[Message, str, DataPlane], list[Message]]


def lying(msg: Message, me: str, data: DataPlane) -> list[Message]:
    """A correct handshake; every fetch 'served' with nothing written."""
    if isinstance(msg, Connect):
        return [_connect(me, data), ConnectAck(me)]
    if isinstance(msg, Fetch) and msg.keys:
        return [TransferDone(msg.kv_request_id, True, msg.round_seq)]
    return []


HELD = {demo_key(i) for i in range(16)}


def backwards(msg: Message, me: str, data: DataPlane) -> list[Message]:
    """A correct handshake; every lookup answered right, but its keys in reverse order."""
    if isinstance(msg, Connect):
        return [_connect(me, data), ConnectAck(me)]
    if isinstance(msg, Lookup):
        keys = msg.keys[::-1]
        return [LookupResp(msg.kv_request_id, keys, tuple(k in HELD for k in keys))]
    return []


def chatty(msg: Message, me: str, data: DataPlane) -> list[Message]:
    """A transfer_done slipped in between its connect and its connect_ack."""
    if isinstance(msg, Connect):
        return [_connect(me, data), TransferDone("x", False, 0), ConnectAck(me)]
    return []


def _connect(me: str, data: DataPlane) -> Connect:
    return Connect(me, data.metadata, data.base_addr, data.num_blocks, BLOCK_LEN, "",
                   "vllm-none-hash")


@pytest.fixture
def fake() -> Iterator[Callable[[Script], str]]:
    """Start a scripted fake producer in a thread; its address. Stopped at teardown."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(script: Script) -> str:
        ready: queue.Queue[str] = queue.Queue()

        def serve() -> None:
            control = ControlPlane("tcp://127.0.0.1:0")
            data = DataPlane("conform-fake", 16, BLOCK_LEN)
            try:
                ready.put(control.local_id)
                end = time.monotonic() + LIFETIME_S
                while not stop.is_set() and time.monotonic() < end:
                    for ev in control.poll(10):
                        if isinstance(ev, FrameIn):
                            for out in script(decode(ev.frame), control.local_id, data):
                                control.send(ev.peer_id, encode(out))
            finally:
                control.close()
                data.close()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        threads.append(thread)
        return ready.get(timeout=60)

    yield start
    stop.set()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()


def test_a_round_claimed_but_never_written_fails(fake: Callable[[Script], str]) -> None:
    addr = fake(lying)
    result = run_case(Target(addr, BLOCK_LEN, deadline=5.0, window=0.3), CASES["pd.round"])
    assert result.verdict is Verdict.FAIL, result
    assert "byte-exact" in result.expected
    assert "nothing landed" in result.got


def test_a_fetch_answered_twice_fails(fake: Callable[[Script], str]) -> None:
    """A producer that answers each copy of a fetch: two transfer_done for one round."""
    addr = fake(lying)
    result = run_case(Target(addr, BLOCK_LEN, deadline=5.0, window=0.3),
                      CASES["duplicate.fetch"])
    assert result.verdict is Verdict.FAIL, result
    assert "at most one transfer_done for the round" in result.expected
    assert result.got.count("transfer_done(kv_request_id='conform-twice'") == 2, result.got


def test_lookup_answers_out_of_order_fail(fake: Callable[[Script], str]) -> None:
    addr = fake(backwards)
    result = run_case(Target(addr, BLOCK_LEN, deadline=5.0, window=0.3),
                      CASES["lookup.coalesced"])
    assert result.verdict is Verdict.FAIL, result
    assert "in the lookup's order" in result.expected
    assert "per lookup_resp: [[3, 2, 1, 0]]" in result.got


def test_a_frame_before_connect_ack_fails(fake: Callable[[Script], str]) -> None:
    addr = fake(chatty)
    result = run_case(Target(addr, BLOCK_LEN, deadline=5.0, window=0.3), CASES["handshake"])
    assert result.verdict is Verdict.FAIL, result
    assert "accepted by p2pfsm's session machines" in result.expected
    assert "state=awaiting_ack trigger=recv_response" in result.got
