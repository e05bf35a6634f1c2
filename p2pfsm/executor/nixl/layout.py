"""Where a block's bytes are: one region, or a slice in each of several regions.

Engines keep a KV cache as a tensor per layer, often with K and V apart, so block ``i``
is not one byte range but a slice in each of L tensors. A :class:`Layout` says where:
``num_blocks`` blocks and one or more :class:`Region`\\ s; region ``r`` holds
``slice_len`` bytes of block ``i`` at ``base_addr + i * stride``. A block is its slices
in every region, in region order, and its length (the protocol's ``block_len``) is the
sum of the slices.

Two peers exchange blocks only when their regions pair up: the same number of regions
and the same slice length in each (bases and strides are each side's own). A WRITE of
blocks ``l_k -> r_k`` then moves, for every region, the slice of ``l_k`` into the slice
of ``r_k``: the data plane describes each block-slice as one NIXL descriptor, region-major
(descriptor ``r * num_blocks + i`` is block ``i``'s slice in region ``r``), and lists a
batch's descriptors region by region, so NIXL merges the slices of consecutive blocks
that lie back to back on both sides into one transfer (measured: 256 blocks as 64
regions of 1 KiB slices WRITE as fast as one 64 KiB-block region; block-major order,
16,384 separate slices, was 16x slower).

Regions may have names (a host that passes its memory as a mapping names them). Two
peers that both name their regions pair them by name: the peer's layout is put in our
order (:meth:`Layout.paired_with`) before any descriptor is built, so that our region
``r`` always meets its namesake, whatever order each side listed them in. Unnamed
regions pair by position.

The plain layout, one region with ``stride == slice_len == block_len``, is the one
``base_addr``, ``num_blocks`` and ``block_len`` in a connect already describe, and the
only one vLLM 0.33.0 knows; any other layout travels in connect's optional ``layout``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from p2pfsm.errors import ConfigError

if TYPE_CHECKING:

    import numpy as np
    import numpy.typing as npt

__all__ = ["Layout", "Region", "WireLayout"]

WireLayout = tuple[tuple[int, int, int], ...]
"""Connect's ``layout`` field: ``(base_addr, stride, slice_len)`` per region."""


@dataclass(frozen=True, slots=True)
class Region:
    """Block ``i``'s slice in this region: ``slice_len`` bytes at ``base_addr + i * stride``."""

    base_addr: int
    stride: int
    slice_len: int

    def extent(self, num_blocks: int) -> int:
        """Bytes from ``base_addr`` to the end of the last block's slice."""
        return (num_blocks - 1) * self.stride + self.slice_len


@dataclass(frozen=True, slots=True)
class Layout:
    """``num_blocks`` blocks, each a slice in every one of ``regions``."""

    num_blocks: int
    regions: tuple[Region, ...]
    names: tuple[str, ...] | None = None  # one per region, in region order; None: unnamed

    @classmethod
    def plain(cls, base_addr: int, num_blocks: int, block_len: int,
              names: tuple[str, ...] | None = None) -> Layout:
        """One contiguous, block-major region (what vLLM 0.33.0 registers)."""
        return cls(num_blocks, (Region(base_addr, block_len, block_len),), names)

    @classmethod
    def announced(cls, base_addr: int, num_blocks: int, block_len: int,
                  wire: WireLayout | None, names: tuple[str, ...] | None = None) -> Layout:
        """The layout a connect describes: its ``layout`` field, or the plain region,
        with its ``layout_names``."""
        if wire is None:
            return cls.plain(base_addr, num_blocks, block_len, names)
        return cls(num_blocks, tuple(Region(*entry) for entry in wire), names)

    def paired_with(self, ours: Layout) -> Layout:
        """This (a peer's) layout with its regions in the order of their namesakes in
        ``ours``, when both are named and name the same regions; else itself
        (positional pairing, or names that differ, which the caller refuses)."""
        if (self.names is None or ours.names is None or self.names == ours.names
                or set(self.names) != set(ours.names)):
            return self
        where = {name: r for r, name in enumerate(self.names)}
        order = [where[name] for name in ours.names]
        return Layout(self.num_blocks, tuple(self.regions[r] for r in order), ours.names)

    @property
    def block_len(self) -> int:
        """Bytes per block: the sum of its slices."""
        return sum(r.slice_len for r in self.regions)

    @property
    def base_addr(self) -> int:
        """Where region 0 starts (connect's ``base_addr``)."""
        return self.regions[0].base_addr

    @property
    def slices(self) -> tuple[int, ...]:
        """Each region's slice length, in region order: what two peers must share."""
        return tuple(r.slice_len for r in self.regions)

    @property
    def slice_count(self) -> int:
        """Block-slices in all: one NIXL descriptor each."""
        return self.num_blocks * len(self.regions)

    @property
    def is_plain(self) -> bool:
        """One region whose blocks follow each other with no gap."""
        return len(self.regions) == 1 and self.regions[0].stride == self.regions[0].slice_len

    def wire(self) -> WireLayout | None:
        """Connect's ``layout`` field: None for the plain layout (left off the wire)."""
        if self.is_plain:
            return None
        return tuple((r.base_addr, r.stride, r.slice_len) for r in self.regions)

    def rows(self, dev_id: int) -> npt.NDArray[np.uint64]:
        """One ``(addr, len, dev)`` NIXL descriptor row per block-slice, region-major:
        row ``r * num_blocks + i`` is block ``i``'s slice in region ``r``."""
        import numpy as np

        count, width = self.num_blocks, len(self.regions)
        rows = np.empty((width, count, 3), dtype=np.uint64)
        blocks = np.arange(count, dtype=np.uint64)
        for r, region in enumerate(self.regions):
            rows[r, :, 0] = np.uint64(region.base_addr) + blocks * np.uint64(region.stride)
            rows[r, :, 1] = region.slice_len
        rows[:, :, 2] = dev_id
        return rows.reshape(width * count, 3)

    def descriptors(self, blocks: list[int]) -> list[int] | npt.NDArray[np.int32]:
        """The descriptor indexes of ``blocks``' slices, region by region (``blocks``
        itself, not a copy, when there is one region: a write's hot path). Region-major,
        so that consecutive blocks of a region that lie back to back stay neighbours,
        which NIXL merges into one transfer."""
        width = len(self.regions)
        if width == 1:
            return blocks
        import numpy as np

        starts = np.arange(width, dtype=np.int64)[:, None] * self.num_blocks
        return (starts + np.asarray(blocks, dtype=np.int64)).astype(np.int32).ravel()

    def check_disjoint(self) -> None:
        """Raise :class:`ConfigError` unless no two block-slices share a byte.

        Within a region, ``slice_len <= stride`` suffices. Two regions whose spans
        overlap must interleave: the same stride, and each one's slice inside the gap
        the other's slices leave in every stride period.
        """
        n = self.num_blocks
        for r, region in enumerate(self.regions):
            if n > 1 and region.slice_len > region.stride:
                raise ConfigError(f"region {r}: its {region.slice_len}-byte slices are "
                                  f"{region.stride} bytes apart, so blocks overlap")
        spans = sorted((reg.base_addr, reg.base_addr + reg.extent(n), r)
                       for r, reg in enumerate(self.regions))
        for i, (_start, end, r) in enumerate(spans):
            for other_start, _other_end, q in spans[i + 1:]:
                if other_start >= end:
                    break
                if not _interleave(self.regions[r], self.regions[q]):
                    raise ConfigError(f"regions {min(r, q)} and {max(r, q)} overlap")


def _interleave(first: Region, second: Region) -> bool:
    """Whether two regions with overlapping spans never share a byte (``first`` starts
    no later than ``second``)."""
    if first.stride != second.stride:
        return False
    offset = (second.base_addr - first.base_addr) % first.stride
    return offset >= first.slice_len and offset + second.slice_len <= first.stride
