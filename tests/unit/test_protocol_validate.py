"""from_dict / to_dict / check_block_indexes: one test (at least) per validation rule.

Each rejection test asserts the error's ``field``, so a rule that is removed,
or that blames the wrong field, makes a test fail.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from p2pfsm.errors import ConfigError, LocalProtocolError, MalformedFrame, UnknownMessageType
from p2pfsm.protocol import (
    DEFAULT_LIMITS,
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    Limits,
    Lookup,
    LookupResp,
    Message,
    TransferDone,
    check_block_indexes,
    from_dict,
    names,
    to_dict,
)


def key(i: int) -> bytes:
    return bytes([i % 256]) * 32 + bytes(4)


# Valid wire dicts, keys in vLLM's order, and the message each must produce.
def samples() -> dict[str, tuple[dict[str, Any], Message]]:
    k3 = [key(1), key(2), key(3)]
    return {
        names.CONNECT: (
            {
                "type": "connect",
                "peer_id": "127.0.0.1:5000",
                "agent_metadata": b"nixlSerDes|Agent",
                "base_addr": 94302290403008,
                "num_blocks": 8,
                "block_len": 4096,
                "config_fingerprint": "2f401c72601e93f9",
                "hash_seed": "vllm-none-hash",
            },
            Connect(
                "127.0.0.1:5000",
                b"nixlSerDes|Agent",
                94302290403008,
                8,
                4096,
                "2f401c72601e93f9",
                "vllm-none-hash",
            ),
        ),
        names.CONNECT_ACK: (
            {"type": "connect_ack", "peer_id": "127.0.0.1:5001"},
            ConnectAck("127.0.0.1:5001"),
        ),
        names.DISCONNECT: ({"type": "disconnect"}, Disconnect()),
        names.FETCH: (
            {
                "type": "fetch",
                "kv_request_id": "req-1",
                "keys": list(k3),
                "block_indexes": [7, 6, 5],
                "round_seq": 0,
            },
            Fetch("req-1", tuple(k3), (7, 6, 5), 0),
        ),
        names.LOOKUP: (
            {"type": "lookup", "kv_request_id": "req-1", "keys": list(k3), "round_seq": 2},
            Lookup("req-1", tuple(k3), 2),
        ),
        names.LOOKUP_RESP: (
            {
                "type": "lookup_resp",
                "kv_request_id": "req-1",
                "keys": list(k3),
                "hits": [True, False, True],
            },
            LookupResp("req-1", tuple(k3), (True, False, True)),
        ),
        names.TRANSFER_DONE: (
            {"type": "transfer_done", "kv_request_id": "req-1", "success": True, "round_seq": 1},
            TransferDone("req-1", True, 1),
        ),
        names.ABORT_FETCH: (
            {"type": "abort_fetch", "kv_request_id": "req-1", "round_seq": 3},
            AbortFetch("req-1", 3),
        ),
        names.ABORT_ACK: (
            {"type": "abort_ack", "kv_request_id": "req-1", "round_seq": 3},
            AbortAck("req-1", 3),
        ),
    }


def wire(type_name: str, **changes: Any) -> dict[str, Any]:
    d = samples()[type_name][0]
    d.update(changes)
    return d


def rejects(obj: object, field: str, limits: Limits = DEFAULT_LIMITS) -> MalformedFrame:
    with pytest.raises(MalformedFrame) as info:
        from_dict(obj, limits)
    assert info.value.field == field, str(info.value)
    return info.value


ALL = sorted(names.ALL_TYPES)
REQUIRED = [(t, f) for t in ALL for f in samples()[t][0] if f not in ("type", "config_fingerprint")]
INT_FIELDS = [
    (names.CONNECT, "base_addr"),
    (names.CONNECT, "num_blocks"),
    (names.CONNECT, "block_len"),
    (names.FETCH, "round_seq"),
    (names.LOOKUP, "round_seq"),
    (names.TRANSFER_DONE, "round_seq"),
    (names.ABORT_FETCH, "round_seq"),
    (names.ABORT_ACK, "round_seq"),
]
ROUND_SEQ_TYPES = [t for t, f in INT_FIELDS if f == "round_seq"]
KEYED_TYPES = [names.FETCH, names.LOOKUP, names.LOOKUP_RESP]
TEXT_FIELDS = [
    (names.CONNECT, "peer_id"),
    (names.CONNECT, "hash_seed"),
    (names.CONNECT_ACK, "peer_id"),
] + [(t, "kv_request_id") for t in ALL if "kv_request_id" in samples()[t][0]]


# --- valid frames---


@pytest.mark.parametrize("type_name", ALL)
def test_sample_parses_to_its_message(type_name: str) -> None:
    d, msg = samples()[type_name]
    assert from_dict(d) == msg
    assert type_name == from_dict(d).TYPE


@pytest.mark.parametrize("type_name", ALL)
def test_to_dict_gives_the_wire_map_in_vllm_order(type_name: str) -> None:
    d, msg = samples()[type_name]
    out = to_dict(msg)
    assert out == d
    assert list(out) == list(d)  # key order, which fixes the encoded bytes
    assert all(type(v) is not tuple for v in out.values())


def test_to_dict_rejects_a_non_message() -> None:
    with pytest.raises(LocalProtocolError):
        to_dict({"type": "disconnect"})  # type: ignore[arg-type]


def test_extra_fields_are_ignored() -> None:
    d, msg = samples()[names.FETCH]
    d["epoch"] = 7
    d["future"] = {"nested": [1, 2, [3]]}
    assert from_dict(d) == msg


def test_tuples_are_accepted_as_arrays() -> None:
    d, msg = samples()[names.LOOKUP_RESP]
    d["keys"] = tuple(d["keys"])
    d["hits"] = tuple(d["hits"])
    assert from_dict(d) == msg


def test_missing_config_fingerprint_reads_as_empty() -> None:
    d, msg = samples()[names.CONNECT]
    del d["config_fingerprint"]
    assert isinstance(msg, Connect)
    assert from_dict(d) == dataclasses.replace(msg, config_fingerprint="")


def test_empty_fingerprint_and_metadata_are_accepted() -> None:
    got = from_dict(wire(names.CONNECT, config_fingerprint="", agent_metadata=b""))
    assert isinstance(got, Connect)
    assert got.config_fingerprint == ""
    assert got.agent_metadata == b""


def test_terminal_fetch() -> None:
    got = from_dict(wire(names.FETCH, keys=[], block_indexes=[]))
    assert isinstance(got, Fetch)
    assert got.is_terminal
    assert not from_dict(wire(names.FETCH)).is_terminal  # type: ignore[union-attr]


def test_empty_lookup_and_lookup_resp_are_accepted() -> None:
    assert from_dict(wire(names.LOOKUP, keys=[])) == Lookup("req-1", (), 2)
    assert from_dict(wire(names.LOOKUP_RESP, keys=[], hits=[])) == LookupResp("req-1", (), ())


# --- the frame as a whole---


@pytest.mark.parametrize("obj", [[], "disconnect", None, b"\x80", 3, [("type", "disconnect")]])
def test_non_dict_is_rejected(obj: object) -> None:
    rejects(obj, "")


@pytest.mark.parametrize("bad_key", [b"type", 1, None, (1,)])
def test_non_str_map_key_is_rejected(bad_key: object) -> None:
    rejects({"type": "disconnect", bad_key: 1}, "")


def test_missing_type() -> None:
    e = rejects({"peer_id": "x"}, "type")
    assert not isinstance(e, UnknownMessageType)
    assert "missing" in str(e)


@pytest.mark.parametrize("value", [None, 1, True, b"fetch", ["fetch"]])
def test_non_str_type(value: object) -> None:
    e = rejects({"type": value}, "type")
    assert not isinstance(e, UnknownMessageType)
    assert "expected str" in str(e)


@pytest.mark.parametrize("value", ["", "Fetch", "fetch ", "hello", "x" * 5000])
def test_unknown_type(value: str) -> None:
    with pytest.raises(UnknownMessageType) as info:
        from_dict({"type": value})
    assert info.value.field == "type"
    assert len(str(info.value)) < 120  # a long type string is not echoed whole


# --- presence and exact types---


@pytest.mark.parametrize(("type_name", "field"), REQUIRED)
def test_missing_field(type_name: str, field: str) -> None:
    d = wire(type_name)
    del d[field]
    assert "missing" in str(rejects(d, field))


@pytest.mark.parametrize(("type_name", "field"), INT_FIELDS)
@pytest.mark.parametrize("value", [True, False])
def test_bool_is_not_an_int(type_name: str, field: str, value: bool) -> None:
    e = rejects(wire(type_name, **{field: value}), field)
    assert str(e) == f"{field}: expected int, got bool"


@pytest.mark.parametrize(("type_name", "field"), INT_FIELDS)
@pytest.mark.parametrize("value", [1.0, float("nan"), "1", None, b"\x01"])
def test_non_int_is_not_an_int(type_name: str, field: str, value: object) -> None:
    rejects(wire(type_name, **{field: value}), field)


def test_bool_as_block_index() -> None:
    d = wire(names.FETCH, keys=[key(i) for i in range(5)], block_indexes=[0, 1, 2, True, 4])
    assert str(rejects(d, "block_indexes[3]")) == "block_indexes[3]: expected int, got bool"


@pytest.mark.parametrize("value", [1.0, "3", None, [3]])
def test_non_int_block_index(value: object) -> None:
    rejects(wire(names.FETCH, block_indexes=[0, value, 2]), "block_indexes[1]")


@pytest.mark.parametrize("value", [1, 0, None, "true"])
def test_int_is_not_a_hit(value: object) -> None:
    e = rejects(wire(names.LOOKUP_RESP, hits=[True, value, False]), "hits[1]")
    assert "expected bool" in str(e)


@pytest.mark.parametrize("value", [1, 0, None, "true"])
def test_success_must_be_bool(value: object) -> None:
    rejects(wire(names.TRANSFER_DONE, success=value), "success")


@pytest.mark.parametrize("type_name", KEYED_TYPES)
@pytest.mark.parametrize("bad", ["a" * 36, bytearray(36), memoryview(bytes(36)), 5, None])
def test_key_must_be_bytes(type_name: str, bad: object) -> None:
    keys = [key(0), key(1), bad]
    e = rejects(wire(type_name, keys=keys), "keys[2]")
    assert "expected bytes" in str(e)


@pytest.mark.parametrize("type_name", KEYED_TYPES)
@pytest.mark.parametrize("bad", [b"k" * 36, "keys", None, {"a": 1}, 3])
def test_keys_must_be_an_array(type_name: str, bad: object) -> None:
    rejects(wire(type_name, keys=bad), "keys")


@pytest.mark.parametrize(
    ("field", "type_name"), [("block_indexes", names.FETCH), ("hits", names.LOOKUP_RESP)]
)
@pytest.mark.parametrize("bad", [b"\x00\x01\x02", None, 3, {"0": 0}])
def test_parallel_list_must_be_an_array(field: str, type_name: str, bad: object) -> None:
    rejects(wire(type_name, **{field: bad}), field)


def test_metadata_must_be_bytes() -> None:
    rejects(wire(names.CONNECT, agent_metadata="nixlSerDes"), "agent_metadata")
    rejects(wire(names.CONNECT, agent_metadata=[1, 2]), "agent_metadata")


@pytest.mark.parametrize(
    ("type_name", "field"), [*TEXT_FIELDS, (names.CONNECT, "config_fingerprint")]
)
@pytest.mark.parametrize("bad", [b"abc", 1, None, ["a"]])
def test_text_must_be_str(type_name: str, field: str, bad: object) -> None:
    rejects(wire(type_name, **{field: bad}), field)


# --- equal lengths---


@pytest.mark.parametrize("indexes", [[0, 1], [0, 1, 2, 3], []])
def test_keys_and_block_indexes_lengths_must_match(indexes: list[int]) -> None:
    e = rejects(wire(names.FETCH, block_indexes=indexes), "block_indexes")
    assert "keys has 3" in str(e)


@pytest.mark.parametrize("hits", [[True, True], [True, True, True, True], []])
def test_keys_and_hits_lengths_must_match(hits: list[bool]) -> None:
    rejects(wire(names.LOOKUP_RESP, hits=hits), "hits")


# --- bounds---


def test_block_index_bounds() -> None:
    top = DEFAULT_LIMITS.max_block_index
    assert top == 2**31 - 1
    assert from_dict(wire(names.FETCH, block_indexes=[0, 1, top])) is not None
    rejects(wire(names.FETCH, block_indexes=[0, top + 1, 1]), "block_indexes[1]")
    rejects(wire(names.FETCH, block_indexes=[0, 1, -1]), "block_indexes[2]")
    rejects(wire(names.FETCH, block_indexes=[0, 1, 2**64]), "block_indexes[2]")


def test_block_index_bound_follows_limits() -> None:
    limits = Limits(max_block_index=10)
    assert from_dict(wire(names.FETCH, block_indexes=[10, 1, 2]), limits) is not None
    rejects(wire(names.FETCH, block_indexes=[11, 1, 2]), "block_indexes[0]", limits)


@pytest.mark.parametrize("type_name", ROUND_SEQ_TYPES)
def test_round_seq_bounds(type_name: str) -> None:
    assert from_dict(wire(type_name, round_seq=2**64 - 1)) is not None
    rejects(wire(type_name, round_seq=2**64), "round_seq")
    rejects(wire(type_name, round_seq=-1), "round_seq")
    limits = Limits(max_round_seq=5)
    assert from_dict(wire(type_name, round_seq=5), limits) is not None
    rejects(wire(type_name, round_seq=6), "round_seq", limits)


def test_huge_int_is_reported_without_printing_it() -> None:
    e = rejects(wire(names.ABORT_ACK, round_seq=10**5000), "round_seq")
    assert len(str(e)) < 120


def test_base_addr_bounds() -> None:
    c = names.CONNECT
    rejects(wire(c, base_addr=-1), "base_addr")
    rejects(wire(c, base_addr=2**64), "base_addr")
    end_ok = 2**64 - 1 - 8 * 4096  # region ends at 2**64 - 1
    assert from_dict(wire(c, base_addr=end_ok)) is not None
    e = rejects(wire(c, base_addr=end_ok + 1), "block_len")
    assert "overflows" in str(e)
    rejects(wire(c, base_addr=0, num_blocks=2**31, block_len=2**33), "block_len")


def test_num_blocks_bounds() -> None:
    c = names.CONNECT
    rejects(wire(c, num_blocks=0), "num_blocks")
    rejects(wire(c, num_blocks=-3), "num_blocks")
    assert from_dict(wire(c, num_blocks=2**31, base_addr=0)) is not None
    rejects(wire(c, num_blocks=2**31 + 1, base_addr=0), "num_blocks")
    rejects(wire(c, num_blocks=9), "num_blocks", Limits(max_num_blocks=8))


# connect's optional ``layout`` (p2pfsm only): 8 blocks of 4096 bytes as two regions.
TWO_REGIONS = [[94302290403008, 2048, 2048], [94302290503008, 4096, 2048]]


def test_a_layout_is_read_as_region_triples_and_written_back() -> None:
    raw = wire(names.CONNECT, layout=TWO_REGIONS)
    msg = from_dict(raw)
    assert isinstance(msg, Connect)
    assert msg.layout == ((94302290403008, 2048, 2048), (94302290503008, 4096, 2048))
    assert to_dict(msg)["layout"] == [tuple(r) for r in TWO_REGIONS]
    assert from_dict(to_dict(msg)) == msg


def test_a_connect_without_a_layout_has_none_and_writes_none() -> None:
    msg = from_dict(wire(names.CONNECT))
    assert isinstance(msg, Connect) and msg.layout is None
    assert "layout" not in to_dict(msg)


@pytest.mark.parametrize(("layout", "field", "words"), [
    ("regions", "layout", "expected array"),
    ([], "layout", "needs 1 to"),
    ([[94302290403008, 4096]], "layout[0]", "expected [base_addr"),
    ([[94302290403008, 4096, 4096], 7], "layout[1]", "expected [base_addr"),
    ([[94302290403008, 4096, True]], "layout[0]", "expected int"),
    ([[94302290403008, 0, 4096]], "layout[0]", ">= 1"),
    ([[94302290403008, 2048, 4096]], "layout[0]", "<= 2048"),  # slices overlap
    ([[94302290403008, 4096, 0]], "layout[0]", ">= 1"),
    ([[94302290403008, 2048, 2048], [2**64 - 4096, 4096, 2048]], "layout[1]", "overflows"),
    ([[94302290403009, 4096, 4096]], "layout", "base_addr"),
    ([[94302290403008, 2048, 2048], [7, 2048, 1024]], "layout", "sum to block_len"),
])
def test_a_malformed_layout_is_rejected(layout: object, field: str, words: str) -> None:
    e = rejects(wire(names.CONNECT, layout=layout), field)
    assert words in str(e)


@pytest.mark.parametrize(("layout", "reason"), [
    ([[94302290403009, 4096, 4096]], "region 0 does not start at base_addr"),
    ([[94302290403008, 2048, 2048], [7, 2048, 1024]], "the slices do not sum to block_len"),
])
def test_a_layout_that_disagrees_with_its_connect_says_how(layout: object, reason: str) -> None:
    assert rejects(wire(names.CONNECT, layout=layout), "layout").reason == reason


def test_layout_region_count_follows_limits() -> None:
    four = [[94302290403008 + 1024 * i, 4096, 1024] for i in range(4)]
    assert from_dict(wire(names.CONNECT, layout=four), Limits(max_layout_regions=4))
    rejects(wire(names.CONNECT, layout=four), "layout", Limits(max_layout_regions=3))


def test_layout_names_are_read_and_written_back_in_layout_order() -> None:
    raw = wire(names.CONNECT, layout=TWO_REGIONS, layout_names=["L0.V", "L0.K"])
    msg = from_dict(raw)
    assert isinstance(msg, Connect) and msg.layout_names == ("L0.V", "L0.K")
    assert to_dict(msg)["layout_names"] == ["L0.V", "L0.K"]
    assert from_dict(to_dict(msg)) == msg
    plain = from_dict(wire(names.CONNECT, layout_names=["kv"]))  # the plain region, named
    assert isinstance(plain, Connect) and plain.layout is None and plain.layout_names == ("kv",)
    assert "layout_names" not in to_dict(from_dict(wire(names.CONNECT, layout=TWO_REGIONS)))


@pytest.mark.parametrize(("layout_names", "field", "words"), [
    ("L0.K", "layout_names", "expected array"),
    (["L0.K"], "layout_names", "1 names for 2 regions"),
    (["L0.K", "L0.V", "L1.K"], "layout_names", "3 names for 2 regions"),
    (["L0.K", ""], "layout_names[1]", "must not be empty"),
    (["L0.K", 7], "layout_names[1]", "expected str"),
    (["L0.K", "L0.K"], "layout_names", "appears twice"),
])
def test_malformed_layout_names_are_rejected(layout_names: object, field: str,
                                             words: str) -> None:
    e = rejects(wire(names.CONNECT, layout=TWO_REGIONS, layout_names=layout_names), field)
    assert words in str(e)


def test_block_len_must_be_positive() -> None:
    rejects(wire(names.CONNECT, block_len=0), "block_len")
    rejects(wire(names.CONNECT, block_len=-4096), "block_len")


@pytest.mark.parametrize("type_name", KEYED_TYPES)
def test_list_length_bound(type_name: str) -> None:
    limits = Limits(max_list_items=4)
    n_ok = [key(i) for i in range(4)]
    extra: dict[str, Any] = {}
    if type_name == names.FETCH:
        extra["block_indexes"] = list(range(4))
    if type_name == names.LOOKUP_RESP:
        extra["hits"] = [True] * 4
    assert from_dict(wire(type_name, keys=n_ok, **extra), limits) is not None
    e = rejects(wire(type_name, keys=[*n_ok, key(9)], **extra), "keys", limits)
    assert "more than 4" in str(e)


@pytest.mark.parametrize(
    ("field", "type_name", "item"),
    [("block_indexes", names.FETCH, 0), ("hits", names.LOOKUP_RESP, True)],
)
def test_parallel_list_length_bound(field: str, type_name: str, item: object) -> None:
    limits = Limits(max_list_items=3)
    e = rejects(wire(type_name, **{field: [item] * 4}), field, limits)
    assert "more than 3" in str(e)


@pytest.mark.parametrize("type_name", KEYED_TYPES)
def test_key_size_bounds(type_name: str) -> None:
    limits = Limits(max_key_bytes=36)
    assert from_dict(wire(type_name), limits) is not None  # keys are exactly 36 bytes
    rejects(wire(type_name, keys=[key(0), b"", key(2)]), "keys[1]")
    rejects(wire(type_name, keys=[key(0), key(1), b"k" * 37]), "keys[2]", limits)
    big = DEFAULT_LIMITS.max_key_bytes
    assert from_dict(wire(type_name, keys=[key(0), key(1), b"k" * big])) is not None
    rejects(wire(type_name, keys=[key(0), key(1), b"k" * (big + 1)]), "keys[2]")


@pytest.mark.parametrize(("type_name", "field"), TEXT_FIELDS)
def test_text_must_not_be_empty(type_name: str, field: str) -> None:
    assert "empty" in str(rejects(wire(type_name, **{field: ""}), field))


@pytest.mark.parametrize(
    ("type_name", "field"), [*TEXT_FIELDS, (names.CONNECT, "config_fingerprint")]
)
def test_text_length_bound(type_name: str, field: str) -> None:
    top = DEFAULT_LIMITS.max_str_len
    assert from_dict(wire(type_name, **{field: "a" * top})) is not None
    rejects(wire(type_name, **{field: "a" * (top + 1)}), field)
    # The bound is in UTF-8 bytes, as on the wire: 2 bytes per "é".
    assert from_dict(wire(type_name, **{field: "é" * (top // 2)})) is not None
    rejects(wire(type_name, **{field: "é" * (top // 2) + "a"}), field)
    limits = Limits(max_str_len=20)
    rejects(wire(type_name, **{field: "a" * 21}), field, limits)


@pytest.mark.parametrize(("type_name", "field"), TEXT_FIELDS)
def test_text_must_be_utf8_encodable(type_name: str, field: str) -> None:
    rejects(wire(type_name, **{field: "ab\ud800"}), field)


def test_metadata_size_bound() -> None:
    limits = Limits(max_metadata_bytes=16)
    assert from_dict(wire(names.CONNECT, agent_metadata=b"m" * 16), limits) is not None
    rejects(wire(names.CONNECT, agent_metadata=b"m" * 17), "agent_metadata", limits)


# --- check_block_indexes---


def test_check_block_indexes() -> None:
    fetch = Fetch("r", (key(0), key(1), key(2)), (3, 9, 1), 0)
    check_block_indexes(fetch, 10)
    with pytest.raises(MalformedFrame) as info:
        check_block_indexes(fetch, 9)
    assert info.value.field == "block_indexes[1]"
    with pytest.raises(MalformedFrame) as info:
        check_block_indexes(fetch, 2)
    assert info.value.field == "block_indexes[0]"
    check_block_indexes(Fetch("r", (), (), 0), 0)


# --- Limits, names and the message classes---


def test_default_limits() -> None:
    assert Limits() == DEFAULT_LIMITS
    assert DEFAULT_LIMITS.max_frame_bytes == 64 * 2**20 + 64 * 2**10
    assert DEFAULT_LIMITS.max_list_items == 65536
    assert DEFAULT_LIMITS.max_key_bytes == 4096
    assert DEFAULT_LIMITS.max_str_len == 4096
    assert DEFAULT_LIMITS.max_metadata_bytes == 64 * 2**20
    assert DEFAULT_LIMITS.max_num_blocks == 2**31
    assert DEFAULT_LIMITS.max_round_seq == 2**64 - 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_limits_reject_nonsense(bad: Any) -> None:
    with pytest.raises(ConfigError):
        Limits(max_list_items=bad)


def test_names() -> None:
    assert names.TYPE_KEY == "type"
    assert len(names.ALL_TYPES) == 9
    assert {msg.TYPE for _, msg in samples().values()} == names.ALL_TYPES
    assert (Connect.TYPE, ConnectAck.TYPE, Disconnect.TYPE) == (
        "connect",
        "connect_ack",
        "disconnect",
    )
    assert (Fetch.TYPE, Lookup.TYPE, LookupResp.TYPE) == ("fetch", "lookup", "lookup_resp")
    assert (TransferDone.TYPE, AbortFetch.TYPE, AbortAck.TYPE) == (
        "transfer_done",
        "abort_fetch",
        "abort_ack",
    )


@pytest.mark.parametrize("type_name", ALL)
def test_messages_are_frozen_and_slotted(type_name: str) -> None:
    msg = samples()[type_name][1]
    assert not hasattr(msg, "__dict__")
    for f in dataclasses.fields(msg):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(msg, f.name, None)
    assert hash(msg) == hash(samples()[type_name][1])


def test_a_frame_that_is_no_map_or_names_an_empty_id_says_so() -> None:
    assert rejects([1], "").reason == "expected a map, got list"
    assert rejects(wire(names.FETCH, kv_request_id=""), "kv_request_id").reason == (
        "must not be empty")


def _session_config(layout: object, region_names: object) -> object:
    from p2pfsm.session.config import SessionConfig

    peer = wire(names.CONNECT)
    return SessionConfig("127.0.0.1:1", b"ours", 94302290403008, 8, 4096,
                         hash_seed=peer["hash_seed"],  # type: ignore[arg-type]
                         config_fingerprint=peer["config_fingerprint"],  # type: ignore[arg-type]
                         layout=layout, layout_names=region_names)  # type: ignore[arg-type]


def test_named_regions_pair_by_name_in_the_handshake() -> None:
    from p2pfsm.session.machine import handshake_mismatch

    ours = _session_config(tuple(map(tuple, TWO_REGIONS)), ("L0.K", "L0.V"))
    swapped = [[94302290403008, 2048, 2048], [94302290503008, 4096, 2048]]
    peer = from_dict(wire(names.CONNECT, layout=swapped, layout_names=["L0.V", "L0.K"]))
    assert isinstance(peer, Connect)
    assert handshake_mismatch(ours, peer) is None  # type: ignore[arg-type]
    other = from_dict(wire(names.CONNECT, layout=swapped, layout_names=["L0.V", "L1.K"]))
    assert isinstance(other, Connect)
    mismatch = handshake_mismatch(ours, other)  # type: ignore[arg-type]
    assert mismatch is not None and mismatch.field == "layout_names"
    assert mismatch.ours == "names the peer lacks: [L0.K]"
    assert mismatch.theirs == "names we lack: [L1.K]"


def test_a_session_config_needs_one_distinct_name_per_region() -> None:
    from p2pfsm.errors import ConfigError

    for bad in (("kv",), ("a", "a"), ("a", ""), ["a", "b"]):
        with pytest.raises(ConfigError, match="layout_names"):
            _session_config(tuple(map(tuple, TWO_REGIONS)), bad)


def test_config_digests_round_trip_and_bad_ones_are_rejected() -> None:
    raw = wire(names.CONNECT, config_digests=[["dtype", "ab12"], ["model", "cd34"]])
    msg = from_dict(raw)
    assert isinstance(msg, Connect)
    assert msg.config_digests == (("dtype", "ab12"), ("model", "cd34"))
    assert from_dict(to_dict(msg)) == msg
    for bad, field in ((7, "config_digests"), ([["dtype"]], "config_digests[0]"),
                       ([["", "x"]], "config_digests[0]"),
                       ([["a", "x"], ["a", "y"]], "config_digests")):
        rejects(wire(names.CONNECT, config_digests=bad), field)


def test_a_fingerprint_mismatch_names_the_model_config_fields_that_differ() -> None:
    import dataclasses

    from p2pfsm.executor.node.config import config_digests, fingerprint
    from p2pfsm.session.machine import handshake_mismatch

    ours_cfg = {"model": "m", "dtype": "bf16", "tp": 1}
    theirs_cfg = {"model": "m", "dtype": "fp16", "pp": 2}
    base = _session_config(None, None)
    ours = dataclasses.replace(base, config_fingerprint=fingerprint(ours_cfg),  # type: ignore[type-var]
                               config_digests=config_digests(ours_cfg))
    peer = from_dict(wire(names.CONNECT, config_fingerprint=fingerprint(theirs_cfg),
                          config_digests=[list(p) for p in config_digests(theirs_cfg) or ()]))
    assert isinstance(peer, Connect)
    mismatch = handshake_mismatch(ours, peer)  # type: ignore[arg-type]
    assert mismatch is not None and mismatch.field == "config_fingerprint"
    assert "fields that differ: dtype; only ours: tp; only the peer's: pp" in str(mismatch)
    vllm_like = dataclasses.replace(peer, config_digests=None)
    said = str(handshake_mismatch(ours, vllm_like))  # type: ignore[arg-type]
    assert "of model_config fields dtype, model, tp; the peer sends only its hash" in said
