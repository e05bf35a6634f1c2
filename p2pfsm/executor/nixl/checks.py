"""What the NIXL data plane checks before it touches NIXL: its own sizes, a peer's
announcement of its memory, and the block indexes of a WRITE.

Each check raises before anything is registered, loaded or posted, so bad input never
leaves half a peer or half a transfer behind (:class:`~p2pfsm.executor.nixl.plane.DataPlane`
calls them first).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Final

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.nixl.layout import Layout, WireLayout
from p2pfsm.protocol.validate import index_outside, ints_within
from p2pfsm.session.machine import names_differ

__all__ = ["ADDR_LIMIT", "MAX_INDEX", "announced_layout", "block_indexes", "positive_int"]

MAX_INDEX: Final = (1 << 31) - 1  # NIXL takes descriptor indexes as int32
ADDR_LIMIT: Final = 1 << 64


def positive_int(name: str, value: object, high: int) -> int:
    """``value`` when it is an int in ``[1, high]``; else :class:`ConfigError`."""
    if type(value) is not int or not 0 < value <= high:
        raise ConfigError(f"{name} must be an int in [1, {high}], got {value!r}")
    return value


def announced_layout(
    ours: Layout, our_block_len: int, max_peer_blocks: int, *, peer_id: object,
    metadata: object, base_addr: int, num_blocks: int, block_len: int,
    layout: WireLayout | None, names: tuple[str, ...] | None = None,
) -> Layout:
    """A peer's memory as its connect announced it, checked against ours (``ours``,
    whose blocks are ``our_block_len`` bytes).

    Raises :class:`TransportError` for an empty or non-str ``peer_id``, metadata that
    is not bytes, a size that is not a positive int, a ``block_len`` other than ours,
    regions that do not pair up with ours (their number, or a slice length; by name
    when both sides named them, and then the names must be the same), more
    descriptors than ``max_peer_blocks`` (or our own count, when larger) or than NIXL
    indexes, or a region that would wrap past 2**64.
    """
    if not isinstance(peer_id, str) or not peer_id:
        raise TransportError(f"peer_id must be a non-empty str, got {peer_id!r}")
    if not isinstance(metadata, bytes):
        raise TransportError("metadata must be bytes")
    for field, value in (
        ("base_addr", base_addr),
        ("num_blocks", num_blocks),
        ("block_len", block_len),
    ):
        if type(value) is not int or value <= 0:
            raise TransportError(f"{field} must be a positive int, got {value!r}")
    if block_len != our_block_len:
        raise TransportError(f"block_len {block_len} differs from ours ({our_block_len})")
    theirs = Layout.announced(base_addr, num_blocks, block_len, layout, names)
    if theirs.names is not None and ours.names is not None:
        differ = names_differ(ours.names, theirs.names)
        if differ is not None:
            raise TransportError(f"the peer's regions are not ours by name: {differ[0]}; "
                                 f"{differ[1]}")
        theirs = theirs.paired_with(ours)
    if theirs.slices != ours.slices:
        raise TransportError(_unpaired(theirs, ours))
    width = len(theirs.regions)
    limit = max(max_peer_blocks, ours.slice_count)
    if theirs.slice_count > limit:
        regions = f" x {width} regions" if width > 1 else ""
        raise TransportError(f"num_blocks {num_blocks}{regions} exceeds {limit}")
    if theirs.slice_count > MAX_INDEX:
        raise TransportError(f"{num_blocks} blocks x {width} regions is more "
                             f"descriptors than NIXL indexes ({MAX_INDEX})")
    for region in theirs.regions:
        if region.base_addr + region.extent(num_blocks) > ADDR_LIMIT:
            raise TransportError("peer region wraps past the end of the address space")
    return theirs


def block_indexes(side: str, values: Sequence[int], limit: int) -> list[int]:
    """``values`` as a list of block indexes in ``[0, limit)``; else
    :class:`TransportError` naming ``side`` ("local" or "remote").

    The range is the session's rule (:func:`~p2pfsm.protocol.validate.index_outside`),
    held here again for the WRITEs no p2pfsm session checked: the vLLM drop-in's data
    transport (:mod:`p2pfsm.vllm.data`) driven by vLLM's own sessions, which check only
    that a fetch's indexes are non-negative ints."""
    kind = type(values)  # a tuple or list (the usual case) skips the ABC check
    if kind is not tuple and kind is not list and (
            isinstance(values, str | bytes) or not isinstance(values, Sequence)):
        raise TransportError(f"{side} indexes must be a sequence of ints")
    # Fast path (the usual case: plain ints from a session): one C-level pass each.
    if ints_within(values, 0, limit - 1):
        return list(values)
    out: list[int] = []
    for value in values:
        if isinstance(value, bool):
            raise TransportError(f"{side} index {value!r} is a bool")
        try:
            out.append(operator.index(value))
        except TypeError:
            raise TransportError(f"{side} index {value!r} is not an int") from None
    i = index_outside(out, limit)
    if i is not None:
        raise TransportError(f"{side} index {out[i]} out of range [0, {limit})")
    return out


def _unpaired(theirs: Layout, ours: Layout) -> str:
    """Why a peer's regions cannot receive or send our blocks."""
    def said(layout: Layout) -> str:
        if layout.is_plain:
            return "one plain region"
        return f"{len(layout.regions)} regions of slices {list(layout.slices)}"
    return (f"the peer's memory is {said(theirs)}, ours is {said(ours)}: "
            f"a block's slices must pair up region by region")
