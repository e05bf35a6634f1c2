"""The suite catches a target that breaks the rules: a fake producer (p2pfsm's
ControlPlane and a real NIXL agent for its metadata, its answers scripted here) that
claims a round it never wrote, answers a request before its connect_ack, answers both
copies of a fetch, or answers a lookup's keys out of order, fails the case that looks at
it, naming the rule and what came."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from p2pfsm.demo_blocks import demo_key
from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.protocol import Connect, ConnectAck, Fetch, Lookup, LookupResp, Message, TransferDone
from p2pfsm.tools.conform.registry import CASES
from p2pfsm.tools.conform.runner import run_case
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.verdict import CaseResult, Verdict
from tests.helpers.fake_producer import BLOCK_LEN, Script, connect_of, fake_producer

LIFETIME_S = 60.0  # the fake serves at most this long

Fails = Callable[[Script, str], CaseResult]


def lying(msg: Message | None, me: str, data: DataPlane) -> list[Message]:
    """A correct handshake; every fetch 'served' with nothing written."""
    if isinstance(msg, Connect):
        return [connect_of(me, data), ConnectAck(me)]
    if isinstance(msg, Fetch) and msg.keys:
        return [TransferDone(msg.kv_request_id, True, msg.round_seq)]
    return []


HELD = {demo_key(i) for i in range(16)}


def backwards(msg: Message | None, me: str, data: DataPlane) -> list[Message]:
    """A correct handshake; every lookup answered right, but its keys in reverse order."""
    if isinstance(msg, Connect):
        return [connect_of(me, data), ConnectAck(me)]
    if isinstance(msg, Lookup):
        keys = msg.keys[::-1]
        return [LookupResp(msg.kv_request_id, keys, tuple(k in HELD for k in keys))]
    return []


def chatty(msg: Message | None, me: str, data: DataPlane) -> list[Message]:
    """A transfer_done slipped in between its connect and its connect_ack."""
    if isinstance(msg, Connect):
        return [connect_of(me, data), TransferDone("x", False, 0), ConnectAck(me)]
    return []


@pytest.fixture
def fails() -> Iterator[Fails]:
    """Run one case against a fake producer serving a script; the case's result, which
    must be a failure. Every fake is stopped at teardown."""
    with ExitStack() as fakes:
        def run(script: Script, case: str) -> CaseResult:
            addr = fakes.enter_context(fake_producer(script, "conform-fake", LIFETIME_S))
            result = run_case(Target(addr, BLOCK_LEN, deadline=5.0, window=0.3), CASES[case])
            assert result.verdict is Verdict.FAIL, result
            return result
        yield run


def test_a_round_claimed_but_never_written_fails(fails: Fails) -> None:
    result = fails(lying, "pd.round")
    assert "byte-exact" in result.expected
    assert "nothing landed" in result.got


def test_a_fetch_answered_twice_fails(fails: Fails) -> None:
    """A producer that answers each copy of a fetch: two transfer_done for one round."""
    result = fails(lying, "duplicate.fetch")
    assert "at most one transfer_done for the round" in result.expected
    assert result.got.count("transfer_done(kv_request_id='conform-twice'") == 2, result.got


def test_lookup_answers_out_of_order_fail(fails: Fails) -> None:
    result = fails(backwards, "lookup.coalesced")
    assert "in the lookup's order" in result.expected
    assert "per lookup_resp: [[3, 2, 1, 0]]" in result.got


def test_a_frame_before_connect_ack_fails(fails: Fails) -> None:
    result = fails(chatty, "handshake")
    assert "accepted by p2pfsm's session machines" in result.expected
    assert "state=awaiting_ack trigger=recv_response" in result.got
