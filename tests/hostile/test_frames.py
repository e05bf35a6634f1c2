"""Malformed and oversize frames, before and after the handshake.

Each bad frame is followed, on the same connection, by a legitimate exchange (a
handshake, or a real fetch whose bytes are checked): frames from one peer are handled
in order, so its success shows the bad frame was taken in and changed nothing.
"""

from __future__ import annotations

import random

import pytest

from .conftest import Hostile
from .wire import connect_msg, demo_key, pack

MIB = 1 << 20
_rng = random.Random(11)


def _garbage(n: int) -> bytes:
    return _rng.randbytes(n)


def _deep(levels: int) -> bytes:
    # fixarray(1) headers, then a nil: msgpack's own recursion limit is the guard.
    return b"\x91" * levels + b"\xc0"


def _array16_bomb(levels: int) -> bytes:
    # array16 claiming 65535 items, nested: tiny on the wire, huge if preallocated.
    return b"\xdc\xff\xff" * levels


def _dup_keys() -> bytes:
    # map of 2 entries, both "type" (msgpack would silently keep the last).
    return b"\x82" + pack("type") + pack("connect") + pack("type") + pack("fetch")


PRE_HANDSHAKE = {
    "garbage_1k": _garbage(1024),
    "empty_payload": b"",
    "single_byte_nil": b"\xc0",
    "truncated_connect": pack(connect_msg("127.0.0.1:1", b"x" * 64, 4096))[:40],
    "top_level_array": pack(["connect", "127.0.0.1:1"]),
    "map_without_type": pack({"peer_id": "127.0.0.1:1"}),
    "type_is_int": pack({"type": 3}),
    "type_is_bin": pack({"type": b"connect"}),
    "unknown_type": pack({"type": "handshake_v2", "x": 1}),
    "int_map_keys": pack({1: "connect", "type": "connect"}),
    "duplicate_map_keys": _dup_keys(),
    "deep_nesting_100k": _deep(100_000),
    "array16_header_bomb": _array16_bomb(3000),
    "fixext_value": b"\x81" + pack("type") + b"\xd4\x05\x00",
    "timestamp_ext": b"\x81" + pack("type") + b"\xd6\xff\x00\x00\x00\x01",
    "trailing_bytes": pack({"type": "disconnect"}) + b"\x00\x00",
    "invalid_utf8_str": b"\x81" + pack("type") + b"\xa2\xff\xfe",
    "garbage_10mib": _garbage(10 * MIB),
    "map_with_10mib_unknown_field": pack({"type": "lookup", "pad": b"\0" * (10 * MIB)}),
}


@pytest.mark.parametrize("name", sorted(PRE_HANDSHAKE))
def test_bad_frame_before_handshake(hostile: Hostile, name: str) -> None:
    plane = hostile.agent()
    peer = hostile.peer()
    peer.send_raw(PRE_HANDSHAKE[name])
    theirs = peer.handshake(plane.metadata, plane.base_addr)
    assert theirs["peer_id"] == hostile.addr
    peer.fetch_ok(plane, "after-bad-frame", range(2))
    hostile.react("ignored (no session); the same peer's handshake + fetch then succeed")
    hostile.verify()


POST_HANDSHAKE = {
    "garbage_1k": _garbage(1024),
    "truncated_fetch": pack({"type": "fetch", "kv_request_id": "r", "keys": [demo_key(0)],
                             "block_indexes": [0], "round_seq": 0})[:-3],
    "deep_nesting_100k": _deep(100_000),
    "array16_header_bomb": _array16_bomb(3000),
    "duplicate_map_keys": _dup_keys(),
    "garbage_10mib": _garbage(10 * MIB),
    "unknown_type": pack({"type": "handshake_v2"}),
}


@pytest.mark.parametrize("name", sorted(POST_HANDSHAKE))
def test_bad_frame_after_handshake(hostile: Hostile, name: str) -> None:
    peer, plane = hostile.ready()
    peer.send_raw(POST_HANDSHAKE[name])
    peer.fetch_ok(plane, "after-bad-frame", range(3))
    hostile.react("rejected, session kept; the next fetch succeeds")
    hostile.verify()


def test_frame_over_max_msg_size(hostile: Hostile) -> None:
    """17 MiB is past the ROUTER's MAXMSGSIZE (16 MiB): libzmq drops that connection."""
    peer, _plane = hostile.ready()
    peer.send_raw(_garbage(17 * MIB))
    # The server's DEALER to us is unaffected, but its ROUTER dropped our connection
    # (with our TCP queue); our DEALER reconnects, and a fresh fetch must still work.
    fresh = hostile.peer()
    other = hostile.agent()
    fresh.handshake(other.metadata, other.base_addr)
    fresh.fetch_ok(other, "after-17mib", range(2))
    hostile.react("connection dropped by libzmq (MAXMSGSIZE); others unaffected")
    hostile.verify()


def test_multipart_frames(hostile: Hostile) -> None:
    peer, plane = hostile.ready()
    fetch = pack({"type": "fetch", "kv_request_id": "mp", "keys": [demo_key(0)],
                  "block_indexes": [0], "round_seq": 0})
    peer.send_parts([fetch, fetch])
    peer.send_parts([fetch, b"", fetch])
    assert "transfer_done" not in peer.types_within(0.3)
    peer.fetch_ok(plane, "after-multipart", range(2))
    hostile.react("dropped (frame count); session kept")
    hostile.verify()


def test_empty_delimiter_frame(hostile: Hostile) -> None:
    """REQ-style [b'', payload] reaches the ROUTER as three parts: dropped."""
    peer, plane = hostile.ready()
    peer.send_parts([b"", pack({"type": "fetch", "kv_request_id": "d", "keys": [demo_key(1)],
                                "block_indexes": [0], "round_seq": 0})])
    assert "transfer_done" not in peer.types_within(0.3)
    peer.fetch_ok(plane, "after-delimiter", range(2))
    hostile.react("dropped (frame count); session kept")
    hostile.verify()


def test_garbage_flood(hostile: Hostile) -> None:
    """5000 garbage frames in a burst on a ready session: the node's violation budget
    (NodeConfig.max_violations) closes the session with a disconnect; the peer can
    start over and fetch."""
    peer, plane = hostile.ready()
    for i in range(5000):
        peer.send_raw(_garbage(64 + i % 64))
    peer.expect("disconnect", 30.0)
    peer.handshake(plane.metadata, plane.base_addr, timeout=30.0)
    peer.fetch_ok(plane, "after-flood", range(4), timeout=30.0)
    hostile.react("session closed by the violation budget (disconnect); a new one works")
    hostile.verify()
