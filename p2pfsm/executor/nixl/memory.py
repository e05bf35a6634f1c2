"""Memory a host hands to the data plane, and the checks it must pass first.

An engine that already holds its KV cache gives :class:`~p2pfsm.executor.nixl.plane.DataPlane`
either a ``torch.Tensor`` or a :class:`HostRegion` (raw address + size); the plane
registers that memory with NIXL as it is, with no copy. :func:`describe_memory` turns
either form into a :class:`MemoryDesc` (address, size, NIXL memory type, device id) or
raises :class:`~p2pfsm.errors.ConfigError` naming what is wrong. torch is optional: it is
never imported here unless a CUDA device has to be checked.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.nixl.layout import Layout, Region

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

log = logging.getLogger(__name__)

MAX_REGION_NAME = 256
"""Longest region name, in characters."""

__all__ = [
    "HostRegion",
    "MemoryDesc",
    "RegionsDesc",
    "describe_memory",
    "describe_regions",
    "parse_device",
    "require_device",
]

_ADDR_LIMIT: Final = 1 << 64


def parse_device(device: object) -> tuple[str, int]:
    """``"cpu"`` -> ``("DRAM", 0)``; ``"cuda"`` / ``"cuda:N"`` -> ``("VRAM", N)``
    (plain ``"cuda"`` is GPU 0). Anything else is a :class:`ConfigError`."""
    if device == "cpu":
        return "DRAM", 0
    if device == "cuda":
        return "VRAM", 0
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind == "cuda" and index.isascii() and index.isdigit():
            return "VRAM", int(index)
    raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")


def device_name(mem_type: str, dev_id: int) -> str:
    """The canonical device string: ``"cpu"`` or ``"cuda:N"``."""
    return "cpu" if mem_type == "DRAM" else f"cuda:{dev_id}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class HostRegion:
    """Raw memory the host owns: ``size`` bytes at ``addr`` on ``device``.

    The host keeps it alive and mapped for as long as a data plane uses it; the plane
    never frees it. Raises :class:`ConfigError` for a non-positive or non-int ``addr`` or
    ``size``, a region past the end of the 64-bit address space, or a ``device`` that is
    not ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    """

    addr: int
    size: int
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not _is_int(self.addr) or self.addr <= 0:
            raise ConfigError(f"HostRegion.addr must be a positive int, got {self.addr!r}")
        if not _is_int(self.size) or self.size <= 0:
            raise ConfigError(f"HostRegion.size must be a positive int, got {self.size!r}")
        if self.addr + self.size > _ADDR_LIMIT:
            raise ConfigError(
                f"HostRegion [{self.addr:#x}, +{self.size}) runs past the 64-bit address space"
            )
        if not isinstance(self.device, str):
            raise ConfigError(f"HostRegion.device must be a str, got {self.device!r}")
        parse_device(self.device)


@dataclass(frozen=True, slots=True)
class MemoryDesc:
    """Checked host memory: where it is, how big, and how NIXL must register it."""

    base_addr: int
    size: int
    mem_type: str  # "DRAM" or "VRAM"
    dev_id: int
    tensor: torch.Tensor | None  # the host's tensor, or None for a HostRegion

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return device_name(self.mem_type, self.dev_id)


def describe_memory(
    memory: torch.Tensor | HostRegion, num_blocks: int, block_len: int
) -> MemoryDesc:
    """Check host memory for a ``num_blocks x block_len`` byte region and describe it.

    A tensor must be a non-empty, contiguous, strided tensor on a CPU or CUDA device
    whose byte size (``numel * element_size``; any dtype and shape) is exactly
    ``num_blocks * block_len``; a :class:`HostRegion` must have exactly that ``size``.
    Raises :class:`ConfigError` naming the first problem found.
    """
    expected = num_blocks * block_len
    if isinstance(memory, HostRegion):
        if memory.size != expected:
            raise ConfigError(
                f"HostRegion size is {memory.size} bytes, but {num_blocks} blocks x "
                f"{block_len} bytes need exactly {expected}"
            )
        mem_type, dev_id = parse_device(memory.device)
        return MemoryDesc(memory.addr, memory.size, mem_type, dev_id, None)

    # A value can only be a tensor if the host already imported torch.
    torch_mod = sys.modules.get("torch")
    if torch_mod is None or not isinstance(memory, torch_mod.Tensor):
        raise ConfigError(
            f"memory must be a torch.Tensor or a HostRegion, got {type(memory).__name__}"
        )
    tensor = _dense(memory, torch_mod, "memory tensor")
    if not tensor.is_contiguous():
        raise ConfigError(
            f"memory tensor must be contiguous (shape {tuple(tensor.shape)}, "
            f"strides {tensor.stride()}); NIXL registers one flat byte range"
        )
    size = tensor.numel() * tensor.element_size()
    if size != expected:
        raise ConfigError(
            f"memory tensor holds {size} bytes ({tensor.numel()} x {tensor.element_size()}), "
            f"but {num_blocks} blocks x {block_len} bytes need exactly {expected}"
        )
    if tensor.dim() >= 2 and tensor.shape[0] != num_blocks:
        raise ConfigError(
            f"memory tensor of shape {tuple(tensor.shape)}: one tensor is read block-major "
            f"(block i is bytes [i * block_len, (i + 1) * block_len)), so its first "
            f"dimension must be the block count, {num_blocks}. A cache laid out per layer "
            f"or with K and V apart is several regions: pass a mapping of named views, "
            f"e.g. {{'L0.K': cache[0, 0], 'L0.V': cache[0, 1], ...}}, each with the "
            f"blocks first (or a flat 1-D tensor if the bytes really are block-major)")
    _warn_ambiguous(tensor, num_blocks, "memory tensor")
    base, mem_type, dev_id = _placed(tensor, "memory tensor")
    return MemoryDesc(base, size, mem_type, dev_id, tensor)


def _warn_ambiguous(tensor: torch.Tensor, num_blocks: int, what: str) -> None:
    """Log a warning when a later dimension of ``tensor`` also equals the block count:
    the blocks may not be the first dimension after all (a ``(layers, 2, blocks, ...)``
    cache whose layer count equals its block count reads as garbage)."""
    shape = tuple(tensor.shape)
    if num_blocks > 1 and num_blocks in shape[1:min(3, len(shape) - 1)]:
        log.warning("%s of shape %s: its first dimension is read as the %d blocks, but a "
                    "later dimension is %d too; if the blocks are not the first dimension, "
                    "pass one view per layer and K/V with the blocks first", what,
                    shape, num_blocks, num_blocks)


def _dense(tensor: torch.Tensor, torch_mod: Any, what: str) -> torch.Tensor:
    """``tensor``, unless it is sparse or empty (a ConfigError naming ``what``)."""
    if tensor.layout != torch_mod.strided:
        raise ConfigError(f"{what} must be strided (dense), not {tensor.layout}")
    if tensor.numel() == 0:
        raise ConfigError(f"{what} is empty (shape {tuple(tensor.shape)})")
    return tensor


def _placed(tensor: torch.Tensor, what: str) -> tuple[int, str, int]:
    """Where a tensor's storage is: (address, NIXL memory type, device id), or a
    ConfigError naming ``what`` for a device NIXL cannot register or no address."""
    kind = tensor.device.type
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"{what} is on device {str(tensor.device)!r}; need cpu or cuda")
    base = int(tensor.data_ptr())
    if base <= 0:
        raise ConfigError(f"{what} has no storage address (data_ptr {base})")
    if kind == "cpu":
        return base, "DRAM", 0
    return base, "VRAM", int(tensor.get_device())


@dataclass(frozen=True, slots=True)
class RegionsDesc:
    """Checked host memory in several regions (a cache laid out per layer)."""

    layout: Layout
    mem_type: str  # "DRAM" or "VRAM", the same for every region
    dev_id: int
    tensors: tuple[torch.Tensor, ...]  # the host's tensors, kept referenced

    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return device_name(self.mem_type, self.dev_id)


def describe_regions(
    memories: Sequence[torch.Tensor | HostRegion] | Mapping[str, torch.Tensor | HostRegion],
    num_blocks: int, block_len: int,
) -> RegionsDesc:
    """Check a list (or a mapping name -> region) of regions for ``num_blocks`` blocks of
    ``block_len`` bytes in all.

    A mapping names the regions (non-empty str names of at most
    :data:`MAX_REGION_NAME` characters); block ``i``'s slices are in the mapping's
    order, and a peer that names its regions too pairs them by name. A list is
    positional: region ``r`` pairs with the peer's region ``r``.

    Block ``i`` is a slice in every region. A tensor's first dimension is the block
    dimension: it must have ``num_blocks`` rows, each row (``tensor[i]``) contiguous;
    its slice is a row's bytes and its stride ``tensor.stride(0)`` elements (so a view
    such as ``kv[0]`` of a ``(2, num_blocks, ...)`` tensor is a region). A
    :class:`HostRegion` is ``num_blocks`` equal slices back to back. Every region is on
    one device, no two slices share a byte, and the slices sum to ``block_len``.
    Raises :class:`ConfigError` naming the region and what is wrong.
    """
    if isinstance(memories, str | bytes) or len(memories) == 0:
        raise ConfigError("memory: a list of regions needs at least one tensor or HostRegion")
    names = _region_names(memories) if isinstance(memories, Mapping) else None
    values = list(memories.values()) if isinstance(memories, Mapping) else list(memories)
    regions: list[Region] = []
    tensors: list[torch.Tensor] = []
    devices: set[tuple[str, int]] = set()
    for r, memory in enumerate(values):
        try:
            region, device, tensor = _one_region(memory, num_blocks)
        except ConfigError as exc:
            which = r if names is None else repr(names[r])
            raise ConfigError(f"memory region {which}: {exc}") from None
        regions.append(region)
        devices.add(device)
        if tensor is not None:
            tensors.append(tensor)
    if len(devices) > 1:
        where = sorted(device_name(*d) for d in devices)
        raise ConfigError(f"memory regions are on several devices ({', '.join(where)}); "
                          f"one data plane registers one device")
    layout = Layout(num_blocks, tuple(regions), names)
    if layout.block_len != block_len:
        raise ConfigError(f"memory regions give {layout.block_len} bytes per block "
                          f"({len(regions)} slices), but block_len is {block_len}")
    layout.check_disjoint()
    (mem_type, dev_id), = devices
    return RegionsDesc(layout, mem_type, dev_id, tuple(tensors))


def _region_names(memories: Mapping[Any, object]) -> tuple[str, ...]:
    names: list[str] = []
    for name in memories:
        if not isinstance(name, str) or not name or len(name) > MAX_REGION_NAME:
            raise ConfigError(f"memory: region names must be non-empty str of at most "
                              f"{MAX_REGION_NAME} characters, got {name!r}")
        names.append(name)
    return tuple(names)


def _one_region(memory: object, num_blocks: int
                ) -> tuple[Region, tuple[str, int], torch.Tensor | None]:
    if isinstance(memory, HostRegion):
        if memory.size % num_blocks:
            raise ConfigError(f"HostRegion size {memory.size} is not {num_blocks} equal "
                              f"slices")
        slice_len = memory.size // num_blocks
        return Region(memory.addr, slice_len, slice_len), parse_device(memory.device), None
    torch_mod = sys.modules.get("torch")
    if torch_mod is None or not isinstance(memory, torch_mod.Tensor):
        raise ConfigError(f"expected a torch.Tensor or a HostRegion, got {type(memory).__name__}")
    tensor = _dense(memory, torch_mod, "tensor")
    if tensor.dim() == 0 or tensor.shape[0] != num_blocks:
        raise ConfigError(f"a tensor's first dimension is the block dimension: expected "
                          f"{num_blocks} rows, got shape {tuple(tensor.shape)}; pass a view "
                          f"with the blocks first (e.g. cache[layer, 0] of a "
                          f"(layers, 2, blocks, ...) cache)")
    _warn_ambiguous(tensor, num_blocks, "tensor")
    if not tensor[0].is_contiguous():
        raise ConfigError(f"each block's row must be contiguous (shape "
                          f"{tuple(tensor.shape)}, strides {tensor.stride()})")
    elem = tensor.element_size()
    slice_len = tensor[0].numel() * elem
    stride = tensor.stride(0) * elem if num_blocks > 1 else slice_len
    base, mem_type, dev_id = _placed(tensor, "tensor")
    return Region(base, stride, slice_len), (mem_type, dev_id), tensor


def require_device(mem_type: str, dev_id: int) -> None:
    """Raise :class:`TransportError` unless torch can use CUDA device ``dev_id``.

    DRAM always passes. For VRAM the check needs torch; without torch installed it is
    left to NIXL's registration (which then fails with a TransportError of its own).
    """
    if mem_type != "VRAM":
        return
    try:
        import torch
    except ImportError:
        return
    name = device_name(mem_type, dev_id)
    if not torch.cuda.is_available():
        build = "" if torch.version.cuda else f"; torch {torch.__version__} is a CPU build"
        raise TransportError(
            f"CUDA device {name} requested but torch has no CUDA "
            f"(torch.cuda.is_available() is False{build})"
        )
    count = torch.cuda.device_count()
    if dev_id >= count:
        raise TransportError(f"CUDA device {name} requested but torch sees {count} CUDA device(s)")
