"""Fuzzing ``decode``: arbitrary bytes and near-valid frames.

Properties, for every frame:

* ``decode`` returns a message or raises the documented ``RemoteProtocolError``
  family (``MalformedFrame``, ``UnknownMessageType``); any other exception is a crash;
* it returns within a second (no hang; the slowest decode is in the summary);
* a message it returns satisfies every bound of the ``Limits`` it ran under (checked
  against the default limits and against tight ones) and round-trips through ``encode``;
* a frame over ``max_frame_bytes`` is refused before unpacking, and the memory one
  decode allocates stays within the bound the codec's clamps give (tracemalloc).

CI runs the derandomized budget (about 11 000 decodes here, about 10 s). Long run
(randomized, 10x the examples; >= 100 000 frames over the whole suite)::

    HYPOTHESIS_PROFILE=long .venv/bin/pytest tests/fuzz -q

or any budget per test: ``P2PFSM_FUZZ_EXAMPLES=20000 .venv/bin/pytest tests/fuzz -q``.
"""

from __future__ import annotations

import time
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz.frames import arbitrary_frames, messages, near_valid_frames, pack_entries
from fuzz.stats import COUNTS, fuzz_settings
from p2pfsm.errors import MalformedFrame, RemoteProtocolError
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
    decode,
    encode,
    to_dict,
)

HANG_S = 1.0
"""No decode may take longer (the worst legitimate frames take milliseconds)."""

# max_str_len stays >= 18: msgpack applies it to field names too (see
# test_fuzz_regressions.test_small_max_str_len_does_not_refuse_field_names).
TIGHT = Limits(max_frame_bytes=4096, max_list_items=4, max_key_bytes=16, max_str_len=20,
               max_metadata_bytes=32, max_block_index=63, max_num_blocks=128,
               max_round_seq=1000)

MSGPACK_MAX_DEPTH = 1024
"""msgpack's C unpacker stack: no frame nests containers deeper."""


def _text_ok(value: object, limits: Limits, *, nonempty: bool) -> bool:
    return (type(value) is str and (bool(value) or not nonempty)
            and len(value.encode("utf-8")) <= limits.max_str_len)


def _keys_ok(keys: object, limits: Limits) -> bool:
    return (type(keys) is tuple and len(keys) <= limits.max_list_items
            and all(type(k) is bytes and 1 <= len(k) <= limits.max_key_bytes for k in keys))


def assert_within_limits(msg: Message, limits: Limits) -> None:
    """Every bound ``from_dict`` promises, checked independently of its code."""
    def ok_int(v: object, low: int, high: int) -> bool:
        return type(v) is int and low <= v <= high

    if isinstance(msg, Connect):
        assert _text_ok(msg.peer_id, limits, nonempty=True)
        assert type(msg.agent_metadata) is bytes
        assert len(msg.agent_metadata) <= limits.max_metadata_bytes
        assert ok_int(msg.num_blocks, 1, limits.max_num_blocks)
        assert ok_int(msg.block_len, 1, 2**64 - 1)
        assert ok_int(msg.base_addr, 0, 2**64 - 1)
        assert msg.base_addr + msg.num_blocks * msg.block_len < 2**64
        assert _text_ok(msg.config_fingerprint, limits, nonempty=False)
        assert _text_ok(msg.hash_seed, limits, nonempty=True)
        if msg.layout_names is not None:
            regions = 1 if msg.layout is None else len(msg.layout)
            assert type(msg.layout_names) is tuple and len(msg.layout_names) == regions
            assert len(set(msg.layout_names)) == regions
            assert all(_text_ok(n, limits, nonempty=True) for n in msg.layout_names)
        if msg.config_digests is not None:
            assert type(msg.config_digests) is tuple and len(msg.config_digests) <= 1024
            assert all(_text_ok(n, limits, nonempty=True) and _text_ok(d, limits, nonempty=True)
                       for n, d in msg.config_digests)
    elif isinstance(msg, ConnectAck):
        assert _text_ok(msg.peer_id, limits, nonempty=True)
    elif isinstance(msg, Disconnect):
        pass
    else:
        assert isinstance(msg, Fetch | Lookup | LookupResp | TransferDone | AbortFetch | AbortAck)
        assert _text_ok(msg.kv_request_id, limits, nonempty=True)
        if isinstance(msg, Fetch | Lookup | LookupResp):
            assert _keys_ok(msg.keys, limits)
        if isinstance(msg, Fetch):
            assert type(msg.block_indexes) is tuple and len(msg.block_indexes) == len(msg.keys)
            assert all(ok_int(i, 0, limits.max_block_index) for i in msg.block_indexes)
        if isinstance(msg, LookupResp):
            assert type(msg.hits) is tuple and len(msg.hits) == len(msg.keys)
            assert all(type(h) is bool for h in msg.hits)
        if isinstance(msg, TransferDone):
            assert type(msg.success) is bool
        if not isinstance(msg, LookupResp):
            assert ok_int(msg.round_seq, 0, limits.max_round_seq)  # type: ignore[union-attr]


def fuzz_decode(frame: bytes, limits: Limits = DEFAULT_LIMITS) -> Message | None:
    """Decode one fuzzed frame and check the properties; None when it was rejected."""
    COUNTS.frames_decoded += 1
    start = time.perf_counter()
    try:
        msg = decode(frame, limits)
    except RemoteProtocolError as exc:
        msg = None
        assert isinstance(exc, MalformedFrame), f"undocumented error {exc!r}"
        assert isinstance(exc.field, str) and isinstance(exc.reason, str)
        assert len(str(exc)) < 400, "an error echoes untrusted input at length"
        COUNTS.decode_rejected += 1
    except BaseException:
        COUNTS.crashes += 1
        raise
    elapsed = time.perf_counter() - start
    if tracemalloc.is_tracing():  # tracing slows msgpack's allocations several times
        assert elapsed < 10 * HANG_S, f"decode of {len(frame)} bytes took {elapsed:.2f} s"
    else:
        COUNTS.max_decode_s = max(COUNTS.max_decode_s, elapsed)
        assert elapsed < HANG_S, f"decode of {len(frame)} bytes took {elapsed:.2f} s"
    if msg is not None:
        assert_within_limits(msg, limits)
        assert decode(encode(msg), limits) == msg
    return msg


@fuzz_settings(600)
@given(st.lists(arbitrary_frames, min_size=1, max_size=8))
def test_decode_arbitrary_bytes(frames: list[bytes]) -> None:
    for frame in frames:
        fuzz_decode(frame)
        fuzz_decode(frame, TIGHT)


@fuzz_settings(700)
@given(st.lists(near_valid_frames(), min_size=1, max_size=6))
def test_decode_near_valid_frames(frames: list[bytes]) -> None:
    for frame in frames:
        fuzz_decode(frame)
        fuzz_decode(frame, TIGHT)


@fuzz_settings(300)
@given(messages)
def test_valid_frames_decode_to_themselves(msg: Message) -> None:
    # The unmutated baseline: the near-valid fuzzer starts from frames the codec accepts.
    frame = encode(msg)
    assert fuzz_decode(frame) == msg
    # Same map, every header and container in its widest msgpack form: still accepted.
    assert fuzz_decode(pack_entries(list(to_dict(msg).items()), form=2)) == msg


@fuzz_settings(200)
@given(messages, st.integers(0, 64))
def test_oversize_frame_refused_before_unpacking(msg: Message, pad: int) -> None:
    frame = encode(msg) + b"\xc1" * pad  # trailing junk that unpacking would also reject
    limits = Limits(max_frame_bytes=max(1, len(frame) - 1))
    COUNTS.frames_decoded += 1
    COUNTS.decode_rejected += 1
    with pytest.raises(MalformedFrame) as info:
        decode(frame, limits)
    assert info.value.field == "" and "max_frame_bytes" in info.value.reason
    assert fuzz_decode(encode(msg), Limits(max_frame_bytes=len(encode(msg)))) == msg


def allocation_bound(size: int, limits: Limits = DEFAULT_LIMITS) -> int:
    """The most a ``size``-byte frame may make decode allocate, given the codec's clamps.

    msgpack preallocates every container it meets; the codec clamps each container's
    length to min(limit, frame length), and msgpack nests at most 1024 deep: so one
    pointer per clamped entry per level, plus the values themselves (64 bytes a frame
    byte is generous for the smallest objects: 1-byte bin keys) and a fixed slack.
    """
    per_level = 8 * min(size, max(limits.max_list_items, 64))
    return MSGPACK_MAX_DEPTH * per_level + 64 * size + 2**20


@fuzz_settings(400)
@given(st.lists(st.one_of(near_valid_frames(p_valid=0.0), arbitrary_frames), min_size=1,
                max_size=4))
def test_decode_allocation_is_bounded(frames: list[bytes]) -> None:
    tracemalloc.start()
    try:
        for frame in frames:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            fuzz_decode(frame)
            peak = tracemalloc.get_traced_memory()[1] - base
            COUNTS.max_peak_bytes = max(COUNTS.max_peak_bytes, peak)
            assert peak <= allocation_bound(len(frame)), (len(frame), peak)
    finally:
        tracemalloc.stop()


def test_allocation_bound_would_catch_an_unclamped_codec() -> None:
    # Unpacking with the limits alone (no clamp to the frame length) breaks the bound: so
    # the property can fail, and it would catch a codec that lost its clamps.
    import msgpack

    frame = b"\xdc\xff\xff" * 1000 + b"\xc0"  # 3 KB: 1000 nested array16(65535) headers
    tracemalloc.start()
    try:
        with pytest.raises(ValueError):
            msgpack.unpackb(frame, max_array_len=DEFAULT_LIMITS.max_list_items)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak > allocation_bound(len(frame))
