"""Host helpers for block keys and the blocks a producer holds.

:class:`BlockHasher` computes the keys of a prompt's full blocks the way vLLM's prefix
cache does, so that a p2pfsm engine and a vLLM peer name the same blocks alike: each
block's hash chains its parent's, starting from a root derived from the hash seed
(the connect's ``hash_seed``), and the key on the wire is the block hash followed by
the KV-cache group index as 4 big-endian bytes. With vLLM's default ``sha256``
algorithm a block hash is the SHA-256 of the pickled tuple ``(parent_hash,
token_ids, extra_keys)``, and the root is the SHA-256 of the pickled seed string.

:class:`PinnedBlocks` is a small index a producer keeps of the blocks it can serve:
key -> block index, with a pin count per block so that a block being served is not
evicted or reused before its round ends.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterable, Sequence
from typing import Final

from p2pfsm.errors import ConfigError
from p2pfsm.session import DEFAULT_HASH_SEED

__all__ = ["BlockHasher", "PinnedBlocks"]

_GROUP_BYTES: Final = 4


def _sha256_pickled(value: object) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


class BlockHasher:
    """The keys of a token sequence's full blocks, chained as vLLM's prefix cache chains
    them (algorithm ``sha256``, vLLM's default).

    Args:
        block_size: tokens per block (vLLM's ``block_size``).
        hash_seed: the seed the chain's root is derived from; peers must share it
            (vLLM: ``PYTHONHASHSEED`` when set, else ``"vllm-none-hash"``).
        group: the KV-cache group index appended to each key (0 for a model with one
            group).
    """

    def __init__(self, block_size: int, hash_seed: str = DEFAULT_HASH_SEED,
                 group: int = 0) -> None:
        if type(block_size) is not int or block_size <= 0:
            raise ConfigError(f"block_size: expected a positive int, got {block_size!r}")
        if not isinstance(hash_seed, str) or not hash_seed:
            raise ConfigError(f"hash_seed: expected a non-empty str, got {hash_seed!r}")
        if type(group) is not int or not 0 <= group < 1 << 32:
            raise ConfigError(f"group: expected an int in [0, 2**32), got {group!r}")
        self.block_size = block_size
        self.hash_seed = hash_seed
        self._suffix = group.to_bytes(_GROUP_BYTES, "big")
        self.root = _sha256_pickled(hash_seed)
        """The chain's root (vLLM's ``NONE_HASH``): every first block's parent."""

    def block_hashes(self, token_ids: Sequence[int],
                     extra_keys: Sequence[tuple[object, ...] | None] = (),
                     parent: bytes | None = None) -> list[bytes]:
        """The hash of each full block of ``token_ids`` (a last, partial block has none).

        ``extra_keys[i]`` is block ``i``'s extra keys as vLLM builds them (LoRA name,
        multimodal hashes, cache salt; None, the default, for plain text); ``parent``
        continues a chain (the hash of the block before ``token_ids[0]``).
        """
        out: list[bytes] = []
        previous = self.root if parent is None else parent
        for n in range(len(token_ids) // self.block_size):
            tokens = tuple(token_ids[n * self.block_size:(n + 1) * self.block_size])
            extra = extra_keys[n] if n < len(extra_keys) else None
            previous = _sha256_pickled((previous, tokens, extra))
            out.append(previous)
        return out

    def keys(self, token_ids: Sequence[int],
             extra_keys: Sequence[tuple[object, ...] | None] = ()) -> list[bytes]:
        """The wire keys of ``token_ids``' full blocks: each block hash followed by the
        group index (vLLM's offload key)."""
        return [h + self._suffix for h in self.block_hashes(token_ids, extra_keys)]


class PinnedBlocks:
    """A producer's index of the blocks it holds: key -> block index, and a pin count
    per block (a pinned block must not be evicted or overwritten).

    Not thread-safe: use it from the thread that drives the node (its callbacks).
    """

    def __init__(self) -> None:
        self._where: dict[bytes, int] = {}
        self._key_of: dict[int, bytes] = {}
        self._pins: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: object) -> bool:
        return key in self._where

    def add(self, key: bytes, block: int) -> None:
        """Index ``block`` as holding ``key``; replaces what the block held before
        (refused with ConfigError while the block is pinned)."""
        if not isinstance(key, bytes) or not key:
            raise ConfigError(f"key: expected non-empty bytes, got {key!r}")
        if type(block) is not int or block < 0:
            raise ConfigError(f"block: expected a non-negative int, got {block!r}")
        moved = self._where.get(key)
        if moved == block:
            return  # already indexed so
        for busy in (block, moved):
            if busy is not None and self._pins.get(busy):
                raise ConfigError(f"block {busy} is pinned; it cannot change keys")
        old = self._key_of.pop(block, None)
        if old is not None:
            del self._where[old]
        if moved is not None:
            del self._key_of[moved]
        self._where[key] = block
        self._key_of[block] = key

    def get(self, key: bytes) -> int | None:
        """The block holding ``key``, or None."""
        return self._where.get(key)

    def pin(self, keys: Iterable[bytes]) -> dict[bytes, int]:
        """Pin the blocks of those ``keys`` that are held; returns key -> block for
        them (what to ``supply``). Each pin is undone by one :meth:`unpin`."""
        found: dict[bytes, int] = {}
        for key in keys:
            block = self._where.get(key)
            if block is not None and key not in found:
                found[key] = block
                self._pins[block] = self._pins.get(block, 0) + 1
        return found

    def unpin(self, blocks: Iterable[int]) -> None:
        """Undo one pin of each of ``blocks`` (a block not pinned is a ConfigError,
        and nothing changes)."""
        listed = list(blocks)
        counts: dict[int, int] = {}
        for block in listed:
            counts[block] = counts.get(block, 0) + 1
        for block, count in counts.items():
            if self._pins.get(block, 0) < count:
                raise ConfigError(f"block {block} is not pinned {count} time(s)")
        for block, count in counts.items():
            left = self._pins[block] - count
            if left:
                self._pins[block] = left
            else:
                del self._pins[block]

    def pinned(self, block: int) -> bool:
        """Whether ``block`` is pinned."""
        return bool(self._pins.get(block))

    def evict(self, key: bytes) -> int | None:
        """Drop ``key`` from the index and return its block (free to reuse), or None
        when it is not held; a pinned block is a ConfigError and stays."""
        block = self._where.get(key)
        if block is None:
            return None
        if self._pins.get(block):
            raise ConfigError(f"block {block} is pinned; unpin it before evicting")
        del self._where[key]
        del self._key_of[block]
        return block
