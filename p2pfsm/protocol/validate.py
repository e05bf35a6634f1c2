"""Strict validation of decoded frames, and the reverse mapping to wire dicts.

Theory of operation: ``codec.decode`` turns bytes into plain Python values
(dict, list, str, bytes, int, bool) under size limits, then hands the dict to
``from_dict``. ``from_dict`` checks every field of the named message *before*
building anything, and raises ``MalformedFrame(field, reason)`` on the first
problem, so a caller never sees a half-valid message. The rules are stricter
than vLLM 0.33.0's own checks (which accept, e.g., a bool where an int belongs and
unbounded lists):

- exact types: a bool is never accepted as an int, an int never as a bool,
  keys must be msgpack bin (``bytes``) and text must be ``str``;
- every int is bounded (a block index of 2**31 crashed vLLM's transfer call);
- parallel lists have equal lengths, and all sizes are capped by ``Limits``.

Unknown extra fields are ignored, as vLLM ignores them. A missing
``config_fingerprint`` reads as "" (vLLM tolerates it and skips the check).
What a fetch is held to beyond its frame (the round a rejected one still names, its
indexes inside the peer's region) is :mod:`~p2pfsm.protocol.fetch_checks`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Sized
from dataclasses import fields
from typing import Final

from p2pfsm.errors import LocalProtocolError, MalformedFrame, UnknownMessageType
from p2pfsm.protocol import names
from p2pfsm.protocol.limits import DEFAULT_LIMITS, Limits
from p2pfsm.protocol.messages import (
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    Lookup,
    LookupResp,
    Message,
    TransferDone,
)

_U64_LIMIT: Final = 2**64  # base_addr and the region end must stay below this


# ---------------------------------------------------------------------------
# Error text helpers: never echo a whole untrusted value into a message.
# ---------------------------------------------------------------------------


def _tname(value: object) -> str:
    return type(value).__name__


def _int_text(value: int) -> str:
    # str() of a huge int is slow and can raise (sys.int_max_str_digits).
    return str(value) if value.bit_length() <= 128 else f"<int of {value.bit_length()} bits>"


def _str_preview(value: str, limit: int = 40) -> str:
    return repr(value) if len(value) <= limit else repr(value[:limit]) + "..."


# ---------------------------------------------------------------------------
# Field checks. Each returns the checked value or raises MalformedFrame(field, ...).
# ---------------------------------------------------------------------------


def _get(obj: Mapping[str, object], name: str) -> object:
    try:
        return obj[name]
    except KeyError:
        raise MalformedFrame(name, "missing") from None


def _check_int(value: object, field: str, low: int, high: int) -> int:
    if type(value) is not int:  # exact: rejects bool (an int subclass) and float
        raise MalformedFrame(field, f"expected int, got {_tname(value)}")
    if value < low:
        raise MalformedFrame(field, f"must be >= {low}, got {_int_text(value)}")
    if value > high:
        raise MalformedFrame(field, f"must be <= {high}, got {_int_text(value)}")
    return value


def _check_bool(value: object, field: str) -> bool:
    if type(value) is not bool:  # exact: rejects the int 1
        raise MalformedFrame(field, f"expected bool, got {_tname(value)}")
    return value


def _check_bytes(value: object, field: str, low: int, high: int) -> bytes:
    if type(value) is not bytes:
        raise MalformedFrame(field, f"expected bytes (msgpack bin), got {_tname(value)}")
    size = len(value)
    if size < low:
        raise MalformedFrame(field, f"must be at least {low} bytes, got {size}")
    if size > high:
        raise MalformedFrame(field, f"must be at most {high} bytes, got {size}")
    return value


def _check_text(value: object, field: str, limits: Limits, *, nonempty: bool) -> str:
    if type(value) is not str:
        raise MalformedFrame(field, f"expected str, got {_tname(value)}")
    if nonempty and not value:
        raise MalformedFrame(field, "must not be empty")
    # UTF-8 never has fewer bytes than characters, so a long str fails before encoding.
    if len(value) > limits.max_str_len:
        raise MalformedFrame(field, f"longer than {limits.max_str_len} bytes")
    if not value.isascii():
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:  # lone surrogates: cannot go on the wire
            raise MalformedFrame(field, "not encodable as UTF-8") from None
        if size > limits.max_str_len:
            raise MalformedFrame(field, f"longer than {limits.max_str_len} bytes ({size})")
    return value


def ints_within(values: Sequence[object], low: int, high: int) -> bool:
    """Every value an exact int (a bool is not) in ``[low, high]``; True when empty.

    The all-valid fast path of index checks: one C-level pass per property, so a caller
    loops in Python only to name the first bad entry."""
    if not values:
        return True
    if set(map(type, values)) != {int}:
        return False
    # The type checks above hold; no runtime cast (a call per frame) is needed.
    return min(values) >= low and max(values) <= high  # type: ignore[type-var,operator]


def index_outside(indexes: Sequence[int], limit: int) -> int | None:
    """The position of the first of ``indexes`` (ints) outside ``[0, limit)``; None when
    every one lies inside. The one block-index range rule: the session holds a fetch's
    indexes to the peer's region with it (:mod:`~p2pfsm.protocol.fetch_checks`), and the
    NIXL data plane a WRITE's (:mod:`p2pfsm.executor.nixl.checks`)."""
    if not indexes or (min(indexes) >= 0 and max(indexes) < limit):
        return None
    return next(i for i, index in enumerate(indexes) if not 0 <= index < limit)


def bytes_within(values: Sequence[object], shortest: int, longest: int) -> bool:
    """Every value exact bytes of ``shortest..longest`` bytes; True when empty. The
    fast path of key checks, as :func:`ints_within`."""
    if not values:
        return True
    if set(map(type, values)) != {bytes}:
        return False
    sizes = set(map(len, values))  # type: ignore[arg-type]  # keys share a size: a tiny set
    return min(sizes) >= shortest and max(sizes) <= longest


def _check_list(value: object, field: str, limits: Limits) -> list[object] | tuple[object, ...]:
    # The wire gives lists; tuples are accepted for callers that unpack with use_list=False.
    if not isinstance(value, list | tuple):
        raise MalformedFrame(field, f"expected array, got {_tname(value)}")
    if len(value) > limits.max_list_items:
        raise MalformedFrame(field, f"more than {limits.max_list_items} items ({len(value)})")
    return value


def _check_keys(obj: Mapping[str, object], limits: Limits) -> tuple[bytes, ...]:
    keys = _check_list(_get(obj, "keys"), "keys", limits)
    high = limits.max_key_bytes
    # Fast path for the all-valid case, in C loops; the slow loop names the first bad entry.
    if bytes_within(keys, 1, high):
        return tuple(keys)  # type: ignore[arg-type]
    return tuple(_check_bytes(k, f"keys[{i}]", 1, high) for i, k in enumerate(keys))


def _check_same_length(field: str, items: Sized, keys: tuple[bytes, ...]) -> None:
    if len(items) != len(keys):
        raise MalformedFrame(field, f"has {len(items)} items but keys has {len(keys)}")


def _check_block_index_list(
    obj: Mapping[str, object], limits: Limits, keys: tuple[bytes, ...]
) -> tuple[int, ...]:
    indexes = _check_list(_get(obj, "block_indexes"), "block_indexes", limits)
    _check_same_length("block_indexes", indexes, keys)
    high = limits.max_block_index
    if ints_within(indexes, 0, high):
        return tuple(indexes)  # type: ignore[arg-type]
    return tuple(_check_int(x, f"block_indexes[{i}]", 0, high) for i, x in enumerate(indexes))


def _check_hits(
    obj: Mapping[str, object], limits: Limits, keys: tuple[bytes, ...]
) -> tuple[bool, ...]:
    hits = _check_list(_get(obj, "hits"), "hits", limits)
    _check_same_length("hits", hits, keys)
    if not hits or set(map(type, hits)) == {bool}:
        return tuple(hits)  # type: ignore[arg-type]
    return tuple(_check_bool(h, f"hits[{i}]") for i, h in enumerate(hits))


def _round_seq(obj: Mapping[str, object], limits: Limits) -> int:
    try:  # _get, inline: every request and reply names its round
        value = obj["round_seq"]
    except KeyError:
        raise MalformedFrame("round_seq", "missing") from None
    return _check_int(value, "round_seq", 0, limits.max_round_seq)


def _request_id(obj: Mapping[str, object], limits: Limits) -> str:
    try:  # _get, inline: every request and reply names its request
        value = obj["kv_request_id"]
    except KeyError:
        raise MalformedFrame("kv_request_id", "missing") from None
    return _check_text(value, "kv_request_id", limits, nonempty=True)


# ---------------------------------------------------------------------------
# One parser per message type, fields checked in wire order.
# ---------------------------------------------------------------------------


def _parse_connect(obj: Mapping[str, object], limits: Limits) -> Connect:
    peer_id = _check_text(_get(obj, "peer_id"), "peer_id", limits, nonempty=True)
    metadata = _check_bytes(
        _get(obj, "agent_metadata"), "agent_metadata", 0, limits.max_metadata_bytes
    )
    base_addr = _check_int(_get(obj, "base_addr"), "base_addr", 0, _U64_LIMIT - 1)
    num_blocks = _check_int(_get(obj, "num_blocks"), "num_blocks", 1, limits.max_num_blocks)
    block_len = _check_int(_get(obj, "block_len"), "block_len", 1, _U64_LIMIT - 1)
    if base_addr + num_blocks * block_len >= _U64_LIMIT:
        raise MalformedFrame("block_len", "base_addr + num_blocks * block_len overflows 64 bits")
    # vLLM 0.33.0 tolerates a missing fingerprint; "" means "skip the comparison".
    fingerprint = _check_text(
        obj.get("config_fingerprint", ""), "config_fingerprint", limits, nonempty=False
    )
    hash_seed = _check_text(_get(obj, "hash_seed"), "hash_seed", limits, nonempty=True)
    # Optional (p2pfsm only): absent from vLLM's connect.
    raw_incarnation = obj.get("incarnation")
    incarnation = (None if raw_incarnation is None
                   else _check_int(raw_incarnation, "incarnation", 0, _U64_LIMIT - 1))
    raw_layout = obj.get("layout")
    layout = (None if raw_layout is None
              else _check_layout(raw_layout, base_addr, num_blocks, block_len, limits))
    raw_names = obj.get("layout_names")
    layout_names = (None if raw_names is None
                    else _check_layout_names(raw_names, 1 if layout is None else len(layout),
                                             limits))
    raw_digests = obj.get("config_digests")
    digests = None if raw_digests is None else _check_config_digests(raw_digests, limits)
    return Connect(
        peer_id=peer_id,
        agent_metadata=metadata,
        base_addr=base_addr,
        num_blocks=num_blocks,
        block_len=block_len,
        config_fingerprint=fingerprint,
        hash_seed=hash_seed,
        incarnation=incarnation,
        layout=layout,
        layout_names=layout_names,
        config_digests=digests,
    )


def _check_layout(value: object, base_addr: int, num_blocks: int, block_len: int,
                  limits: Limits) -> tuple[tuple[int, int, int], ...]:
    """Connect's optional ``layout``: 1 to ``max_layout_regions`` arrays of
    ``[base_addr, stride, slice_len]``, each region inside 64 bits, region 0 at the
    connect's ``base_addr`` and the slices summing to its ``block_len``."""
    if not isinstance(value, list | tuple):
        raise MalformedFrame("layout", f"expected array, got {_tname(value)}")
    if not 1 <= len(value) <= limits.max_layout_regions:
        raise MalformedFrame("layout", f"needs 1 to {limits.max_layout_regions} regions, "
                                       f"got {len(value)}")
    regions: list[tuple[int, int, int]] = []
    for n, entry in enumerate(value):
        field = f"layout[{n}]"
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise MalformedFrame(field, "expected [base_addr, stride, slice_len]")
        base = _check_int(entry[0], field, 0, _U64_LIMIT - 1)
        stride = _check_int(entry[1], field, 1, _U64_LIMIT - 1)
        slice_len = _check_int(entry[2], field, 1, stride)
        if base + (num_blocks - 1) * stride + slice_len >= _U64_LIMIT:
            raise MalformedFrame(field, "the region overflows 64 bits")
        regions.append((base, stride, slice_len))
    if regions[0][0] != base_addr:
        raise MalformedFrame("layout", "region 0 does not start at base_addr")
    if sum(r[2] for r in regions) != block_len:
        raise MalformedFrame("layout", "the slices do not sum to block_len")
    return tuple(regions)


def _check_layout_names(value: object, regions: int, limits: Limits) -> tuple[str, ...]:
    """Connect's optional ``layout_names``: one distinct, non-empty str per region."""
    if not isinstance(value, list | tuple):
        raise MalformedFrame("layout_names", f"expected array, got {_tname(value)}")
    if len(value) != regions:
        raise MalformedFrame("layout_names", f"{len(value)} names for {regions} regions")
    checked = tuple(_check_text(name, f"layout_names[{n}]", limits, nonempty=True)
                    for n, name in enumerate(value))
    if len(set(checked)) != len(checked):
        raise MalformedFrame("layout_names", "a name appears twice")
    return checked


_MAX_CONFIG_FIELDS: Final = 1024


def _check_config_digests(value: object, limits: Limits) -> tuple[tuple[str, str], ...]:
    """Connect's optional ``config_digests``: at most 1024 ``[field, digest]`` pairs of
    non-empty str, fields distinct."""
    if not isinstance(value, list | tuple):
        raise MalformedFrame("config_digests", f"expected array, got {_tname(value)}")
    if len(value) > _MAX_CONFIG_FIELDS:
        raise MalformedFrame("config_digests", f"more than {_MAX_CONFIG_FIELDS} fields")
    pairs: list[tuple[str, str]] = []
    for n, entry in enumerate(value):
        field = f"config_digests[{n}]"
        if not isinstance(entry, list | tuple) or len(entry) != 2:
            raise MalformedFrame(field, "expected [field, digest]")
        pairs.append((_check_text(entry[0], field, limits, nonempty=True),
                      _check_text(entry[1], field, limits, nonempty=True)))
    if len({name for name, _ in pairs}) != len(pairs):
        raise MalformedFrame("config_digests", "a field appears twice")
    return tuple(pairs)


def _parse_connect_ack(obj: Mapping[str, object], limits: Limits) -> ConnectAck:
    return ConnectAck(_check_text(_get(obj, "peer_id"), "peer_id", limits, nonempty=True))


def _parse_disconnect(obj: Mapping[str, object], limits: Limits) -> Disconnect:
    return Disconnect()


def _parse_fetch(obj: Mapping[str, object], limits: Limits) -> Fetch:
    kv_request_id = _request_id(obj, limits)
    keys = _check_keys(obj, limits)
    block_indexes = _check_block_index_list(obj, limits, keys)
    round_seq = _round_seq(obj, limits)
    return Fetch(kv_request_id, keys, block_indexes, round_seq)


def _parse_lookup(obj: Mapping[str, object], limits: Limits) -> Lookup:
    kv_request_id = _request_id(obj, limits)
    keys = _check_keys(obj, limits)
    round_seq = _round_seq(obj, limits)
    return Lookup(kv_request_id, keys, round_seq)


def _parse_lookup_resp(obj: Mapping[str, object], limits: Limits) -> LookupResp:
    kv_request_id = _request_id(obj, limits)
    keys = _check_keys(obj, limits)
    hits = _check_hits(obj, limits, keys)
    return LookupResp(kv_request_id, keys, hits)


def _parse_transfer_done(obj: Mapping[str, object], limits: Limits) -> TransferDone:
    kv_request_id = _request_id(obj, limits)
    success = _check_bool(_get(obj, "success"), "success")
    round_seq = _round_seq(obj, limits)
    return TransferDone(kv_request_id, success, round_seq)


def _parse_abort_fetch(obj: Mapping[str, object], limits: Limits) -> AbortFetch:
    kv_request_id = _request_id(obj, limits)
    return AbortFetch(kv_request_id, _round_seq(obj, limits))


def _parse_abort_ack(obj: Mapping[str, object], limits: Limits) -> AbortAck:
    kv_request_id = _request_id(obj, limits)
    return AbortAck(kv_request_id, _round_seq(obj, limits))


_PARSERS: Final[dict[str, Callable[[Mapping[str, object], Limits], Message]]] = {
    names.CONNECT: _parse_connect,
    names.CONNECT_ACK: _parse_connect_ack,
    names.DISCONNECT: _parse_disconnect,
    names.FETCH: _parse_fetch,
    names.LOOKUP: _parse_lookup,
    names.LOOKUP_RESP: _parse_lookup_resp,
    names.TRANSFER_DONE: _parse_transfer_done,
    names.ABORT_FETCH: _parse_abort_fetch,
    names.ABORT_ACK: _parse_abort_ack,
}


def from_dict(obj: object, limits: Limits = DEFAULT_LIMITS) -> Message:
    """Validate a decoded frame and build its message.

    Args:
        obj: the unpacked frame, normally a dict straight from msgpack.
        limits: the size bounds to enforce.

    Returns:
        The message named by ``obj["type"]``.

    Raises:
        UnknownMessageType: ``type`` is a str that names none of the nine
            messages (vLLM logs and ignores such frames).
        MalformedFrame: anything else is wrong; ``field`` names the culprit
            (e.g. ``block_indexes[3]``), "" when the frame as a whole is bad.
            Nothing is built and nothing is changed.
    """
    if not isinstance(obj, dict):
        raise MalformedFrame("", f"expected a map, got {_tname(obj)}")
    for key in obj:
        if type(key) is not str:
            raise MalformedFrame("", f"map keys must be str, found a {_tname(key)} key")
    if names.TYPE_KEY not in obj:
        raise MalformedFrame(names.TYPE_KEY, "missing")
    type_name = obj[names.TYPE_KEY]
    if type(type_name) is not str:
        raise MalformedFrame(names.TYPE_KEY, f"expected str, got {_tname(type_name)}")
    parser = _PARSERS.get(type_name)
    if parser is None:
        raise UnknownMessageType(names.TYPE_KEY, f"unknown message type {_str_preview(type_name)}")
    return parser(obj, limits)


_FIELD_NAMES: Final[dict[type, tuple[str, ...]]] = {
    cls: tuple(f.name for f in fields(cls))
    for cls in (
        Connect,
        ConnectAck,
        Disconnect,
        Fetch,
        Lookup,
        LookupResp,
        TransferDone,
        AbortFetch,
        AbortAck,
    )
}


def to_dict(msg: Message) -> dict[str, object]:
    """Return the wire map of ``msg``: ``type`` first, then fields in vLLM's order.

    Tuples become lists, so msgpack writes arrays exactly as vLLM does. An optional
    field that is None (connect's ``incarnation``) is left out. The message is not
    validated here.

    Raises:
        LocalProtocolError: ``msg`` is not one of the nine message classes.
    """
    try:
        field_names = _FIELD_NAMES[type(msg)]
    except KeyError:
        raise LocalProtocolError(f"not a protocol message: {_tname(msg)}") from None
    wire: dict[str, object] = {names.TYPE_KEY: msg.TYPE}
    for name in field_names:
        value = getattr(msg, name)
        if value is None:
            continue  # an optional field left unset
        wire[name] = list(value) if type(value) is tuple else value
    return wire


__all__ = [
    "DEFAULT_LIMITS",
    "Limits",
    "bytes_within",
    "from_dict",
    "index_outside",
    "ints_within",
    "to_dict",
]
