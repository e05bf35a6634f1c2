"""ABA (vLLM PR #56471, protocol P4). Channels are FIFO, so after a round's terminal frame
nothing more of it can arrive, except a second abort_ack when the abort was re-sent. A
reused kv_request_id therefore restarts at round 0 (as vLLM does; its PD producers supply
only round 0) unless an earlier round ended with an abort within a frame lifetime; then it
skips past that round, and the late abort_ack is ignored."""

from __future__ import annotations

from helpers.world import World, key, ready_driver, ready_world, sent

from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, Lookup, TransferDone
from p2pfsm.session import FrameIgnored, HostFetch, LoadResult, TimerId


def fetch_on_the_wire(w: World) -> Fetch:
    msg = w.wire("a")[-1]
    assert isinstance(msg, Fetch)
    return msg


def test_a_reused_id_restarts_at_round_zero_after_a_clean_end() -> None:
    w = ready_world()
    for block in (8, 9, 10):
        job = w.load("a", "r1", [block])
        assert fetch_on_the_wire(w).round_seq == 0
        w.supply("b", "r1", [block])
        w.stabilize()
        assert w.result("a", job) == LoadResult(job, "r1", True, True)
    assert w.sent_of("b", TransferDone) == [TransferDone("r1", True, 0)] * 3


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


def test_a_reused_id_follows_vllm_rounds_across_lookups_and_fetches() -> None:
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
    assert seen == [0] * 7


def test_concurrent_loads_of_one_id_get_distinct_rounds() -> None:
    w = ready_world()
    first = w.load("a", "r1", [8])
    second = w.load("a", "r1", [9])
    assert [m.round_seq for m in w.wire("a") if isinstance(m, Fetch)] == [0, 1]
    w.deliver_all("a")
    w.supply("b", "r1", [8])  # PD supply goes to the round that demands its keys
    w.supply("b", "r1", [9])
    w.stabilize()
    assert w.result("a", first).success and w.result("a", second).success


def test_the_abort_floor_expires_after_a_frame_lifetime() -> None:
    w = ready_world()
    late_second_abort_ack(w)
    w.deliver("b")  # the second abort_ack arrives after all
    w.now += w.sessions["a"].config.timeouts.tombstone + 1
    job = w.load("a", "r1", [9])
    assert fetch_on_the_wire(w).round_seq == 0
    w.supply("b", "r1", [9])
    w.stabilize()
    assert w.result("a", job).success


def test_a_reused_id_after_its_lookup_round_was_dropped_restarts_at_zero() -> None:
    w = ready_world()
    w.lookup("a", "r1", [1])  # all MISS
    w.stabilize()
    w.finish("a", "r1")  # empty fetch closes round 0
    w.stabilize()
    job = w.load("a", "r1", [8])
    assert fetch_on_the_wire(w).round_seq == 0
    # The new fetch reaches b before its supply: until a fetch or lookup names the
    # request again, b refuses supply for a request its peer finished
    # (test_scenario_round_ended.py).
    w.deliver("a")
    w.supply("b", "r1", [8])
    w.stabilize()
    assert w.result("a", job).success


def test_the_round_floor_never_moves_back_when_an_older_round_aborts_later() -> None:
    """Rounds 0 and 1 of r1 open; round 1 is aborted first (floor 2), then round 0: the
    floor stays 2, so the request's next round is 2, not 1 (whose abort may still echo)."""
    d = ready_driver()
    d(HostFetch(1, "r1", (key(1),), (0,)))
    d.now = 1.0
    d(HostFetch(2, "r1", (key(2),), (1,)))
    for seq in (1, 0):
        assert [type(m) for m in sent(d.fire(TimerId("load", ("r1", seq))))] == [AbortFetch]
        d.recv(AbortAck("r1", seq))
    assert d.s.open_counts()["client_round"] == 0
    (fetch,) = sent(d(HostFetch(3, "r1", (key(3),), (2,))))
    assert isinstance(fetch, Fetch) and fetch.round_seq == 2
