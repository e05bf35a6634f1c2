"""The P2P control protocol of vLLM 0.33.0, sans IO.

Nine msgpack messages (``messages``), their wire names (``names``), strict
validation of untrusted frames (``validate``) and the byte codec (``codec``).
Nothing here touches sockets, clocks or randomness.
"""

from __future__ import annotations

from p2pfsm.protocol import names
from p2pfsm.protocol.codec import decode, encode, fetch_round
from p2pfsm.protocol.fetch_checks import FetchRound, check_block_indexes, named_round
from p2pfsm.protocol.messages import (
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    Lookup,
    LookupResp,
    Message,
    TransferDone,
)
from p2pfsm.protocol.validate import DEFAULT_LIMITS, Limits, from_dict, to_dict

__all__ = [
    "DEFAULT_LIMITS",
    "AbortAck",
    "AbortFetch",
    "Connect",
    "ConnectAck",
    "Disconnect",
    "Fetch",
    "FetchRound",
    "Limits",
    "Lookup",
    "LookupResp",
    "Message",
    "TransferDone",
    "check_block_indexes",
    "decode",
    "encode",
    "fetch_round",
    "from_dict",
    "named_round",
    "names",
    "to_dict",
]
