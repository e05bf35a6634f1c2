"""Frame strategies: valid messages aimed at a session's live ids, then mutated.

A frame is built as a list of map entries ``(key, value)``, serialized by hand so
that a mutation can put raw msgpack bytes anywhere (deep nesting, header bombs,
non-minimal ints, ext types, bad UTF-8) and pick the map header's form. Mutations
act first on the entries (drop, retype, wrong ``type``, extra and duplicate keys,
oversized and mismatched lists, edge ints) and then on the bytes (truncation,
bit flips, inserts, deletes, trailing bytes, splices).

Request ids, round numbers, keys and indexes are drawn mostly from the vocabulary
that ``states.py`` uses to build sessions, so mutated frames hit open rounds,
lookups and handshakes rather than bouncing off unknown ids.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack
from helpers.world import NUM_BLOCKS, PEER_ID, key, peer_connect
from hypothesis import strategies as st

from p2pfsm.protocol import (
    DEFAULT_LIMITS,
    AbortAck,
    AbortFetch,
    ConnectAck,
    Disconnect,
    Fetch,
    Lookup,
    LookupResp,
    Message,
    TransferDone,
    encode,
    to_dict,
)
from p2pfsm.protocol import names as wire_names

REQUEST_IDS = ("load", "load2", "abrt", "look", "serve", "probe", "pd", "dem", "x")
"""Request ids the built sessions use (see states.py), plus one unknown."""

TYPE_NAMES = (wire_names.CONNECT, wire_names.CONNECT_ACK, wire_names.DISCONNECT,
              wire_names.FETCH, wire_names.LOOKUP, wire_names.LOOKUP_RESP,
              wire_names.TRANSFER_DONE, wire_names.ABORT_FETCH, wire_names.ABORT_ACK)

EDGE_INTS = (0, 1, -1, 2, NUM_BLOCKS - 1, NUM_BLOCKS, 2**31 - 1, 2**31, 2**32, 2**63 - 1,
             2**63, 2**64 - 1, -(2**31), -(2**63))
"""Ints at the edges of every bound the validator applies (msgpack holds -2**63..2**64-1)."""


@dataclass(frozen=True)
class Raw:
    """Bytes spliced into a frame as they are, in place of a packed value."""

    data: bytes


# ------------------------------------------------------------------ vocabulary
request_ids = st.one_of(st.sampled_from(REQUEST_IDS), st.text(min_size=1, max_size=6))
round_seqs = st.one_of(st.sampled_from((0, 0, 1, 2)), st.integers(0, 2**64 - 1))
block_keys = st.one_of(st.sampled_from([key(i) for i in range(12)]),
                       st.binary(min_size=1, max_size=40))
indexes = st.one_of(st.integers(0, NUM_BLOCKS - 1), st.sampled_from((NUM_BLOCKS, 2**31 - 1)))


def _parallel(draw: st.DrawFn, elem: st.SearchStrategy[object]) -> tuple[tuple[bytes, ...],
                                                                        tuple[object, ...]]:
    n = draw(st.integers(0, 6))
    ks = tuple(draw(st.lists(block_keys, min_size=n, max_size=n, unique=True)))
    return ks, tuple(draw(st.lists(elem, min_size=n, max_size=n)))


@st.composite
def fetches(draw: st.DrawFn) -> Fetch:
    ks, idx = _parallel(draw, indexes)
    return Fetch(draw(request_ids), ks, idx, draw(round_seqs))  # type: ignore[arg-type]


@st.composite
def lookup_resps(draw: st.DrawFn) -> LookupResp:
    ks, hits = _parallel(draw, st.booleans())
    return LookupResp(draw(request_ids), ks, hits)  # type: ignore[arg-type]


@st.composite
def connects(draw: st.DrawFn) -> Message:
    over: dict[str, object] = {}
    if draw(st.booleans()):
        name, value = draw(st.sampled_from([
            ("peer_id", "127.0.0.1:7000"), ("peer_id", "other:1"),
            ("agent_metadata", b"agent-local"), ("agent_metadata", b""),
            ("base_addr", 2**64 - 1 - 64 * 16), ("num_blocks", 1), ("num_blocks", 2**31),
            ("block_len", 32), ("config_fingerprint", "fp"), ("hash_seed", "other-seed"),
            # Layouts (p2pfsm only): ours is the plain region, so each is a mismatch.
            ("layout", ((0x9000, 16, 16),)), ("layout", ((0x9000, 32, 16),)),
            ("layout", ((0x9000, 8, 8), (0x9008, 16, 8))),
            # Region names (ours are unnamed, so they pair by position).
            ("layout_names", ("kv",)),
            ("config_digests", (("dtype", "ab12"), ("model", "cd34"))),
        ]))
        over[name] = value
    if "layout_names" not in over and draw(st.booleans()):
        regions = len(over.get("layout") or ((0,),))  # type: ignore[arg-type]
        over["layout_names"] = draw(st.sampled_from([
            tuple(f"L{r}.{half}" for r in range(regions) for half in "KV")[:regions],
            tuple(f"r{r}" for r in reversed(range(regions))),
        ]))
    return peer_connect(**over)


messages: st.SearchStrategy[Message] = st.one_of(
    connects(),
    st.builds(ConnectAck, st.sampled_from((PEER_ID, "127.0.0.1:7000", "z"))),
    st.just(Disconnect()),
    fetches(),
    st.builds(Lookup, request_ids, st.lists(block_keys, max_size=5).map(tuple), round_seqs),
    lookup_resps(),
    st.builds(TransferDone, request_ids, st.booleans(), round_seqs),
    st.builds(AbortFetch, request_ids, round_seqs),
    st.builds(AbortAck, request_ids, round_seqs),
)
"""Valid messages (every field in range), aimed at the built sessions' ids."""


# --------------------------------------------------------------- raw values
def _ints_nonminimal(v: int) -> Raw:
    """``v`` in a wider msgpack int form than needed (legal msgpack)."""
    return Raw(b"\xcf" + v.to_bytes(8, "big") if v >= 0 else b"\xd3" + v.to_bytes(8, "big",
                                                                               signed=True))


HEADER_BOMBS = (
    b"\xdd\xff\xff\xff\xff",  # array32 of 4G items, no items
    b"\xdf\xff\xff\xff\xff",  # map32 of 4G entries
    b"\xdb\xff\xff\xff\xff",  # str32 of 4 GB
    b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GB
    b"\xdc\xff\xff",  # array16 of 65535
    b"\xde\xff\xff",  # map16 of 65535
    b"\xc9\xff\xff\xff\xff\x01",  # ext32
    b"\xd6\xff\x00\x00\x00\x00",  # timestamp32
    b"\xd4\x01\x00",  # fixext1
    b"\xc1",  # never used
    b"\xa2\xff\xfe",  # str with invalid UTF-8
    b"\xa3\xed\xa0\x80",  # UTF-8 encoded lone surrogate
)


@st.composite
def nested(draw: st.DrawFn) -> Raw:
    """Containers nested up to past msgpack's stack limit (1024)."""
    depth = draw(st.sampled_from((2, 3, 50, 511, 1023, 1024, 1025, 3000)))
    kind = draw(st.sampled_from((b"\x91", b"\x81\xa1a", b"\xdc\x00\x01", b"\x92\xc0")))
    tail = draw(st.sampled_from((b"\xc0", b"", b"\x90")))
    return Raw(kind * depth + tail)


scalars = st.one_of(
    st.none(), st.booleans(), st.sampled_from(EDGE_INTS), st.integers(-(2**63), 2**64 - 1),
    st.floats(), st.text(max_size=8), st.binary(max_size=8),
)
any_values = st.one_of(
    scalars,
    st.lists(scalars, max_size=4),
    st.dictionaries(st.text(max_size=3), scalars, max_size=3),
    st.sampled_from(EDGE_INTS).map(_ints_nonminimal),
    st.sampled_from(HEADER_BOMBS).map(Raw),
    nested(),
    st.sampled_from((
        "", "é" * (DEFAULT_LIMITS.max_str_len // 2 + 1), "a" * (DEFAULT_LIMITS.max_str_len + 1),
        "\x00", "a" * DEFAULT_LIMITS.max_str_len,
    )),
    st.sampled_from((b"", b"k" * (DEFAULT_LIMITS.max_key_bytes + 1))),
)
"""Values of every msgpack type, edge ints, long text, bombs and deep nesting."""


def oversized(field: str) -> list[object]:
    """A list one item over ``max_list_items``, of cheap items for ``field``."""
    n = DEFAULT_LIMITS.max_list_items + 1
    item: object = {"keys": b"k", "hits": False}.get(field, 0)
    return [item] * n


# ------------------------------------------------------------ serialization
def _has_raw(v: object) -> bool:
    if isinstance(v, Raw):
        return True
    if isinstance(v, list):
        return any(isinstance(x, Raw | list | dict) and _has_raw(x) for x in v)
    if isinstance(v, dict):
        return any(_has_raw(k) or _has_raw(x) for k, x in v.items())
    return False


def pack_value(v: object) -> bytes:
    if isinstance(v, Raw):
        return v.data
    if not _has_raw(v):
        packed: bytes = msgpack.packb(v, use_bin_type=True)
        return packed
    if isinstance(v, list):
        return _array_header(len(v), 0) + b"".join(pack_value(x) for x in v)
    if isinstance(v, dict):
        return _map_header(len(v), 0) + b"".join(pack_value(k) + pack_value(x)
                                                  for k, x in v.items())
    raise AssertionError(f"unreachable: {type(v).__name__}")


def _array_header(n: int, form: int) -> bytes:
    if n < 16 and form == 0:
        return bytes([0x90 | n])
    if n < 2**16 and form <= 1:
        return b"\xdc" + struct.pack(">H", n)
    return b"\xdd" + struct.pack(">I", n)


def _map_header(n: int, form: int) -> bytes:
    if n < 16 and form == 0:
        return bytes([0x80 | n])
    if n < 2**16 and form <= 1:
        return b"\xde" + struct.pack(">H", n)
    return b"\xdf" + struct.pack(">I", n)


def pack_entries(entries: list[tuple[object, object]], form: int = 0) -> bytes:
    """A msgpack map of ``entries`` in order (duplicates kept), header form ``form``."""
    return _map_header(len(entries), form) + b"".join(
        pack_value(k) + pack_value(v) for k, v in entries)


# ---------------------------------------------------------------- mutations
@st.composite
def mutate_entries(draw: st.DrawFn, entries: list[tuple[object, object]]) -> None:
    """Apply one structural mutation to ``entries`` in place."""
    op = draw(st.sampled_from(("drop", "retype", "retype", "type", "extra", "dup", "oversize",
                               "elem", "mismatch", "edge_int", "swap")))
    if op in ("drop", "retype", "dup", "edge_int") and not entries:
        op = "extra"
    if op == "drop":
        del entries[draw(st.integers(0, len(entries) - 1))]
    elif op == "retype":
        i = draw(st.integers(0, len(entries) - 1))
        entries[i] = (entries[i][0], draw(any_values))
    elif op == "edge_int":
        i = draw(st.integers(0, len(entries) - 1))
        v = draw(st.sampled_from(EDGE_INTS))
        entries[i] = (entries[i][0], _ints_nonminimal(v) if draw(st.booleans()) else v)
    elif op == "type":
        name = draw(st.one_of(st.sampled_from(TYPE_NAMES), st.text(max_size=12), any_values))
        entries[:] = [(k, v) for k, v in entries if k != "type"]
        entries.insert(draw(st.integers(0, len(entries))), ("type", name))
    elif op == "extra":
        k = draw(st.one_of(st.text(max_size=12), st.sampled_from(
            ("config_fingerprint", "keys", "round_seq", "success")),
            st.integers(-(2**63), 2**64 - 1), st.binary(max_size=4), st.none()))
        entries.insert(draw(st.integers(0, len(entries))), (k, draw(any_values)))
    elif op == "dup":
        entries.append(entries[draw(st.integers(0, len(entries) - 1))])
    elif op == "swap" and len(entries) >= 2:
        i = draw(st.integers(0, len(entries) - 2))
        entries[i], entries[i + 1] = entries[i + 1], entries[i]
    else:
        lists = [i for i, (_, v) in enumerate(entries) if isinstance(v, list)]
        if not lists:
            return
        i = draw(st.sampled_from(lists))
        name, value = entries[i]
        assert isinstance(value, list)
        if op == "oversize":
            entries[i] = (name, oversized(str(name)))
        elif op == "mismatch":
            entries[i] = (name, value[:-1] if value and draw(st.booleans())
                          else [*value, value[0] if value else 0])
        elif value:
            j = draw(st.integers(0, len(value) - 1))
            entries[i] = (name, [*value[:j], draw(any_values), *value[j + 1:]])


@st.composite
def mutate_bytes(draw: st.DrawFn, frame: bytes, other: bytes) -> bytes:
    """Apply one byte-level mutation to ``frame`` (``other`` is a second frame to splice)."""
    op = draw(st.sampled_from(("truncate", "flip", "flip", "insert", "delete", "trail",
                               "splice", "set")))
    n = len(frame)
    pos = draw(st.integers(0, max(n - 1, 0)))
    if op == "truncate":
        return frame[:pos]
    if op == "flip" and n:
        bit = draw(st.integers(0, 7))
        return frame[:pos] + bytes([frame[pos] ^ (1 << bit)]) + frame[pos + 1:]
    if op == "set" and n:
        return frame[:pos] + bytes([draw(st.integers(0, 255))]) + frame[pos + 1:]
    if op == "insert":
        return frame[:pos] + draw(st.binary(min_size=1, max_size=8)) + frame[pos:]
    if op == "delete":
        return frame[:pos] + frame[pos + draw(st.integers(1, 8)):]
    if op == "trail":
        return frame + draw(st.one_of(st.binary(min_size=1, max_size=4), st.just(other)))
    cut = draw(st.integers(0, len(other)))
    return frame[:pos] + other[cut:]


@st.composite
def near_valid_frames(draw: st.DrawFn, *, p_valid: float = 0.15) -> bytes:
    """A frame from a valid message, most often mutated at the map and/or byte level."""
    msg = draw(messages)
    if draw(st.floats(0, 1)) < p_valid:
        return encode(msg)
    entries: list[tuple[object, object]] = list(to_dict(msg).items())
    for _ in range(draw(st.integers(0, 3))):
        draw(mutate_entries(entries))
    frame = pack_entries(entries, draw(st.sampled_from((0, 0, 0, 1, 2))))
    if draw(st.integers(0, 2)) == 0:
        other = encode(draw(messages))
        for _ in range(draw(st.integers(1, 3))):
            frame = draw(mutate_bytes(frame, other))
    return frame


arbitrary_frames = st.one_of(
    st.binary(max_size=64),
    st.binary(min_size=1, max_size=4).map(lambda head: head + bytes(60)),
    st.lists(st.sampled_from((*HEADER_BOMBS, b"\x80", b"\x90", b"\xc0", b"\xa4type")),
             max_size=8).map(b"".join),
)
"""Arbitrary bytes, and concatenations of msgpack headers and tokens."""

fuzz_frames = st.one_of(near_valid_frames(), near_valid_frames(p_valid=0.5), arbitrary_frames)
"""What the session fuzzers feed: mostly near-valid, some arbitrary."""
