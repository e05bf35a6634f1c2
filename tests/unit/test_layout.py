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
from p2pfsm.executor.nixl.layout import Layout, Region
from p2pfsm.executor.nixl.memory import HostRegion, describe_regions

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


# -- named regions ----------------------------------------------------------------------


def test_a_mapping_names_its_regions_in_its_order() -> None:
    cache = torch.zeros((2, 2, NB, 16), dtype=torch.uint8)  # (layers, K/V, blocks, bytes)
    named = {f"L{n}.{h}": cache[n, i] for n in range(2) for i, h in enumerate("KV")}
    desc = describe_regions(named, NB, 64)
    assert desc.layout.names == ("L0.K", "L0.V", "L1.K", "L1.V")
    assert [r.base_addr for r in desc.layout.regions] == [t.data_ptr() for t in named.values()]


@pytest.mark.parametrize("name", ["", 7, "x" * 257])
def test_a_region_name_must_be_a_short_nonempty_str(name: object) -> None:
    with pytest.raises(ConfigError, match="region names must be non-empty str"):
        describe_regions({name: torch.zeros((NB, 8), dtype=torch.uint8)}, NB, 8)


def test_a_named_region_that_is_wrong_is_named() -> None:
    named = {"L0.K": torch.zeros((NB, 8), dtype=torch.uint8),
             "L0.V": torch.zeros((2, NB, 8), dtype=torch.uint8)}
    with pytest.raises(ConfigError, match=r"memory region 'L0.V': .* blocks first"):
        describe_regions(named, NB, 16)


def test_a_peers_named_regions_are_put_in_our_order() -> None:
    ours = Layout(NB, (Region(100, 8, 8), Region(900, 16, 16)), ("K", "V"))
    theirs = Layout(NB, (Region(5000, 16, 16), Region(7000, 8, 8)), ("V", "K"))
    paired = theirs.paired_with(ours)
    assert paired.names == ("K", "V") and paired.slices == ours.slices
    assert paired.regions == (Region(7000, 8, 8), Region(5000, 16, 16))
    unnamed = Layout(NB, theirs.regions)
    assert unnamed.paired_with(ours) is unnamed  # positional
    other = Layout(NB, theirs.regions, ("V", "Q"))
    assert other.paired_with(ours) is other  # names that differ: refused by the caller


def test_one_tensor_whose_first_dimension_is_not_the_blocks_is_refused() -> None:
    from p2pfsm.executor.nixl.memory import describe_memory

    cache = torch.zeros((4, 2, NB, 16), dtype=torch.uint8)  # (layers, K/V, blocks, bytes)
    with pytest.raises(ConfigError, match=r"first dimension must be the block count, 8\. "
                                          r".* pass a mapping of named views"):
        describe_memory(cache, NB, 4 * 2 * 16)
    assert describe_memory(cache.reshape(-1), NB, 128).size == 4 * 2 * NB * 16  # flat: bytes


def test_a_later_dimension_equal_to_the_block_count_is_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    from p2pfsm.executor.nixl.memory import describe_memory

    cache = torch.zeros((NB, 2, NB, 4), dtype=torch.uint8)  # layers == blocks == 8
    describe_memory(cache, NB, 2 * NB * 4)
    assert "a later dimension is 8 too" in caplog.text
    caplog.clear()
    describe_memory(torch.zeros((NB, 2, 4, NB), dtype=torch.uint8), NB, 2 * 4 * NB)
    assert caplog.text == ""  # the innermost dimension is a row's bytes, not blocks
