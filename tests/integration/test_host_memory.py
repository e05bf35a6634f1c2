"""DataPlane over memory the host owns (a torch tensor or a raw HostRegion), real NIXL.

The host's plane lives in the test process, so every byte is checked in the host's own
memory object. Peers are spawned children: ``writer_node`` (below) WRITEs demo blocks into
the host's plane, and ``target_node`` from test_nixl_plane receives the host's WRITEs.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.demo_blocks import demo_block
from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.nixl.memory import HostRegion
from p2pfsm.executor.nixl.plane import DataPlane

from . import Child, wait_until

torch = needs_nixl_and_torch()

from .test_nixl_plane import _drive, _reported, _start_target  # noqa: E402

BLOCK = 4096
NB = 16
SENTINEL = 0xAB  # what the host's memory holds before anything is written into it
HAS_CUDA = torch.cuda.is_available()
NO_CUDA = f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__})"


# -- the writing peer ------------------------------------------------------------------


def writer_node(conn: Connection, name: str, num_blocks: int, block_len: int) -> None:
    """A plane whose block i holds demo block i; WRITEs into peers when told and
    reports every outcome as ("written", write_id, ok), its WRITEs numbered from 0."""
    plane = DataPlane(name, num_blocks, block_len)
    posted = 0
    for i in range(num_blocks):
        plane.region[i] = torch.frombuffer(bytearray(demo_block(i, block_len)), dtype=torch.uint8)
    conn.send(("ready", plane.metadata, plane.base_addr))
    try:
        while True:
            if conn.poll(plane.progress_interval_ms / 1000):
                cmd = conn.recv()
                if cmd[0] == "stop":
                    break
                if cmd[0] == "add":
                    plane.add_peer(*cmd[1:])
                    conn.send(("added",))
                elif cmd[0] == "remove":
                    plane.remove_peer(cmd[1])
                    conn.send(("removed",))
                elif cmd[0] == "write":
                    plane.write(posted, cmd[1], cmd[2], cmd[3])
                    posted += 1
            plane.progress()
            for write_id, ok in plane.poll():
                conn.send(("written", write_id, ok))
    finally:
        plane.close()


@dataclasses.dataclass
class Writer:
    child: Child
    metadata: bytes
    base_addr: int


@pytest.fixture(scope="module")
def writer() -> Iterator[Writer]:
    child = Child(writer_node, "writer", NB, BLOCK, name="writer")
    try:
        (_, metadata, base_addr) = child.expect("ready", 60.0)
        yield Writer(child, metadata, base_addr)
    finally:
        child.stop()


def _receive_write(plane: DataPlane, writer: Writer, local: list[int], remote: list[int]) -> None:
    """Connect ``plane`` and the writer both ways, have the writer WRITE its blocks
    ``local`` into our blocks ``remote``, and progress our (passive) side until it
    reports success."""
    child = writer.child
    plane.add_peer("writer", writer.metadata, writer.base_addr, NB, BLOCK)
    child.request(
        "add", plane.name, plane.metadata, plane.base_addr, plane.num_blocks, plane.block_len,
        reply="added",
    )  # fmt: skip
    try:
        child.send("write", plane.name, local, remote)

        def step() -> list[Any]:
            plane.progress()
            if child.conn.poll(plane.progress_interval_ms / 1000):
                return [child.recv(0.0, "a write report")]
            return []

        seen = wait_until(step, lambda s: bool(s), 10.0, "write report from the writer")
        assert len(seen) == 1 and seen[0][0] == "written" and seen[0][2] is True, seen
    finally:
        child.request("remove", plane.name, reply="removed")


def _check_landed(data: bytes, remote: list[int]) -> None:
    """Our block remote[k] holds demo block k; every other block still the sentinel."""
    assert len(data) == NB * BLOCK
    for k, dest in enumerate(remote):
        got = data[dest * BLOCK : (dest + 1) * BLOCK]
        assert got == demo_block(k, BLOCK), f"host block {dest} != demo block {k}"
    untouched = bytes([SENTINEL]) * BLOCK
    for dest in set(range(NB)) - set(remote):
        assert data[dest * BLOCK : (dest + 1) * BLOCK] == untouched, f"block {dest} was touched"


def _host_bytes(tensor: Any) -> bytes:
    return bytes(tensor.cpu().contiguous().view(torch.uint8).reshape(-1).numpy())


REMOTE = [15, 0, 7, 3, 8, 9]


# -- host tensors, written into by a peer ----------------------------------------------


def _uint8_blocks() -> Any:
    return torch.full((NB, BLOCK), SENTINEL, dtype=torch.uint8)


def _float32_flat() -> Any:
    tensor = torch.empty(NB * BLOCK // 4, dtype=torch.float32)
    tensor.view(torch.uint8).fill_(SENTINEL)
    return tensor


def _pinned() -> Any:
    return _uint8_blocks().pin_memory()


@pytest.mark.parametrize(
    "make",
    [
        _uint8_blocks,
        _float32_flat,
        pytest.param(
            _pinned,
            marks=pytest.mark.skipif(not HAS_CUDA, reason=f"pin_memory needs CUDA; {NO_CUDA}"),
        ),
    ],
    ids=["uint8-blocks", "float32-flat", "pinned"],
)
def test_peer_writes_into_host_tensor(writer: Writer, make: Callable[[], Any]) -> None:
    host = make()
    ptr = host.data_ptr()
    name = f"host-{make.__name__.strip('_')}"
    with DataPlane(name, NB, BLOCK, memory=host) as plane:
        assert plane.region is host
        assert plane.base_addr == ptr
        assert plane.device == "cpu"
        assert _host_bytes(host) == bytes([SENTINEL]) * (NB * BLOCK), "the plane wrote to it"
        _receive_write(plane, writer, list(range(len(REMOTE))), REMOTE)
        assert host.data_ptr() == ptr
        _check_landed(_host_bytes(host), REMOTE)
    # close() deregistered the memory but left it (and its bytes) with the host.
    assert host.data_ptr() == ptr
    _check_landed(_host_bytes(host), REMOTE)


def test_peer_writes_into_raw_host_region(writer: Writer) -> None:
    size = NB * BLOCK
    buf = (ctypes.c_ubyte * size)()
    ctypes.memset(buf, SENTINEL, size)
    addr = ctypes.addressof(buf)
    with DataPlane("host-raw", NB, BLOCK, memory=HostRegion(addr, size)) as plane:
        assert plane.region is None
        assert plane.base_addr == addr
        assert plane.device == "cpu"
        _receive_write(plane, writer, [4, 5, 6], [1, 14, 2])
        data = bytes(buf)
    assert data[BLOCK : 2 * BLOCK] == demo_block(4, BLOCK)
    assert data[14 * BLOCK : 15 * BLOCK] == demo_block(5, BLOCK)
    assert data[2 * BLOCK : 3 * BLOCK] == demo_block(6, BLOCK)
    rest = set(range(NB)) - {1, 14, 2}
    assert all(data[i * BLOCK : (i + 1) * BLOCK] == bytes([SENTINEL]) * BLOCK for i in rest)
    assert bytes(buf) == data, "closing the plane changed host memory"


# -- host memory as the source of a WRITE (no copy: later host edits are what goes out) -


def test_host_memory_is_the_source_of_writes(children: list[Child]) -> None:
    host = torch.zeros((NB, BLOCK), dtype=torch.uint8)
    raw = torch.zeros(NB * BLOCK, dtype=torch.uint8)  # owned here, given as a HostRegion
    region = HostRegion(raw.data_ptr(), raw.numel())
    with (
        DataPlane("src-tensor", NB, BLOCK, memory=host) as plane,
        DataPlane("src-raw", NB, BLOCK, memory=region) as raw_plane,
    ):
        child, md, base = _start_target(children, "sink", 2 * NB, BLOCK)
        plane.add_peer("sink", md, base, 2 * NB, BLOCK)
        raw_plane.add_peer("sink", md, base, 2 * NB, BLOCK)
        # Edit the host's memory only after registration: a copy would miss it.
        host[3] = torch.frombuffer(bytearray(demo_block(3, BLOCK)), dtype=torch.uint8)
        raw[5 * BLOCK : 6 * BLOCK] = torch.frombuffer(
            bytearray(demo_block(5, BLOCK)), dtype=torch.uint8
        )
        first = "from the tensor"
        plane.write(first, "sink", [3], [0])
        assert _drive(plane, child, _reported(first), 10.0, "WRITE from the host tensor") == [
            (first, True)
        ]
        second = "from the raw region"
        raw_plane.write(second, "sink", [5], [NB + 1])
        assert _drive(raw_plane, child, _reported(second), 10.0, "WRITE from the raw region") == [
            (second, True)
        ]
        (_, sink) = child.request("region", reply="region")
    assert sink[:BLOCK] == demo_block(3, BLOCK)
    assert sink[(NB + 1) * BLOCK : (NB + 2) * BLOCK] == demo_block(5, BLOCK)


# -- validation ------------------------------------------------------------------------


def _bad_memory_cases(owned: Any) -> list[tuple[dict[str, Any], str]]:
    addr = owned.data_ptr()
    size = NB * BLOCK
    u8 = torch.uint8
    return [
        ({"memory": torch.zeros(NB, 2 * BLOCK, dtype=u8)[:, ::2]}, "contiguous"),
        ({"memory": torch.zeros(BLOCK, NB, dtype=u8).t()}, "contiguous"),
        ({"memory": torch.zeros(size - 1, dtype=u8)}, "exactly"),
        ({"memory": torch.zeros(NB + 1, BLOCK, dtype=u8)}, "exactly"),
        ({"memory": torch.zeros(size, dtype=torch.float32)}, "exactly"),  # 4x the bytes
        ({"memory": torch.zeros(0, dtype=u8)}, "empty"),
        ({"memory": torch.zeros(0, BLOCK, dtype=u8)}, "empty"),
        ({"memory": torch.empty(size, dtype=u8, device="meta")}, "meta"),
        ({"memory": torch.zeros(NB, BLOCK, dtype=u8).to_sparse()}, "strided"),
        ({"memory": bytearray(size)}, "torch.Tensor or a HostRegion"),
        ({"memory": owned.numpy()}, "torch.Tensor or a HostRegion"),
        ({"memory": HostRegion(addr, size + 1)}, "exactly"),
        ({"memory": HostRegion(addr, size - BLOCK)}, "exactly"),
        ({"memory": owned, "device": "cuda:0"}, "disagrees"),
        ({"memory": owned, "device": "tpu"}, "device must be"),
        ({"memory": HostRegion(addr, size, "cuda:0"), "device": "cpu"}, "disagrees"),
        ({"memory": HostRegion(addr, size, "cuda:0"), "device": "cuda:1"}, "disagrees"),
        ({"memory": HostRegion(addr, size), "device": "cuda"}, "disagrees"),
    ]


def test_bad_memory_raises_config_error_and_registers_nothing() -> None:
    owned = torch.full((NB, BLOCK), SENTINEL, dtype=torch.uint8)
    for kwargs, match in _bad_memory_cases(owned):
        with pytest.raises(ConfigError, match=match):
            DataPlane("host-bad", NB, BLOCK, **kwargs)
    assert _host_bytes(owned) == bytes([SENTINEL]) * (NB * BLOCK)
    # Nothing was left registered: the same name and memory set up cleanly, twice.
    for _ in range(2):
        with DataPlane("host-bad", NB, BLOCK, "cpu", memory=owned) as plane:
            assert plane.region is owned and plane.base_addr == owned.data_ptr()
    with DataPlane("host-bad", NB, BLOCK, memory=HostRegion(owned.data_ptr(), NB * BLOCK)):
        pass


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ((0, 4096), "addr"),
        ((-4096, 4096), "addr"),
        ((True, 4096), "addr"),
        ((4096.0, 4096), "addr"),
        (("4096", 4096), "addr"),
        ((None, 4096), "addr"),
        ((4096, 0), "size"),
        ((4096, -1), "size"),
        ((4096, True), "size"),
        ((4096, 1.5), "size"),
        ((2**64 - 4096, 8192), "address space"),
        ((4096, 4096, "tpu"), "device must be"),
        ((4096, 4096, "cuda:"), "device must be"),
        ((4096, 4096, "cuda:-1"), "device must be"),
        ((4096, 4096, "CUDA:0"), "device must be"),
        ((4096, 4096, "cuda:\u0663"), "device must be"),  # a non-ASCII digit
        ((4096, 4096, 0), "device must be a str"),
        ((4096, 4096, None), "device must be a str"),
    ],
)
def test_host_region_fields_are_validated(fields: tuple[Any, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        HostRegion(*fields)


def test_host_region_is_frozen() -> None:
    region = HostRegion(4096, 8192, "cuda:1")
    assert (region.addr, region.size, region.device) == (4096, 8192, "cuda:1")
    assert HostRegion(4096, 8192).device == "cpu"
    with pytest.raises(dataclasses.FrozenInstanceError):
        region.addr = 8192  # type: ignore[misc]


# -- CUDA ------------------------------------------------------------------------------


@pytest.mark.skipif(HAS_CUDA, reason="torch has CUDA here; the CUDA path is tested instead")
def test_cuda_without_torch_cuda_raises_transport_error() -> None:
    owned = torch.zeros(NB * BLOCK, dtype=torch.uint8)
    requests: list[dict[str, Any]] = [
        {"device": "cuda:0"},
        {"device": "cuda"},
        {"device": "cuda:3"},
        {"memory": HostRegion(owned.data_ptr(), NB * BLOCK, "cuda:0")},
        {"memory": HostRegion(owned.data_ptr(), NB * BLOCK, "cuda"), "device": "cuda:0"},
    ]
    for kwargs in requests:
        with pytest.raises(TransportError, match=r"torch has no CUDA \(torch\.cuda\.is_available"):
            DataPlane("host-cuda", NB, BLOCK, **kwargs)
    with DataPlane("host-cuda", NB, BLOCK) as plane:  # nothing half set up is left behind
        assert plane.device == "cpu" and plane.region is not None


@pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)
def test_cuda_memory_is_registered_as_vram_and_written_from(children: list[Child]) -> None:
    """VRAM regions (the host's tensor, a raw HostRegion over it, and one the plane
    allocates) register as VRAM and WRITE their bytes into a DRAM peer. (A peer cannot
    WRITE into our VRAM here: peers describe remote blocks as DRAM.)"""
    count = torch.cuda.device_count()
    with pytest.raises(TransportError, match="sees"):
        DataPlane("gpu-missing", NB, BLOCK, device=f"cuda:{count}")

    vram = torch.zeros((NB, BLOCK), dtype=torch.uint8, device="cuda:0")
    for i in range(NB):
        vram[i] = torch.frombuffer(bytearray(demo_block(i, BLOCK)), dtype=torch.uint8).cuda()
    torch.cuda.synchronize()
    raw = HostRegion(vram.data_ptr(), NB * BLOCK, "cuda:0")
    with (
        DataPlane("gpu-tensor", NB, BLOCK, memory=vram) as from_tensor,
        DataPlane("gpu-raw", NB, BLOCK, "cuda:0", memory=raw) as from_raw,
        DataPlane("gpu-own", NB, BLOCK, "cuda:0") as allocated,
    ):
        assert from_tensor.region is vram and from_tensor.base_addr == vram.data_ptr()
        assert from_raw.region is None and from_raw.base_addr == vram.data_ptr()
        assert from_tensor.device == from_raw.device == allocated.device == "cuda:0"
        assert allocated.region is not None and allocated.region.is_cuda
        allocated.region[2] = vram[9]
        torch.cuda.synchronize()

        child, md, base = _start_target(children, "gpu-sink", 3 * NB, BLOCK)
        planes = [(from_tensor, [0, 1], [0, 1]), (from_raw, [7], [NB]), (allocated, [2], [2 * NB])]
        for plane, local, remote in planes:
            plane.add_peer("gpu-sink", md, base, 3 * NB, BLOCK)
            xfer = plane.name
            plane.write(xfer, "gpu-sink", local, remote)
            got = _drive(plane, child, _reported(xfer), 20.0, f"WRITE from {plane.name}")
            assert got == [(xfer, True)]
        (_, sink) = child.request("region", reply="region")
    expected = {0: 0, 1: 1, NB: 7, 2 * NB: 9}
    for dest, block in expected.items():
        assert sink[dest * BLOCK : (dest + 1) * BLOCK] == demo_block(block, BLOCK), dest
    assert vram.is_cuda and bytes(vram[7].cpu().numpy()) == demo_block(7, BLOCK)
