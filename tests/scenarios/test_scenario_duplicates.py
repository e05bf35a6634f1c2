"""Duplicated, late, stale and unknown frames: each is ignored or rejected without effect.

Channels are FIFO (ZeroMQ over TCP never duplicates or reorders), so a frame for an ended
round can only be a new use of it; duplicates here test robustness, not the model."""

from __future__ import annotations

import msgpack
from helpers.world import World, keys, ready_world, snapshot

from p2pfsm.protocol import Disconnect, Fetch, LookupResp, TransferDone
from p2pfsm.session import (
    FetchArrived,
    FrameIgnored,
    LoadResult,
    LookupRequest,
    ProtocolViolation,
    SendToLostPeer,
    StartWrite,
)


def pins_of(w: World, node: str) -> set[int]:
    host = w.hosts[node]
    return set(host.store_jobs) - set(host.store_results)


def test_duplicate_fetch_of_a_serving_round_is_a_violation_and_changes_nothing() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8, 9])
    w.duplicate("a")
    w.deliver("a")
    w.supply("b", "r1", [8])  # one write in flight, key 9 still demanded
    before = snapshot(w.sessions["b"])
    w.deliver("a")
    assert isinstance(w.outputs["b"][-1], ProtocolViolation)
    assert snapshot(w.sessions["b"]) == before
    assert len(w.out("b", StartWrite)) == 1
    w.supply("b", "r1", [9])
    w.stabilize()
    assert w.result("a", job).success
    assert len(w.sent_of("b", TransferDone)) == 1


def test_a_fetch_for_an_ended_round_is_a_new_use_of_it() -> None:
    # vLLM consumers restart a request's rounds at 0, so a fetch naming a round that has
    # ended is served as a new round (channels are FIFO: it cannot be a stale copy).
    w = ready_world()
    first = w.load("a", "r1", [8])
    w.supply("b", "r1", [8])
    w.stabilize()
    assert w.result("a", first).success
    w.inject_msg("b", Fetch("r1", keys([9]), (20,), 0))
    assert w.counts("b")["server_round"] == 1
    assert w.out("b", FetchArrived)[-1] == FetchArrived("r1", 0, keys([9]))


def test_duplicated_lookup_gives_the_client_one_result() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8, 3])
    w.duplicate("a")
    w.stabilize()
    assert len(w.out("b", LookupRequest)) == 2
    assert len(w.sent_of("b", LookupResp)) == 2  # the server answers each lookup frame
    assert len(w.hosts["a"].lookup_results) == 1
    assert w.hosts["a"].lookup_results[0].hits == (True, False)
    assert w.out("a", FrameIgnored)[-1].message_type == "lookup_resp"
    job = w.load("a", "r1", [8])
    w.stabilize()
    assert w.result("a", job).success
    assert w.hosts["b"].quiet


def test_duplicated_lookup_resp_is_ignored() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8])
    w.deliver("a")
    w.duplicate("b")
    w.deliver("b")
    before = snapshot(w.sessions["a"])
    w.deliver("b")
    assert isinstance(w.outputs["a"][-1], FrameIgnored)
    assert snapshot(w.sessions["a"]) == before
    assert len(w.hosts["a"].lookup_results) == 1


def test_duplicated_transfer_done_is_ignored() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8])
    w.supply("b", "r1", [8])
    w.deliver("a")
    w.finish_writes("b")
    w.duplicate("b")
    w.deliver("b")
    before = snapshot(w.sessions["a"])
    w.deliver("b")
    assert isinstance(w.outputs["a"][-1], FrameIgnored)
    assert snapshot(w.sessions["a"]) == before
    assert w.out("a", LoadResult) == [LoadResult(job, "r1", True, True)]


def test_duplicated_abort_ack_is_ignored() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8])
    w.deliver("a")
    w.fire_next("a", "load")
    w.deliver("a")
    w.duplicate("b")
    w.deliver("b")
    w.deliver("b")
    assert w.out("a", FrameIgnored)[-1].message_type == "abort_ack"
    assert w.out("a", LoadResult) == [LoadResult(job, "r1", False, True)]


def test_duplicated_terminal_empty_fetch_is_harmless() -> None:
    w = ready_world()
    w.lookup("a", "r1", [8])
    w.stabilize()
    w.finish("a", "r1")
    w.duplicate("a")
    w.deliver("a")
    before = snapshot(w.sessions["b"])
    start = len(w.outputs["b"])
    w.deliver("a")
    assert all(isinstance(o, FrameIgnored) for o in w.outputs["b"][start:])
    assert snapshot(w.sessions["b"]) == before
    assert w.wire("b") == []


def test_late_transfer_done_for_an_unknown_round_is_ignored() -> None:
    w = ready_world()
    job = w.load("a", "r1", [8])
    w.deliver("a")
    before = snapshot(w.sessions["a"])
    out = w.inject_msg("a", TransferDone("r1", True, 5))
    assert len(out) == 1 and isinstance(out[0], FrameIgnored)
    out = w.inject_msg("a", TransferDone("other", False, 0))
    assert len(out) == 1 and isinstance(out[0], FrameIgnored)
    assert snapshot(w.sessions["a"]) == before
    assert job not in w.hosts["a"].load_results


def test_late_lookup_resp_after_finish_is_ignored() -> None:
    w = ready_world(auto_answer=False)
    w.lookup("a", "r1", [8])
    w.deliver("a")
    token = w.held["b"][0].token
    w.answer("b", token, [8])  # b answers; the answer is on its way
    w.finish("a", "r1")
    w.deliver("b")
    assert isinstance(w.outputs["a"][-1], FrameIgnored)
    assert len(w.hosts["a"].lookup_results) == 1
    assert w.hosts["a"].lookup_results[0].answered is False
    w.deliver_all("a")  # the empty fetch releases b's pin
    assert pins_of(w, "b") == set()


def test_unknown_message_type_is_ignored() -> None:
    w = ready_world()
    w.load("a", "r1", [8])
    w.deliver("a")
    for node in ("a", "b"):
        before = snapshot(w.sessions[node])
        w.inject(node, msgpack.packb({"type": "heartbeat", "x": 1}))
        out = w.outputs[node][-1]
        assert isinstance(out, FrameIgnored) and out.reason == "unknown message type"
        assert snapshot(w.sessions[node]) == before


def test_frames_after_death_are_ignored() -> None:
    w = ready_world()
    w.load("a", "r1", [8])
    w.cut()
    for node in ("a", "b"):
        before = snapshot(w.sessions[node])
        out = w.inject_msg(node, Fetch("r1", keys([8]), (3,), 0))
        # Nothing changes; the peer is told the session is over (test_scenario_one_sided),
        # dialled back if our connection to it is gone.
        assert [type(o) for o in out] == [SendToLostPeer, FrameIgnored]
        assert out[0] == SendToLostPeer(Disconnect())
        assert snapshot(w.sessions[node]) == before
