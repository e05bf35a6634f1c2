"""Layouts: where a block's bytes are in several regions, and what host memory makes one.

The write-target property per region, at the byte level: every descriptor a layout
gives lies inside its region, and a layout that passes ``check_disjoint`` never has two
block-slices sharing a byte (checked against brute force on random small layouts).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pfsm.errors import ConfigError
from p2pfsm.executor.layout import Layout, Region
from p2pfsm.executor.memory import HostRegion, describe_regions

torch = pytest.importorskip("torch")


def slices_of(layout: Layout) -> list[tuple[int, int, int, int]]:
    """(start, end, block, region) of every block-slice, by brute force."""
    return [(reg.base_addr + i * reg.stride, reg.base_addr + i * reg.stride + reg.slice_len,
             i, r)
            for r, reg in enumerate(layout.regions) for i in range(layout.num_blocks)]


def overlapping(layout: Layout) -> bool:
    spans = sorted(slices_of(layout))
    return any(b[0] < a[1] for a, b in itertools.pairwise(spans))


regions = st.builds(Region, base_addr=st.integers(1, 256), stride=st.integers(1, 24),
                    slice_len=st.integers(1, 24))
layouts = st.builds(Layout, num_blocks=st.integers(1, 6),
                    regions=st.lists(regions, min_size=1, max_size=4).map(tuple))


@given(layouts)
def test_a_layout_that_passes_the_check_has_no_two_slices_sharing_a_byte(
        layout: Layout) -> None:
    try:
        layout.check_disjoint()
    except ConfigError:
        return
    assert not overlapping(layout)


@given(st.integers(1, 6), st.integers(1, 8), st.integers(1, 4), st.data())
def test_interleaved_regions_of_one_stride_are_accepted(
        num_blocks: int, slice_len: int, count: int, data: st.DataObject) -> None:
    """Slices side by side in each stride period (e.g. K and V of one block next to each
    other, or the layers of a (num_blocks, L, ...) tensor)."""
    gap = data.draw(st.integers(0, 8))
    stride = count * slice_len + gap
    layout = Layout(num_blocks, tuple(Region(1000 + r * slice_len, stride, slice_len)
                                      for r in range(count)))
    layout.check_disjoint()
    assert not overlapping(layout)


@given(layouts, st.integers(0, 3))
def test_every_descriptor_lies_inside_its_region(layout: Layout, dev: int) -> None:
    rows = layout.rows(dev)
    width = len(layout.regions)
    assert rows.shape == (layout.num_blocks * width, 3)
    for n, (addr, length, row_dev) in enumerate(rows.tolist()):
        r, block = divmod(n, layout.num_blocks)
        region = layout.regions[r]
        assert addr == region.base_addr + block * region.stride
        assert length == region.slice_len and row_dev == dev
        assert region.base_addr <= addr
        assert addr + length <= region.base_addr + region.extent(layout.num_blocks)


@given(layouts, st.data())
def test_a_batch_of_blocks_names_exactly_their_slices(layout: Layout, data: st.DataObject
                                                      ) -> None:
    blocks = data.draw(st.lists(st.integers(0, layout.num_blocks - 1), max_size=8))
    width = len(layout.regions)
    names = [int(d) for d in layout.descriptors(blocks)]
    if width == 1:
        assert names == blocks
    else:
        assert names == [r * layout.num_blocks + b for r in range(width) for b in blocks]


def test_the_plain_layout_is_left_off_the_wire_and_any_other_is_not() -> None:
    assert Layout.plain(4096, 8, 512).wire() is None
    assert Layout.plain(4096, 8, 512).block_len == 512
    strided = Layout(8, (Region(4096, 1024, 512),))
    assert strided.wire() == ((4096, 1024, 512),)
    two = Layout.announced(4096, 8, 1024, ((4096, 512, 512), (1 << 20, 512, 512)))
    assert two.slices == (512, 512) and two.block_len == 1024 and two.base_addr == 4096
    assert Layout.announced(4096, 8, 1024, None) == Layout.plain(4096, 8, 1024)


def test_overlaps_are_named() -> None:
    with pytest.raises(ConfigError, match="region 0: its 64-byte slices are 32 bytes apart"):
        Layout(4, (Region(4096, 32, 64),)).check_disjoint()
    with pytest.raises(ConfigError, match="regions 0 and 1 overlap"):
        Layout(4, (Region(4096, 64, 64), Region(4096 + 64, 64, 64))).check_disjoint()
    Layout(4, (Region(4096, 64, 64), Region(4096 + 256, 64, 64))).check_disjoint()


# -- describe_regions: what host memory makes a layout --------------------------------

NB = 8


def test_a_tensor_per_layer_with_k_and_v_apart_is_a_region_each() -> None:
    kv = [torch.zeros((2, NB, 4, 8), dtype=torch.float16) for _ in range(3)]
    parts = [t[h] for t in kv for h in range(2)]
    desc = describe_regions(parts, NB, 6 * 64)
    assert len(desc.layout.regions) == 6
    assert desc.layout.slices == (64,) * 6
    assert [r.base_addr for r in desc.layout.regions] == [p.data_ptr() for p in parts]
    assert all(r.stride == 64 for r in desc.layout.regions)
    assert desc.mem_type == "DRAM" and desc.tensors == tuple(parts)


def test_a_strided_view_keeps_its_stride() -> None:
    whole = torch.zeros((NB, 3, 16), dtype=torch.uint8)  # (blocks, layers, bytes)
    layers = [whole[:, n] for n in range(3)]
    desc = describe_regions(layers, NB, 48)
    assert [(r.stride, r.slice_len) for r in desc.layout.regions] == [(48, 16)] * 3


def test_host_regions_are_equal_slices_back_to_back() -> None:
    buf = torch.zeros(2 * NB * 32, dtype=torch.uint8)
    base = buf.data_ptr()
    desc = describe_regions([HostRegion(base, NB * 32), HostRegion(base + NB * 32, NB * 32)],
                            NB, 64)
    assert desc.layout.regions == (Region(base, 32, 32), Region(base + NB * 32, 32, 32))
    assert desc.tensors == ()


@pytest.mark.parametrize(("make", "words"), [
    (lambda: [], "at least one"),
    (lambda: [torch.zeros((NB + 1, 32), dtype=torch.uint8)], "region 0: .* expected 8 rows"),
    (lambda: [torch.zeros((NB, 32), dtype=torch.uint8),
              torch.zeros((NB, 4, 8), dtype=torch.uint8).transpose(1, 2)],
     "region 1: each block's row must be contiguous"),
    (lambda: [torch.zeros((NB, 16), dtype=torch.uint8)] * 2, "regions 0 and 1 overlap"),
    (lambda: [torch.zeros((NB, 16), dtype=torch.uint8)], "16 bytes per block"),
    (lambda: [HostRegion(4096, NB * 32 + 1)], "region 0: HostRegion size"),
    (lambda: ["kv"], "region 0: expected a torch.Tensor or a HostRegion"),
    (lambda: [torch.zeros((NB, 16), dtype=torch.uint8), HostRegion(4096, NB * 16, "cuda:0")],
     "several devices"),
    (lambda: [torch.zeros((NB, 0), dtype=torch.uint8)], "empty"),
])
def test_bad_regions_are_refused_naming_the_region(make: object, words: str) -> None:
    assert callable(make)
    with pytest.raises(ConfigError, match=words):
        describe_regions(make(), NB, 32)
