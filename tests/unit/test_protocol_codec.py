"""encode / decode: exact bytes, round trips, and hostile input.

Rejections by the msgpack layer blame field "" (the bytes are bad); rejections
by validation name the field.
"""

from __future__ import annotations

import ast
import contextlib
import time
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pfsm.errors import MalformedFrame, UnknownMessageType
from p2pfsm.protocol import (
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    FetchRound,
    Limits,
    Lookup,
    LookupResp,
    Message,
    TransferDone,
    decode,
    encode,
    fetch_round,
    to_dict,
)

PROTOCOL_DIR = Path(__file__).resolve().parents[2] / "p2pfsm" / "protocol"


def pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def key(i: int) -> bytes:
    return bytes([i % 256]) * 32 + bytes(4)


def rejects(frame: bytes, field: str, limits: Limits | None = None) -> MalformedFrame:
    with pytest.raises(MalformedFrame) as info:
        decode(frame) if limits is None else decode(frame, limits)
    assert info.value.field == field, str(info.value)
    return info.value


# --- strategies---

ids = st.text(min_size=1, max_size=40)
keys_st = st.binary(min_size=1, max_size=64)
round_seq = st.integers(0, 2**64 - 1)


@st.composite
def connects(draw: st.DrawFn) -> Connect:
    num_blocks = draw(st.integers(1, 2**31))
    block_len = draw(st.integers(1, 2**32))
    base_addr = draw(st.integers(0, 2**64 - 1 - num_blocks * block_len))
    return Connect(
        peer_id=draw(ids),
        agent_metadata=draw(st.binary(max_size=600)),
        base_addr=base_addr,
        num_blocks=num_blocks,
        block_len=block_len,
        config_fingerprint=draw(st.text(max_size=20)),
        hash_seed=draw(ids),
    )


@st.composite
def fetches(draw: st.DrawFn) -> Fetch:
    n = draw(st.integers(0, 40))
    ks = draw(st.lists(keys_st, min_size=n, max_size=n))
    idx = draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n))
    return Fetch(draw(ids), tuple(ks), tuple(idx), draw(round_seq))


@st.composite
def lookup_resps(draw: st.DrawFn) -> LookupResp:
    n = draw(st.integers(0, 40))
    ks = draw(st.lists(keys_st, min_size=n, max_size=n))
    hits = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return LookupResp(draw(ids), tuple(ks), tuple(hits))


messages: st.SearchStrategy[Message] = st.one_of(
    connects(),
    st.builds(ConnectAck, ids),
    st.just(Disconnect()),
    fetches(),
    st.builds(Lookup, ids, st.lists(keys_st, max_size=40).map(tuple), round_seq),
    lookup_resps(),
    st.builds(TransferDone, ids, st.booleans(), round_seq),
    st.builds(AbortFetch, ids, round_seq),
    st.builds(AbortAck, ids, round_seq),
)


@given(messages)
@settings(max_examples=400)
def test_round_trip(msg: Message) -> None:
    frame = encode(msg)
    assert decode(frame) == msg
    assert encode(decode(frame)) == frame
    assert list(msgpack.unpackb(frame)) == list(to_dict(msg))


@pytest.mark.parametrize(
    "msg",
    [
        Connect("127.0.0.1:1", b"m" * 486, 2**64 - 1 - 4096, 1, 4096, "", "vllm-none-hash"),
        ConnectAck("127.0.0.1:50769"),
        Disconnect(),
        Fetch("r", (), (), 0),
        Fetch("r", tuple(key(i) for i in range(300)), tuple(range(300)), 2**64 - 1),
        Lookup("r", (key(1),), 1),
        LookupResp("r", (key(1), key(2)), (False, True)),
        TransferDone("r", False, 0),
        AbortFetch("r", 0),
        AbortAck("r", 0),
    ],
    ids=lambda m: type(m).__name__,
)
def test_each_type_round_trips(msg: Message) -> None:
    assert decode(encode(msg)) == msg


# --- exact bytes (as vLLM 0.33.0 writes them) -----------------------------------------------------


def test_disconnect_bytes() -> None:
    assert encode(Disconnect()) == bytes.fromhex("81a474797065aa646973636f6e6e656374")


def test_connect_ack_bytes() -> None:
    expected = b"\x82\xa4type\xabconnect_ack\xa7peer_id\xaf127.0.0.1:50769"
    assert encode(ConnectAck("127.0.0.1:50769")) == expected


def test_lookup_resp_bytes() -> None:
    k = bytes(range(36))
    frame = encode(LookupResp("r", (k, k), (False, False)))
    assert frame == (
        b"\x84\xa4type\xablookup_resp\xadkv_request_id\xa1r"
        b"\xa4keys\x92\xc4\x24" + k + b"\xc4\x24" + k + b"\xa4hits\x92\xc2\xc2"
    )


@pytest.mark.parametrize(
    ("value", "tail"),
    [
        (0, b"\x00"),
        (127, b"\x7f"),
        (128, b"\xcc\x80"),
        (255, b"\xcc\xff"),
        (256, b"\xcd\x01\x00"),
        (65536, b"\xce\x00\x01\x00\x00"),
        (2**32, b"\xcf\x00\x00\x00\x01\x00\x00\x00\x00"),
        (2**64 - 1, b"\xcf" + b"\xff" * 8),
    ],
)
def test_ints_use_the_smallest_encoding(value: int, tail: bytes) -> None:
    assert encode(AbortAck("r", value)).endswith(b"\xa9round_seq" + tail)


def test_arrays_become_array16_past_15_items() -> None:
    frame = encode(Fetch("r", tuple(key(i) for i in range(16)), tuple(range(16)), 0))
    assert b"\xa4keys\xdc\x00\x10\xc4\x24" in frame
    assert b"\xadblock_indexes\xdc\x00\x10\x00\x01" in frame


def test_non_canonical_encodings_are_accepted() -> None:
    # A peer may use wider ints or str8 for short strings; the values are what count.
    frame = (
        b"\x83\xa4type\xd9\x09abort_ack\xadkv_request_id\xa1r"
        b"\xa9round_seq\xcf\x00\x00\x00\x00\x00\x00\x00\x05"
    )
    assert decode(frame) == AbortAck("r", 5)


def test_bytes_like_frames_are_accepted() -> None:
    frame = encode(TransferDone("r", True, 3))
    assert decode(bytearray(frame)) == TransferDone("r", True, 3)
    assert decode(memoryview(frame)) == TransferDone("r", True, 3)


# --- frame size---


def test_frame_size_is_checked_before_unpacking() -> None:
    frame = encode(ConnectAck("p" * 40))
    limits = Limits(max_frame_bytes=len(frame))
    assert decode(frame, limits) == ConnectAck("p" * 40)
    e = rejects(frame + b"\x00", "", limits)
    assert "max_frame_bytes" in str(e)  # not "trailing bytes": size comes first
    e = rejects(b"\xc1" * (len(frame) + 1), "", limits)
    assert "max_frame_bytes" in str(e)


def test_default_frame_limit() -> None:
    limit = Limits().max_frame_bytes
    e = rejects(b"\x00" * (limit + 1), "")
    assert "max_frame_bytes" in str(e)


# --- malformed bytes---


def test_trailing_bytes() -> None:
    assert "trailing" in str(rejects(encode(Disconnect()) + b"\xc0", ""))
    assert "trailing" in str(rejects(encode(Disconnect()) * 2, ""))


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",
        b"\x81",
        b"\x81\xa4typ",
        b"\xff\xff\xff",
        b"\x84\xa4type\xa5fetch",
        bytes(range(256)),
    ],
)
def test_garbage_and_truncated_frames(frame: bytes) -> None:
    rejects(frame, "")


def test_every_truncation_of_a_frame_is_rejected() -> None:
    frame = encode(Fetch("r", (key(1), key(2)), (1, 2), 0))
    for n in range(len(frame)):
        rejects(frame[:n], "")


@given(st.binary(max_size=200))
@settings(max_examples=500)
def test_random_bytes_raise_only_malformed_frame(frame: bytes) -> None:
    with contextlib.suppress(MalformedFrame):
        decode(frame)


@pytest.mark.parametrize(
    "top", [[1, 2], "disconnect", None, 7, True, b"\x80", [{"type": "disconnect"}]]
)
def test_non_map_top(top: object) -> None:
    assert "expected a map" in str(rejects(pack(top), ""))


def test_deep_nesting_is_rejected() -> None:
    e = rejects(b"\x91" * 100_000 + b"\xc0", "")
    assert "nested" in str(e)
    inner = b"\x91" * 5000 + b"\xc0"
    frame = b"\x82\xa4type\xaadisconnect\xa1x" + inner
    rejects(frame, "")


def test_moderate_nesting_in_an_unknown_field_is_ignored() -> None:
    inner = b"\x91" * 500 + b"\xc0"
    frame = b"\x82\xa4type\xaadisconnect\xa1x" + inner
    assert decode(frame) == Disconnect()


def test_nested_array_as_key_is_rejected() -> None:
    frame = pack({"type": "lookup", "kv_request_id": "r", "keys": [[key(1)]], "round_seq": 0})
    rejects(frame, "keys[0]")


def test_array_header_larger_than_the_frame_fails_fast() -> None:
    # 1000 nested array16(65535) headers in 3 KB: without clamping the limits to the
    # frame length msgpack preallocates each list (about 0.1-0.3 s of CPU per frame).
    frame = b"\x82\xa4type\xaadisconnect\xa1x" + b"\xdc\xff\xff" * 1000
    start = time.perf_counter()
    e = rejects(frame, "")
    assert time.perf_counter() - start < 0.05
    assert "max_array_len" in str(e)


def test_list_limit_applies_while_unpacking() -> None:
    limits = Limits(max_list_items=4)
    frame = pack(
        {"type": "lookup", "kv_request_id": "r", "keys": [key(i) for i in range(5)], "round_seq": 0}
    )
    assert "max_array_len" in str(rejects(frame, "", limits))
    ok = pack(
        {"type": "lookup", "kv_request_id": "r", "keys": [key(i) for i in range(4)], "round_seq": 0}
    )
    assert decode(ok, limits) == Lookup("r", tuple(key(i) for i in range(4)), 0)


def test_string_limit_applies_while_unpacking() -> None:
    limits = Limits(max_str_len=16)
    assert "max_str_len" in str(rejects(encode(ConnectAck("p" * 17)), "", limits))
    assert decode(encode(ConnectAck("p" * 16)), limits) == ConnectAck("p" * 16)


def test_bin_limit_applies_while_unpacking() -> None:
    limits = Limits(max_metadata_bytes=16, max_key_bytes=8)
    c = Connect("p", b"m" * 17, 0, 1, 1, "", "s")
    assert "max_bin_len" in str(rejects(encode(c), "", limits))
    # A 9-byte key fits the bin bound (16) but not max_key_bytes: validation names it.
    rejects(encode(Lookup("r", (b"k" * 9,), 0)), "keys[0]", limits)


def test_metadata_limit_by_validation() -> None:
    # The bin bound is max(metadata, key) = 32 here, so validation catches 17 bytes.
    limits = Limits(max_metadata_bytes=16, max_key_bytes=32)
    rejects(encode(Connect("p", b"m" * 17, 0, 1, 1, "", "s")), "agent_metadata", limits)


def test_map_size_is_bounded() -> None:
    ok = {"type": "disconnect", **{f"x{i}": 0 for i in range(63)}}
    assert decode(pack(ok)) == Disconnect()
    rejects(pack({**ok, "x63": 0}), "")


def test_ext_types_are_rejected() -> None:
    rejects(pack({"type": "disconnect", "x": msgpack.ExtType(1, b"abc")}), "")
    rejects(pack({"type": "disconnect", "x": msgpack.Timestamp(1, 0)}), "")


def test_invalid_utf8_is_rejected() -> None:
    rejects(b"\x82\xa4type\xaadisconnect\xa1x\xa2\xff\xfe", "")
    rejects(b"\x81\xa4type\xa2\xff\xfe", "")


def test_int_map_key_is_rejected_while_unpacking() -> None:
    rejects(b"\x82\xa4type\xaadisconnect\x01\x01", "")


def test_bin_map_key_is_rejected_by_validation() -> None:
    rejects(b"\x82\xa4type\xaadisconnect\xc4\x01x\x01", "")


def test_duplicate_map_keys_are_rejected() -> None:
    # msgpack alone keeps the last value, so a peer could hide one type behind another.
    frame = b"\x82\xa4type\xaadisconnect\xa4type\xa5fetch"
    e = rejects(frame, "type")
    assert "duplicate" in str(e)
    nested = b"\x82\xa4type\xaadisconnect\xa1y\x82\xa1a\x01\xa1a\x02"
    rejects(nested, "a")


def test_a_duplicate_key_is_named_when_short_enough() -> None:
    """The reason names the repeated key (not the first), up to 120 characters."""
    for length, field in ((120, "k" * 120), (121, "")):
        key = msgpack.packb("k" * length)
        frame = (b"\x84" + msgpack.packb("type") + msgpack.packb("disconnect")
                 + msgpack.packb("a") + b"\x00" + key + b"\x01" + key + b"\x02")
        e = rejects(frame, field)
        assert "duplicate map key" in str(e)


def test_unknown_type_from_bytes() -> None:
    with pytest.raises(UnknownMessageType) as info:
        decode(pack({"type": "heartbeat", "epoch": 3}))
    assert info.value.field == "type"
    assert isinstance(info.value, MalformedFrame)


def test_validation_errors_name_the_field() -> None:
    frame = pack(
        {
            "type": "fetch",
            "kv_request_id": "r",
            "keys": [key(1)],
            "block_indexes": [True],
            "round_seq": 0,
        }
    )
    assert str(rejects(frame, "block_indexes[0]")) == "block_indexes[0]: expected int, got bool"
    frame = pack({"type": "transfer_done", "kv_request_id": "r", "success": 1, "round_seq": 0})
    rejects(frame, "success")
    frame = pack({"type": "lookup_resp", "kv_request_id": "r", "keys": [key(1)], "hits": [1]})
    rejects(frame, "hits[0]")
    frame = pack({"type": "lookup", "kv_request_id": "r", "keys": ["k"], "round_seq": 0})
    rejects(frame, "keys[0]")
    frame = pack({"type": "abort_ack", "kv_request_id": "r", "round_seq": 1.0})
    rejects(frame, "round_seq")
    frame = pack({"type": "abort_ack", "kv_request_id": "r", "round_seq": -1})
    rejects(frame, "round_seq")


# --- purity---

FORBIDDEN = {
    "zmq",
    "nixl",
    "nixl_cu12",
    "torch",
    "time",
    "random",
    "threading",
    "socket",
    "asyncio",
}


@pytest.mark.parametrize("path", sorted(PROTOCOL_DIR.glob("*.py")), ids=lambda p: p.name)
def test_protocol_is_sans_io(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert not imported & FORBIDDEN
    assert ast.get_docstring(tree)


def test_protocol_modules_exist() -> None:
    assert {p.name for p in PROTOCOL_DIR.glob("*.py")} >= {
        "__init__.py",
        "names.py",
        "messages.py",
        "validate.py",
        "codec.py",
    }


# ---------------------------------------------------------------- a rejected fetch's round
def _fetch_map(**over: object) -> dict[str, object]:
    fields: dict[str, object] = {"type": "fetch", "kv_request_id": "r", "keys": [b"k1", b"k2"],
                                 "block_indexes": [1, 2], "round_seq": 3}
    fields.update(over)
    return fields


@pytest.mark.parametrize("over", [
    {"block_indexes": [1]}, {"keys": "k1"}, {"keys": b"k1"}, {"keys": [b""]},
    {"block_indexes": [True, 2]}, {"block_indexes": {"0": 1}}, {"keys": None},
], ids=["lengths", "keys-str", "keys-bin", "key-empty", "index-bool", "indexes-map",
        "keys-nil"])
def test_a_rejected_fetch_still_names_its_round(over: dict[str, object]) -> None:
    frame = msgpack.packb(_fetch_map(**over), use_bin_type=True)
    with pytest.raises(MalformedFrame):
        decode(frame)
    assert fetch_round(frame) == FetchRound("r", 3)


@pytest.mark.parametrize("over", [
    {"kv_request_id": ""}, {"kv_request_id": 7}, {"round_seq": -1}, {"round_seq": True},
    {"round_seq": "3"}, {"keys": [], "block_indexes": [1]}, {"type": "lookup"},
], ids=["id-empty", "id-int", "round-negative", "round-bool", "round-str", "terminal",
        "not-a-fetch"])
def test_a_rejected_frame_without_a_readable_round_names_none(over: dict[str, object]) -> None:
    assert fetch_round(msgpack.packb(_fetch_map(**over), use_bin_type=True)) is None


def test_a_round_is_read_within_the_limits_given() -> None:
    frame = msgpack.packb(_fetch_map(block_indexes=[1]), use_bin_type=True)
    assert fetch_round(frame) == FetchRound("r", 3)
    assert fetch_round(frame, Limits(max_round_seq=2)) is None


def test_undecodable_bytes_name_no_round() -> None:
    for frame in (b"", b"\xc1", msgpack.packb([1, 2]), msgpack.packb(_fetch_map())[:-2]):
        assert fetch_round(frame) is None
