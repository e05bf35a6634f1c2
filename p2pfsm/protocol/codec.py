"""Bytes to messages and back: one msgpack map per ZeroMQ frame, no envelope.

``encode`` writes exactly what vLLM 0.33.0 writes with msgspec: the map in
wire key order, fixstr keys, the smallest int encodings, bin for bytes and
arrays for lists (msgpack's ``use_bin_type=True`` output is byte-identical; the
capture tests check this frame by frame).

``decode`` treats its input as hostile (a peer controls every byte of it):

1. the frame length is checked against ``Limits.max_frame_bytes`` before any
   unpacking (the bound ``Unpacker(max_buffer_size=...)`` would give; one
   ``unpackb`` call per frame is several times cheaper than a streaming
   ``Unpacker``, measured here);
2. ``unpackb`` runs with every ``max_*_len`` set from the limits *and* clamped
   to the frame length, since no container can hold more entries than the
   frame has bytes. Without the clamp, 3 KB of nested ``array16(65535)``
   headers make msgpack preallocate a 512 KiB list per level: 0.1-0.3 s of
   CPU for one tiny frame;
3. extension types (and so timestamps) are refused, duplicate map keys are
   refused (msgpack would keep the last silently), trailing bytes are refused;
4. the top value must be a map, which ``validate.from_dict`` then checks.

``fetch_round`` reads what a rejected fetch still tells (its round), so that the
session can answer it.

Every failure is ``MalformedFrame`` (``UnknownMessageType`` for an unknown
``type``), with field "" when the bytes themselves are bad.
"""

from __future__ import annotations

from typing import Final

import msgpack

from p2pfsm.errors import MalformedFrame
from p2pfsm.protocol.fetch_checks import FetchRound, named_round
from p2pfsm.protocol.messages import Message
from p2pfsm.protocol.validate import DEFAULT_LIMITS, Limits, from_dict, to_dict

# Most entries in any map. The largest message has 8 fields; the slack leaves
# room for fields a newer peer may add (extra fields are ignored).
_MAX_MAP_LEN: Final = 64

# Exceptions msgpack raises on bad input (ExtraData, FormatError, StackError and
# UnicodeDecodeError are ValueErrors; an unhashable map key is a TypeError).
_DECODE_ERRORS: Final = (ValueError, TypeError, OverflowError, RecursionError)

_REASON_CHARS: Final = 120


def encode(msg: Message) -> bytes:
    """Serialize ``msg`` to one frame, byte-identical to vLLM 0.33.0's encoding.

    The message is not validated; build messages from trusted values or pass
    them through ``from_dict`` first.
    """
    # A packer of its own (nothing shared between threads), built without packb's
    # keyword-argument wrapper: half the cost of a small frame.
    packed: bytes = msgpack.Packer(use_bin_type=True).pack(to_dict(msg))
    return packed


def _unique_map(pairs: list[tuple[object, object]]) -> dict[object, object]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[object] = set()
        for key, _ in pairs:
            if key in seen:
                field = key if type(key) is str and len(key) <= _REASON_CHARS else ""
                raise MalformedFrame(field, "duplicate map key")
            seen.add(key)
    return result


def decode(frame: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Decode and validate one frame received from a peer.

    Args:
        frame: the frame's bytes (``bytes``, or a contiguous byte buffer).
        limits: the size bounds to enforce.

    Returns:
        The message, fully validated (except ``check_block_indexes``, which
        needs the peer's ``num_blocks``).

    Raises:
        UnknownMessageType: a well-formed map whose ``type`` is not one of ours.
        MalformedFrame: anything else; nothing is changed.
    """
    return from_dict(_unpack_map(frame, limits), limits)


def fetch_round(frame: bytes | bytearray | memoryview,
                limits: Limits = DEFAULT_LIMITS) -> FetchRound | None:
    """The round a fetch frame names, read from a frame that failed :func:`decode`.

    For a map of type ``fetch`` whose ``kv_request_id`` and ``round_seq`` are valid and
    that is not terminal (``keys`` anything but an empty array); None otherwise,
    undecodable bytes included. The same bounded unpack as :func:`decode`; never raises.
    """
    try:
        obj = _unpack_map(frame, limits)
    except MalformedFrame:
        return None
    return named_round(obj, limits)


def _unpack_map(frame: bytes | bytearray | memoryview, limits: Limits) -> dict[object, object]:
    """Steps 1-4 of the module docstring: the frame's top-level map, unvalidated."""
    size = len(frame) if type(frame) is bytes else memoryview(frame).nbytes
    if size > limits.max_frame_bytes:
        raise MalformedFrame(
            "", f"frame of {size} bytes exceeds max_frame_bytes ({limits.max_frame_bytes})"
        )
    try:
        obj: object = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            use_list=True,
            object_pairs_hook=_unique_map,
            max_str_len=min(limits.max_str_len, size),
            max_bin_len=min(max(limits.max_metadata_bytes, limits.max_key_bytes), size),
            max_array_len=min(limits.max_list_items, size),
            max_map_len=min(_MAX_MAP_LEN, size // 2),
            max_ext_len=0,
        )
    except msgpack.ExtraData:
        raise MalformedFrame("", "trailing bytes after the message") from None
    except msgpack.StackError:
        raise MalformedFrame("", "nested too deeply") from None
    except _DECODE_ERRORS as exc:
        detail = str(exc)[:_REASON_CHARS] or type(exc).__name__
        raise MalformedFrame("", f"undecodable msgpack: {detail}") from None
    if not isinstance(obj, dict):
        raise MalformedFrame("", f"top-level value is {type(obj).__name__}, expected a map")
    return obj


__all__ = ["decode", "encode", "fetch_round"]
