"""What a fetch is held to beyond its frame's own checks (:mod:`~p2pfsm.protocol.validate`).

``named_round`` reads the round a fetch that failed those checks still names (so the
session can answer it); ``check_block_indexes`` is the one rule that needs session
state: the peer's advertised ``num_blocks``, known only after the handshake.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from p2pfsm.errors import MalformedFrame
from p2pfsm.protocol import names
from p2pfsm.protocol.limits import DEFAULT_LIMITS, Limits
from p2pfsm.protocol.messages import Fetch
from p2pfsm.protocol.validate import _int_text, _request_id, _round_seq, index_outside


@dataclass(frozen=True, slots=True)
class FetchRound:
    """The round a fetch names, read from a fetch that failed validation."""

    kv_request_id: str
    round_seq: int


def named_round(obj: Mapping[object, object], limits: Limits = DEFAULT_LIMITS) -> FetchRound | None:
    """The round a fetch map names although it fails :func:`from_dict` (or a session check).

    Returns:
        Its ``kv_request_id`` and ``round_seq`` when ``obj`` is of type ``fetch``, both
        fields pass their checks and ``keys`` is not an empty array (a terminal fetch is
        never answered); else None. Never raises.
    """
    if obj.get(names.TYPE_KEY) != names.FETCH:
        return None
    keys = obj.get("keys")
    if isinstance(keys, list | tuple) and not keys:
        return None
    try:
        fields_ = cast("Mapping[str, object]", obj)
        return FetchRound(_request_id(fields_, limits), _round_seq(fields_, limits))
    except MalformedFrame:
        return None


def check_block_indexes(fetch: Fetch, num_blocks: int) -> None:
    """Check that every index of ``fetch`` lies inside the peer's region.

    The indexes address the client's region, so ``num_blocks`` is what the
    client advertised in its ``connect``; the session calls this after the
    handshake, when that number is known.

    Raises:
        MalformedFrame: ``block_indexes[i]`` is ``>= num_blocks`` (the frame's own
            checks refused a negative one).
    """
    indexes = fetch.block_indexes
    i = index_outside(indexes, num_blocks)
    if i is not None:
        raise MalformedFrame(
            f"block_indexes[{i}]",
            f"{_int_text(indexes[i])} is outside the peer's {num_blocks} blocks",
        )


__all__ = ["FetchRound", "check_block_indexes", "named_round"]
