"""ABA (vLLM PR #56471, protocol P4): a kv_request_id reused after its load ended gets a
new round number, and late or duplicated terminals of the old round are ignored."""

from __future__ import annotations

from helpers.world import World, ready_world

from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, Lookup, TransferDone
from p2pfsm.session import FrameIgnored, LoadResult


def fetch_on_the_wire(w: World) -> Fetch:
    msg = w.wire("a")[-1]
    assert isinstance(msg, Fetch)
    return msg


def test_duplicated_transfer_done_of_the_old_round_is_ignored_after_reuse() -> None:
    w = ready_world()
    old = w.load("a", "r1", [8])
    w.supply("b", "r1", [8])
    w.deliver("a")
    w.finish_writes("b")
    w.duplicate("b")  # transfer_done(0) twice on the wire
    assert w.wire("b") == [TransferDone("r1", True, 0)] * 2
    w.deliver("b")
    assert w.result("a", old).success
    new = w.load("a", "r1", [9])
    assert fetch_on_the_wire(w).round_seq == 1
    w.deliver("b")  # the stale copy
    assert w.out("a", FrameIgnored)[-1].message_type == "transfer_done"
    assert new not in w.hosts["a"].load_results
    w.deliver("a")
    w.supply("b", "r1", [9])
    w.stabilize()
    assert w.result("a", new) == LoadResult(new, "r1", True, True)
    assert w.sent_of("b", TransferDone)[-1] == TransferDone("r1", True, 1)


def late_second_abort_ack(w: World) -> int:
    """An aborted load whose abort was re-sent: two abort_acks come back. Delivers the
    first; the second stays queued. Returns the old job."""
    old = w.load("a", "r1", [8])
    w.deliver("a")
    w.fire_next("a", "load")
    w.fire_next("a", "abort_ack")
    assert w.wire("a") == [AbortFetch("r1", 0)] * 2
    w.deliver_all("a")
    assert w.wire("b") == [AbortAck("r1", 0)] * 2
    w.deliver("b")
    assert w.result("a", old) == LoadResult(old, "r1", False, True)
    return old


def test_late_abort_ack_of_the_old_round_does_not_complete_the_new_load() -> None:
    w = ready_world()
    late_second_abort_ack(w)
    new = w.load("a", "r1", [9])
    assert fetch_on_the_wire(w).round_seq == 1
    w.deliver("b")  # the late abort_ack(0)
    assert w.out("a", FrameIgnored)[-1].message_type == "abort_ack"
    assert new not in w.hosts["a"].load_results
    w.supply("b", "r1", [9])
    w.stabilize()
    assert w.result("a", new) == LoadResult(new, "r1", True, True)


def test_late_abort_ack_of_the_old_round_does_not_end_the_new_abort() -> None:
    w = ready_world()
    late_second_abort_ack(w)
    new = w.load("a", "r1", [9])
    w.deliver_all("a")
    w.fire_next("a", "load")  # the new round is aborting too
    assert w.wire("a")[-1] == AbortFetch("r1", 1)
    w.deliver("b")  # the late abort_ack(0)
    assert new not in w.hosts["a"].load_results
    w.deliver_all("a")
    assert w.wire("b") == [AbortAck("r1", 1)]
    w.deliver("b")
    assert w.result("a", new) == LoadResult(new, "r1", False, True)


def test_a_reused_id_never_reuses_a_round_number() -> None:
    w = ready_world()
    seen: list[int] = []
    for i in range(5):
        if i % 2:
            w.lookup("a", "r1", [8 + i])
            msg = w.wire("a")[-1]
            assert isinstance(msg, Lookup)
            seen.append(msg.round_seq)
            w.stabilize()
        job = w.load("a", "r1", [8 + i])
        seen.append(fetch_on_the_wire(w).round_seq)
        w.supply("b", "r1", [8 + i])
        w.stabilize()
        assert w.result("a", job).success
    assert seen == [0, 1, 1, 2, 3, 3, 4]


def test_a_reused_id_after_its_lookup_round_was_dropped_gets_a_new_round() -> None:
    w = ready_world()
    w.lookup("a", "r1", [1])  # all MISS
    w.stabilize()
    w.finish("a", "r1")  # empty fetch closes round 0
    w.stabilize()
    job = w.load("a", "r1", [8])
    assert fetch_on_the_wire(w).round_seq == 1
    w.supply("b", "r1", [8])
    w.stabilize()
    assert w.result("a", job).success
