"""Wire names of the P2P control protocol: the type key and the nine type strings.

Every frame is one msgpack map whose ``type`` entry names the message. These
strings are the wire facts of vLLM 0.33.0 (``vllm/v1/kv_offload/tiering/p2p/protocol.py``); the
rest of p2pfsm refers to them only through this module.
"""

from __future__ import annotations

from typing import Final

TYPE_KEY: Final = "type"

CONNECT: Final = "connect"
CONNECT_ACK: Final = "connect_ack"
DISCONNECT: Final = "disconnect"
FETCH: Final = "fetch"
LOOKUP: Final = "lookup"
LOOKUP_RESP: Final = "lookup_resp"
TRANSFER_DONE: Final = "transfer_done"
ABORT_FETCH: Final = "abort_fetch"
ABORT_ACK: Final = "abort_ack"

ALL_TYPES: Final[frozenset[str]] = frozenset(
    {
        CONNECT,
        CONNECT_ACK,
        DISCONNECT,
        FETCH,
        LOOKUP,
        LOOKUP_RESP,
        TRANSFER_DONE,
        ABORT_FETCH,
        ABORT_ACK,
    }
)

__all__ = [
    "ABORT_ACK",
    "ABORT_FETCH",
    "ALL_TYPES",
    "CONNECT",
    "CONNECT_ACK",
    "DISCONNECT",
    "FETCH",
    "LOOKUP",
    "LOOKUP_RESP",
    "TRANSFER_DONE",
    "TYPE_KEY",
]
