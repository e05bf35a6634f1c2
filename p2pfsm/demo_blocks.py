"""Deterministic demo keys and block contents shared with the vLLM interop harness.

Both sides of an interop run derive the same key and the same bytes for block ``i``
without talking to each other, so a receiver can verify every byte it was sent:

* ``demo_key(i)``: the 32-byte SHA-256 of ``b"vllm-interop-key:" + i (8 bytes, big
  endian)`` followed by 4 zero bytes (vLLM's OffloadKey is 36 bytes long);
* ``demo_block(i, block_len)``: ``block_len`` bytes of SHAKE-256 over
  ``b"vllm-interop-block:" + i (8 bytes, big endian)``.

Pure functions of the standard library; no torch, numpy or NIXL.
"""

from __future__ import annotations

import hashlib

__all__ = ["KEY_LEN", "demo_block", "demo_key"]

KEY_LEN = 36
"""Length in bytes of a demo key (and of a vLLM OffloadKey)."""

_KEY_PREFIX = b"vllm-interop-key:"
_BLOCK_PREFIX = b"vllm-interop-block:"


def _index_bytes(i: int) -> bytes:
    if type(i) is not int or not 0 <= i < 1 << 64:
        raise ValueError(f"block number must be an int in [0, 2**64), got {i!r}")
    return i.to_bytes(8, "big")


def demo_key(i: int) -> bytes:
    """The 36-byte key of demo block ``i``."""
    return hashlib.sha256(_KEY_PREFIX + _index_bytes(i)).digest() + bytes(4)


def demo_block(i: int, block_len: int) -> bytes:
    """The ``block_len`` content bytes of demo block ``i``."""
    if type(block_len) is not int or block_len <= 0:
        raise ValueError(f"block_len must be a positive int, got {block_len!r}")
    return hashlib.shake_256(_BLOCK_PREFIX + _index_bytes(i)).digest(block_len)
