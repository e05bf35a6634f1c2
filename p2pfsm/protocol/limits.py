"""The size bounds applied to every frame from a peer (:class:`Limits`).

A module of its own so that it stays Python in the compiled build (``p2pfsm.native``): a
compiled dataclass converts its ``int`` fields on construction (``True`` is stored as
``1``, ``1.5`` raises ``TypeError``) before ``__post_init__`` could refuse them with a
:class:`~p2pfsm.errors.ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final

from p2pfsm.errors import ConfigError

_KIB: Final = 1024
_MIB: Final = 1024 * _KIB


@dataclass(frozen=True)
class Limits:
    """Upper bounds applied to every frame from a peer.

    Attributes:
        max_frame_bytes: longest frame accepted, checked before unpacking
            (room for the largest metadata blob plus the other fields).
        max_list_items: most entries in ``keys``, ``block_indexes`` or ``hits``.
        max_key_bytes: longest block key, in bytes (keys are 1 byte at least).
        max_str_len: longest text field, in UTF-8 bytes.
        max_metadata_bytes: largest ``agent_metadata`` blob.
        max_block_index: largest block index accepted in a fetch.
        max_num_blocks: most blocks a peer may advertise in ``connect``.
        max_round_seq: largest ``round_seq``.
        max_layout_regions: most regions in a connect's ``layout``.
    """

    max_frame_bytes: int = 64 * _MIB + 64 * _KIB
    max_list_items: int = 65536
    max_key_bytes: int = 4096
    max_str_len: int = 4096
    max_metadata_bytes: int = 64 * _MIB
    max_block_index: int = 2**31 - 1
    max_num_blocks: int = 2**31
    max_round_seq: int = 2**64 - 1
    max_layout_regions: int = 4096

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"Limits.{f.name} must be a positive int, got {value!r}")


DEFAULT_LIMITS: Final = Limits()

__all__ = ["DEFAULT_LIMITS", "Limits"]
