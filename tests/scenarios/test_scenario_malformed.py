"""Malformed or out-of-place frames yield one ProtocolViolation and change nothing; host
misuse raises LocalProtocolError and changes nothing. Checked on a session that has
work of every kind outstanding."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from helpers.world import (
    NUM_BLOCKS,
    PEER_ID,
    Driver,
    key,
    of_type,
    only,
    peer_connect,
    ready_driver,
    ready_world,
    sent,
    snapshot,
)

from p2pfsm.errors import LocalProtocolError
from p2pfsm.protocol import ConnectAck, Fetch, Lookup, TransferDone
from p2pfsm.session import (
    HostAnswerLookup,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    Input,
    LoadResult,
    LookupRequest,
    ProtocolViolation,
    RegistrationFinished,
    StartWrite,
    StoreResult,
    WriteFinished,
)


def busy_driver() -> tuple[Driver, int, int]:
    """A ready session with a load in flight, a serving round with a write in flight and
    a lookup waiting for the host. Returns (driver, write xfer, lookup token)."""
    d = ready_driver()
    d(HostFetch(1, "load", (key(1), key(2)), (10, 11)))
    d.recv(Fetch("serve", (key(3), key(4)), (20, 21), 0))
    xfer = only(of_type(d(HostSupply(50, "serve", (key(3),), (3,))), StartWrite)).xfer
    token = only(of_type(d.recv(Lookup("probe", (key(5),), 0)), LookupRequest)).token
    return d, xfer, token


def pack(obj: object) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def fetch_dict(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "fetch", "kv_request_id": "x", "keys": [key(7), key(8)],
                         "block_indexes": [1, 2], "round_seq": 0}
    d.update(over)
    return d


def done_dict(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "transfer_done", "kv_request_id": "load", "success": True,
                         "round_seq": 0}
    d.update(over)
    return d


def drop(d: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != name}


BAD_FRAMES: dict[str, bytes] = {
    "empty": b"",
    "reserved-byte": b"\xc1",
    "not-a-map": pack([1, 2, 3]),
    "truncated": pack(done_dict())[:-3],
    "trailing-bytes": pack(done_dict()) + b"\x00",
    "duplicate-map-key": b"\x82\xa4type\xa5fetch\xa4type\xa5fetch",
    "no-type": pack({"kv_request_id": "load"}),
    "fetch-missing-fields": pack({"type": "fetch"}),
    "fetch-length-mismatch": pack(fetch_dict(block_indexes=[1])),
    "fetch-negative-index": pack(fetch_dict(block_indexes=[1, -1])),
    "fetch-index-beyond-our-region": pack(fetch_dict(block_indexes=[1, NUM_BLOCKS])),
    "fetch-duplicate-keys": pack(fetch_dict(keys=[key(7), key(7)])),
    "fetch-key-as-str": pack(fetch_dict(keys=["k7", "k8"])),
    "fetch-round-bool": pack(fetch_dict(round_seq=True)),
    "fetch-round-negative": pack(fetch_dict(round_seq=-1)),
    "done-success-int": pack(done_dict(success=1)),
    "done-missing-id": pack(drop(done_dict(), "kv_request_id")),
    "done-missing-round": pack(drop(done_dict(), "round_seq")),
    "abort-round-str": pack({"type": "abort_fetch", "kv_request_id": "serve", "round_seq": "0"}),
    "lookup-resp-length-mismatch": pack(
        {"type": "lookup_resp", "kv_request_id": "load", "keys": [key(1)], "hits": []}),
    "lookup-resp-int-hits": pack(
        {"type": "lookup_resp", "kv_request_id": "load", "keys": [key(1)], "hits": [1]}),
    "lookup-keys-not-list": pack(
        {"type": "lookup", "kv_request_id": "probe", "keys": key(1), "round_seq": 0}),
    "connect-ack-peer-id-int": pack({"type": "connect_ack", "peer_id": 5}),
    "abort-ack-not-aborted": pack({"type": "abort_ack", "kv_request_id": "load", "round_seq": 0}),
    "fetch-of-a-serving-round": pack(
        {"type": "fetch", "kv_request_id": "serve", "keys": [key(9)], "block_indexes": [5],
         "round_seq": 0}),
    "lookup-of-a-fetched-round": pack(
        {"type": "lookup", "kv_request_id": "serve", "keys": [key(9)], "round_seq": 0}),
    "fetch-malformed-of-a-serving-round": pack(fetch_dict(kv_request_id="serve",
                                                          block_indexes=[1])),
    "fetch-malformed-terminal": pack(fetch_dict(keys=[], block_indexes=[1])),
    "fetch-keys-missing": pack(drop(fetch_dict(), "keys")),
}
ANSWERED = {"fetch-length-mismatch", "fetch-negative-index", "fetch-index-beyond-our-region",
            "fetch-duplicate-keys", "fetch-key-as-str", "fetch-keys-missing"}
"""Malformed fetches that name their round ("x", 0), which no round serves: besides the
violation, transfer_done(false) for that round at once (recv_bad_fetch)."""


@pytest.mark.parametrize("name", BAD_FRAMES)
def test_bad_frame_is_one_violation_and_changes_nothing(name: str) -> None:
    d, xfer, token = busy_driver()
    before = snapshot(d.s)
    out = d.recv_raw(BAD_FRAMES[name])
    assert isinstance(out[0], ProtocolViolation), out
    answer = [TransferDone("x", False, 0)] if name in ANSWERED else []
    assert len(out) == 1 + len(answer) and sent(out) == answer, out
    assert snapshot(d.s) == before
    assert d.s.ready
    # All the outstanding work still completes normally.
    out = d.recv(TransferDone("load", True, 0))
    assert of_type(out, LoadResult) == [LoadResult(1, "load", True, True)]
    out = d(WriteFinished(xfer, True))
    assert of_type(out, StoreResult) == [] and sent(out) == []  # key 4 still demanded
    out = d(HostAnswerLookup(token, {}, None))
    assert len(sent(out)) == 1


def test_a_malformed_fetch_before_we_acked_the_peer_gets_no_answer() -> None:
    d = Driver()
    d(HostStart())
    d.recv(peer_connect())  # registering: the peer may not send requests yet
    before = snapshot(d.s)
    out = d.recv_raw(pack(fetch_dict(block_indexes=[1])))
    assert len(out) == 1 and isinstance(out[0], ProtocolViolation)
    assert snapshot(d.s) == before


def test_a_malformed_fetch_while_awaiting_the_ack_is_answered_once_ready() -> None:
    d = Driver()
    d(HostStart())
    d.recv(peer_connect())
    d(RegistrationFinished(True))  # we acked the peer: it may send requests
    assert d.s.state == "awaiting_ack"
    out = d.recv_raw(pack(fetch_dict(block_indexes=[1])))
    assert len(out) == 1 and isinstance(out[0], ProtocolViolation)
    assert d.s.open_counts()["server_round"] == 0
    assert sent(d.recv(ConnectAck(PEER_ID))) == [TransferDone("x", False, 0)]


def test_the_consumer_of_a_malformed_fetch_fails_at_once() -> None:
    """Two real sessions: a fetch of a gets corrupted on the wire (its indexes one short);
    b rejects it and answers, so a's load fails now with its destination free."""
    w = ready_world()
    job = w.load("a", "r1", [1, 2])
    chan = w.channels[("a", "b")]
    wire = msgpack.unpackb(chan[0], raw=False)
    chan[0] = pack({**wire, "block_indexes": wire["block_indexes"][:1]})
    w.deliver("a")
    assert [type(v.error).__name__ for v in w.hosts["b"].violations] == ["MalformedFrame"]
    w.deliver("b")
    assert w.result("a", job) == LoadResult(job, "r1", False, True)
    assert w.sessions["a"].ready and w.sessions["b"].ready
    assert w.hosts["a"].quiet and w.hosts["b"].quiet


def test_malformed_connect_during_the_handshake_changes_nothing() -> None:
    d = Driver()
    d(HostStart())
    bad = pack({"type": "connect", "peer_id": PEER_ID, "agent_metadata": b"m", "base_addr": 0,
                "num_blocks": True, "block_len": 16, "config_fingerprint": "",
                "hash_seed": "vllm-none-hash"})
    before = snapshot(d.s)
    out = d.recv_raw(bad)
    assert len(out) == 1 and isinstance(out[0], ProtocolViolation)
    assert snapshot(d.s) == before
    d.recv(peer_connect())
    assert d.s.state == "registering"


def test_requests_before_the_peers_connect_are_violations() -> None:
    d = Driver()
    d(HostStart())
    before = snapshot(d.s)
    for msg in (Fetch("x", (key(1),), (1,), 0), Lookup("x", (key(1),), 0)):
        out = d.recv(msg)
        assert len(out) == 1 and isinstance(out[0], ProtocolViolation)
    assert snapshot(d.s) == before
    assert d.s.state == "connecting"


def test_responses_before_ready_are_violations() -> None:
    d = Driver()
    d(HostStart())
    d.recv(peer_connect())
    before = snapshot(d.s)
    out = d.recv(TransferDone("x", True, 0))
    assert len(out) == 1 and isinstance(out[0], ProtocolViolation)
    assert snapshot(d.s) == before
    d.recv(ConnectAck(PEER_ID))
    assert d.s.state == "registering_acked"


MISUSE: dict[str, Input] = {
    "fetch-length-mismatch": HostFetch(9, "f", (key(1), key(2)), (1,)),
    "fetch-duplicate-keys": HostFetch(9, "f", (key(1), key(1)), (1, 2)),
    "fetch-index-outside-region": HostFetch(9, "f", (key(1),), (NUM_BLOCKS,)),
    "fetch-negative-index": HostFetch(9, "f", (key(1),), (-1,)),
    "fetch-empty-key": HostFetch(9, "f", (b"",), (1,)),
    "fetch-job-already-loading": HostFetch(1, "f", (key(1),), (1,)),
    "supply-job-already-pinned": HostSupply(50, "s", (key(6),), (6,)),
    "supply-index-outside-region": HostSupply(51, "s", (key(6),), (NUM_BLOCKS,)),
    "supply-length-mismatch": HostSupply(51, "s", (key(6),), ()),
    "lookup-duplicate-keys": HostLookup("p", (key(1), key(1))),
    "answer-key-not-asked": HostAnswerLookup(1, {key(9): 3}, 60),
    "answer-hits-without-job": HostAnswerLookup(1, {key(5): 3}, None),
    "answer-hit-outside-region": HostAnswerLookup(1, {key(5): NUM_BLOCKS}, 60),
    "answer-job-already-pinned": HostAnswerLookup(1, {key(5): 3}, 50),
    "answer-pending-key-not-asked": HostAnswerLookup(1, {}, None, frozenset({key(9)})),
    "write-not-in-flight": WriteFinished(99, True),
    "start-twice": HostStart(),
}


@pytest.mark.parametrize("event", MISUSE.values(), ids=MISUSE.keys())
def test_host_misuse_raises_and_changes_nothing(event: Input) -> None:
    d, xfer, token = busy_driver()
    assert token == 1
    before = snapshot(d.s)
    log = len(d.log)
    with pytest.raises(LocalProtocolError):
        d(event)
    assert snapshot(d.s) == before
    assert len(d.log) == log
    # The next call's outputs are its own: nothing of the rejected call leaks out.
    out = d(WriteFinished(xfer, True))
    assert out == []


@pytest.mark.parametrize("event", [
    HostFetch(1, "f", (key(1),), (1,)),
    HostSupply(2, "s", (key(1),), (1,)),
    HostLookup("p", (key(1),)),
    HostFinish("f"),
], ids=["fetch", "supply", "lookup", "finish"])
def test_host_calls_before_start_raise(event: Input) -> None:
    d = Driver()
    with pytest.raises(LocalProtocolError):
        d(event)
    assert d.s.state == "idle" and d.log == []
