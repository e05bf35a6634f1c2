"""What a simulated world's hosts hold and the writes between them
(:class:`~p2pfsm.sim.world.SimWorld` drives them).

Block model (as vLLM's interop harness): key ``demo_key(i)`` has content
``demo_block(i)`` and a node that holds it keeps it at block ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from p2pfsm.demo_blocks import demo_block
from p2pfsm.session import (
    DestinationReleased,
    LoadResult,
    LookupRequest,
    LookupResult,
    ProtocolViolation,
    SessionDead,
    StoreResult,
)


class SafetyViolation(AssertionError):
    """A simulated run broke one of the protocol's safety properties."""


@dataclass(slots=True)
class SimWrite:
    """A write in flight between two nodes."""

    src: str
    xfer: int
    local_indexes: tuple[int, ...]
    remote_indexes: tuple[int, ...]
    owner_jobs: tuple[int | None, ...]
    landed: bool = False
    cancelled: bool = False


@dataclass(slots=True)
class Load:
    job_id: int
    kv_request_id: str
    key_ids: tuple[int, ...]
    dest: tuple[int, ...]


@dataclass(slots=True)
class SimHost:
    """One node's host: memory, block ownership and the results it received."""

    name: str
    num_blocks: int
    block_len: int
    held: frozenset[int]
    region: bytearray = field(default_factory=bytearray)
    free: list[int] = field(default_factory=list)
    owner: dict[int, int] = field(default_factory=dict)
    loads: dict[int, Load] = field(default_factory=dict)
    load_results: dict[int, LoadResult] = field(default_factory=dict)
    released_later: dict[int, DestinationReleased] = field(default_factory=dict)
    """Held destinations released after their result (DestinationReleased)."""
    store_jobs: dict[int, tuple[int, ...]] = field(default_factory=dict)
    store_results: dict[int, StoreResult] = field(default_factory=dict)
    lookups_sent: int = 0
    lookup_results: list[LookupResult] = field(default_factory=list)
    lookup_requests: dict[int, LookupRequest] = field(default_factory=dict)
    lookups_closed: set[int] = field(default_factory=set)
    violations: list[ProtocolViolation] = field(default_factory=list)
    deaths: list[SessionDead] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)
    """Requests this host finished: it supplies them no more."""

    def __post_init__(self) -> None:
        self.region = bytearray(self.num_blocks * self.block_len)
        for i in self.held:
            self.region[i * self.block_len:(i + 1) * self.block_len] = demo_block(i, self.block_len)
        self.free = [i for i in range(self.num_blocks) if i not in self.held]

    def release(self, dest: tuple[int, ...]) -> None:
        """The host reuses these blocks: a write landing in one later is a violation."""
        for d in dest:
            if self.owner.pop(d, None) is not None:
                self.free.append(d)

    def block(self, i: int) -> bytes:
        return bytes(self.region[i * self.block_len:(i + 1) * self.block_len])

    @property
    def quiet(self) -> bool:
        """Every job started here has its result."""
        return (self.loads.keys() <= self.load_results.keys()
                and self.store_jobs.keys() <= self.store_results.keys()
                and self.lookups_sent == len(self.lookup_results))
