"""Post-handshake abuse: frames for rounds that do not exist, the producer's own
messages spoofed at it, out-of-range indexes, oversize and mistyped key lists,
repeated aborts, lookups never finished, frames after a disconnect.

Each scenario runs on a session that completed a real handshake, and ends with a real
fetch on that same session (bytes checked) unless the scenario ended the session.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Hostile, legit_fetch
from .wire import demo_block, demo_key, fetch_msg

K0 = demo_key(0)
RID = "evil"

BAD_FETCHES: dict[str, dict[str, Any]] = {
    "block_index_2p31": fetch_msg(RID, [K0], [2**31]),
    "block_index_minus_1": fetch_msg(RID, [K0], [-1]),
    "block_index_past_our_region": fetch_msg(RID, [K0], [64]),
    "block_index_2p31_minus_1": fetch_msg(RID, [K0], [2**31 - 1]),
    "block_index_bool": fetch_msg(RID, [K0], [True]),
    "keys_70000": fetch_msg(RID, [K0] * 70_000, [0] * 70_000),
    "keys_as_str": fetch_msg(RID, "k" * 36, [0]),
    "keys_as_bin": fetch_msg(RID, K0, [0]),
    "keys_items_str": fetch_msg(RID, ["k" * 36], [0]),
    "key_empty": fetch_msg(RID, [b""], [0]),
    "key_5000_bytes": fetch_msg(RID, [b"k" * 5000], [0]),
    "lengths_differ": fetch_msg(RID, [K0, demo_key(1)], [0]),
    "indexes_as_map": fetch_msg(RID, [K0], {"0": 0}),
    "round_seq_bool": fetch_msg(RID, [K0], [0], True),
    "round_seq_negative": fetch_msg(RID, [K0], [0], -1),
    "round_seq_str": fetch_msg(RID, [K0], [0], "0"),
    "request_id_empty": fetch_msg("", [K0], [0]),
    "request_id_5000_chars": fetch_msg("r" * 5000, [K0], [0]),
    "request_id_int": fetch_msg(7, [K0], [0]),  # type: ignore[arg-type]
    "missing_round_seq": {"type": "fetch", "kv_request_id": RID, "keys": [K0],
                          "block_indexes": [0]},
}


NAMED_ROUND = {
    "block_index_2p31", "block_index_minus_1", "block_index_past_our_region",
    "block_index_2p31_minus_1", "block_index_bool", "keys_as_str", "keys_as_bin",
    "keys_items_str", "key_empty", "key_5000_bytes", "lengths_differ", "indexes_as_map",
}
"""Bad fetches whose kv_request_id and round_seq can be read: the server answers each
with transfer_done(false) for that round at once (an honest-but-buggy consumer fails
now, not at its load deadline). The others name no round (or do not even unpack:
70 000 keys, a 5 000-byte id) and get no reply."""


@pytest.mark.parametrize("name", sorted(BAD_FETCHES))
def test_bad_fetch(hostile: Hostile, name: str) -> None:
    peer, plane = hostile.ready()
    peer.send(BAD_FETCHES[name])
    if name in NAMED_ROUND:
        done = peer.expect("transfer_done", 10.0, lambda m: m.get("kv_request_id") == RID)
        assert done["success"] is False and done["round_seq"] == 0, done
    peer.fetch_ok(plane, "honest", range(3), timeout=15.0)
    # Frames come in order on one connection: a reply to the bad fetch would have come
    # before the honest fetch's transfer_done.
    replies = [m for m in peer.seen if m.get("kv_request_id") == RID]
    assert len(replies) == (name in NAMED_ROUND), replies
    hostile.react(("transfer_done(false) at once" if name in NAMED_ROUND else "no reply")
                  + "; rejected, session kept; an honest fetch succeeds")
    hostile.verify()


SPOOFED: dict[str, dict[str, Any]] = {
    "transfer_done": {"type": "transfer_done", "kv_request_id": RID, "success": True,
                      "round_seq": 0},
    "transfer_done_int_success": {"type": "transfer_done", "kv_request_id": RID,
                                  "success": 1, "round_seq": 0},
    "abort_ack": {"type": "abort_ack", "kv_request_id": RID, "round_seq": 0},
    "lookup_resp": {"type": "lookup_resp", "kv_request_id": RID, "keys": [K0],
                    "hits": [True]},
    "lookup_resp_int_hits": {"type": "lookup_resp", "kv_request_id": RID, "keys": [K0],
                             "hits": [1]},
}


@pytest.mark.parametrize("name", sorted(SPOOFED))
def test_spoofed_producer_message(hostile: Hostile, name: str) -> None:
    """The server is the producer: these answer nothing it asked."""
    peer, plane = hostile.ready()
    for _ in range(50):
        peer.send(SPOOFED[name])
    peer.fetch_ok(plane, "honest", range(3))
    hostile.react("50 ignored/rejected, session kept")
    hostile.verify()


def test_fetch_for_unknown_rounds(hostile: Hostile) -> None:
    peer, plane = hostile.ready()
    for r in (1, 7, 2**32, 2**64 - 1):
        peer.send(fetch_msg(f"unknown-{r}", [K0], [0], r))
    got = peer.types_within(0.5)
    peer.fetch_ok(plane, "honest", range(3))
    hostile.react(f"replies {sorted(set(got)) or 'none'}; session kept")
    hostile.verify()


def test_fetch_of_keys_the_server_lacks(hostile: Hostile) -> None:
    peer, plane = hostile.ready()
    peer.send(fetch_msg("lacking", [b"\x01" * 36, demo_key(10_000)], [0, 1]))
    done = peer.expect("transfer_done", 15.0, pump=plane.progress)
    assert done["success"] is False, done
    peer.fetch_ok(plane, "honest", range(3))
    hostile.react("transfer_done(false) at once")
    hostile.verify()


def test_a_second_round_after_a_round_the_server_could_not_serve(hostile: Hostile) -> None:
    """Round 0 of a request names a key the server lacks, round 1 of the same request one
    it holds (a consumer continuing its request, as lookup rounds do). Each round gets
    exactly one transfer_done: round 0 fails (the demo host declines that round only),
    round 1 is served, its block checked; the server lives on (it used to exit: its host
    finished the request on round 0 and was then asked to supply round 1)."""
    peer, plane = hostile.ready()
    peer.send(fetch_msg("two-rounds", [demo_key(10_000)], [0], 0))
    first = peer.expect("transfer_done", 15.0, pump=plane.progress)
    assert (first["round_seq"], first["success"]) == (0, False), first
    peer.send(fetch_msg("two-rounds", [demo_key(5)], [1], 1))
    second = peer.expect("transfer_done", 15.0, pump=plane.progress)
    assert (second["round_seq"], second["success"]) == (1, True), second
    assert bytes(plane.region[1].numpy()) == demo_block(5)
    assert hostile.server.alive(), "the server died on the second round"
    assert [m["round_seq"] for m in peer.seen if m.get("type") == "transfer_done"] == [0, 1]
    peer.fetch_ok(plane, "honest", range(3))
    hostile.react("one transfer_done per round: round 0 failed, round 1 served; server alive")
    hostile.verify()


def test_max_keys_of_unknown_blocks(hostile: Hostile) -> None:
    """65536 keys (the most a frame may carry), none held: one transfer_done(false)."""
    peer, plane = hostile.ready()
    keys = [i.to_bytes(4, "big") * 9 for i in range(65536)]
    peer.send(fetch_msg("huge", keys, [i % 64 for i in range(65536)]))
    done = peer.expect("transfer_done", 30.0, pump=plane.progress)
    assert done["success"] is False
    peer.fetch_ok(plane, "honest", range(3))
    hostile.react("transfer_done(false); memory back")
    hostile.verify()


def test_same_destination_block_twice(hostile: Hostile) -> None:
    peer, plane = hostile.ready()
    peer.send(fetch_msg("overlap", [demo_key(1), demo_key(2)], [5, 5]))
    got = peer.expect("transfer_done", 15.0, pump=plane.progress)
    peer.fetch_ok(plane, "honest", range(3))
    hostile.react(f"transfer_done(success={got['success']}); session kept")
    hostile.verify()


def test_repeated_aborts(hostile: Hostile) -> None:
    peer, plane = hostile.ready()
    peer.fetch_ok(plane, "finished", range(2))
    for i in range(300):
        peer.send({"type": "abort_fetch", "kv_request_id": ("finished", "never", "x")[i % 3],
                   "round_seq": i % 5})
    acks = peer.types_within(0.5)
    peer.fetch_ok(plane, "honest", range(3))
    hostile.react(f"{acks.count('abort_ack')} abort_acks for 300 aborts; session kept")
    hostile.verify()


def test_lookups_never_finished(hostile: Hostile) -> None:
    """500 lookups whose hits the server pins, never fetched nor finished."""
    peer, plane = hostile.ready()
    keys = [demo_key(i) for i in range(16)]
    for i in range(500):
        peer.send({"type": "lookup", "kv_request_id": f"lk-{i}", "keys": keys, "round_seq": 0})
    for _ in range(500):
        resp = peer.expect("lookup_resp", 20.0)
        assert resp["hits"] == [True] * 16
    legit_fetch(hostile.addr, range(16))
    peer.fetch_ok(plane, "honest", range(3))
    hostile.react("500 lookups pinned; legit and honest fetches still served; "
                  "pins released with the session")
    hostile.verify()


def test_frames_after_disconnect(hostile: Hostile) -> None:
    peer, plane = hostile.ready()
    peer.send({"type": "disconnect"})
    for i in range(20):
        peer.send(fetch_msg(f"late-{i}", [K0], [0]))
    got = peer.types_within(0.5)
    assert "transfer_done" not in got, got
    peer.handshake(plane.metadata, plane.base_addr)
    peer.fetch_ok(plane, "honest", range(3))
    hostile.react(f"late fetches ignored ({got or 'no reply'}); a new handshake works")
    hostile.verify()


def test_fetch_flood(hostile: Hostile) -> None:
    """2000 one-block fetches in a burst: each gets its transfer_done."""
    peer, plane = hostile.ready()
    for i in range(2000):
        peer.send(fetch_msg(f"flood-{i}", [demo_key(i % 64)], [i % 64]))
    seen = 0
    for _ in range(2000):
        peer.expect("transfer_done", 30.0, pump=plane.progress)
        seen += 1
    peer.fetch_ok(plane, "honest", range(3))
    hostile.react(f"{seen} transfer_done; session kept")
    hostile.verify()
