"""The nine control messages as frozen, slotted dataclasses.

Each class mirrors one wire map. Its fields are declared in the order vLLM
0.33.0 writes the map's keys (its ``vllm/v1/kv_offload/tiering/p2p/protocol.py``, as the captures in
``tests/data`` show), after the
``type`` key, so ``validate.to_dict`` can rebuild byte-identical frames. The
``TYPE`` class variable holds the wire type string.

The classes hold data only: they do not check their values. Frames from a peer
reach them through ``validate.from_dict``, which checks every field before any
instance is built. Lists are tuples here, so messages are hashable and immutable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from p2pfsm.protocol import names
from p2pfsm.protocol.frozen import quick_init


@quick_init
@dataclass(frozen=True, slots=True)
class Connect:
    """Handshake opener, sent by both sides (client first, server in reply).

    Attributes:
        peer_id: the sender's ``host:port`` identity.
        agent_metadata: the sender's opaque NIXL agent metadata blob.
        base_addr: start address of the sender's KV block region.
        num_blocks: number of blocks in that region.
        block_len: bytes per block; must equal ours.
        config_fingerprint: model configuration digest, or "" to skip the check.
        hash_seed: the prefix-cache hash seed; must equal ours.
        incarnation: optional, p2pfsm only: a random number the sending process drew at
            start, so that a restarted peer is recognised on its connect. None: absent
            from the wire (vLLM 0.33.0 neither sends it nor reads it).
        layout: optional, p2pfsm only: the sender's memory as regions, one
            ``(base_addr, stride, slice_len)`` per region; block ``i`` is the
            ``slice_len`` bytes at ``base_addr + i * stride`` in every region, and
            ``block_len`` is the sum of the slices. None: absent from the wire, the
            region is the one ``base_addr``, ``num_blocks`` and ``block_len`` describe
            (the only layout vLLM 0.33.0 knows; it ignores the field).
        layout_names: optional, p2pfsm only: a name for each region, in the order of
            ``layout`` (one name when ``layout`` is absent: the plain region). Two
            peers that both name their regions pair them by name, not by position.
            None: absent from the wire (vLLM sends and reads no names).
        config_digests: optional, p2pfsm only: ``(field, digest)`` for each field of the
            sender's model configuration (sorted by field; the digest as the
            fingerprint's, of that field's value alone), so that a fingerprint mismatch
            can name the fields that differ. None: absent from the wire (vLLM).
    """

    TYPE: ClassVar[str] = names.CONNECT

    peer_id: str
    agent_metadata: bytes
    base_addr: int
    num_blocks: int
    block_len: int
    config_fingerprint: str
    hash_seed: str
    incarnation: int | None = None
    layout: tuple[tuple[int, int, int], ...] | None = None
    layout_names: tuple[str, ...] | None = None
    config_digests: tuple[tuple[str, str], ...] | None = None


@quick_init
@dataclass(frozen=True, slots=True)
class ConnectAck:
    """Handshake acknowledgement, sent once the peer's metadata is registered."""

    TYPE: ClassVar[str] = names.CONNECT_ACK

    peer_id: str


@quick_init
@dataclass(frozen=True, slots=True)
class Disconnect:
    """Graceful close, either direction; carries no field besides ``type``."""

    TYPE: ClassVar[str] = names.DISCONNECT


@quick_init
@dataclass(frozen=True, slots=True)
class Fetch:
    """Client to server: write these keys into these client block indexes.

    ``keys[i]`` goes to ``block_indexes[i]`` in the client's region. An empty
    fetch (no keys) is the terminal "request finished" signal for the id.
    """

    TYPE: ClassVar[str] = names.FETCH

    kv_request_id: str
    keys: tuple[bytes, ...]
    block_indexes: tuple[int, ...]
    round_seq: int

    @property
    def is_terminal(self) -> bool:
        """True for the empty fetch that ends the request on the server."""
        return not self.keys


@quick_init
@dataclass(frozen=True, slots=True)
class Lookup:
    """Client to server: which of these keys do you hold? (symmetric P2P)."""

    TYPE: ClassVar[str] = names.LOOKUP

    kv_request_id: str
    keys: tuple[bytes, ...]
    round_seq: int


@quick_init
@dataclass(frozen=True, slots=True)
class LookupResp:
    """Server to client: ``hits[i]`` answers ``keys[i]``: a lookup's keys in its order,
    a part of them, or the keys of several lookups of the request (a producer may split
    and coalesce its answers)."""

    TYPE: ClassVar[str] = names.LOOKUP_RESP

    kv_request_id: str
    keys: tuple[bytes, ...]
    hits: tuple[bool, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class TransferDone:
    """Server to client: round ``round_seq`` of the request ended (or failed)."""

    TYPE: ClassVar[str] = names.TRANSFER_DONE

    kv_request_id: str
    success: bool
    round_seq: int


@quick_init
@dataclass(frozen=True, slots=True)
class AbortFetch:
    """Client to server: cancel round ``round_seq`` of the request."""

    TYPE: ClassVar[str] = names.ABORT_FETCH

    kv_request_id: str
    round_seq: int


@quick_init
@dataclass(frozen=True, slots=True)
class AbortAck:
    """Server to client: the round is cancelled and no write can still land."""

    TYPE: ClassVar[str] = names.ABORT_ACK

    kv_request_id: str
    round_seq: int


Message: TypeAlias = (
    Connect
    | ConnectAck
    | Disconnect
    | Fetch
    | Lookup
    | LookupResp
    | TransferDone
    | AbortFetch
    | AbortAck
)

__all__ = [
    "AbortAck",
    "AbortFetch",
    "Connect",
    "ConnectAck",
    "Disconnect",
    "Fetch",
    "Lookup",
    "LookupResp",
    "Message",
    "TransferDone",
]
