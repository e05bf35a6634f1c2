"""p2pfsm: vLLM-compatible P2P KV-cache block sharing driven by explicit state machines.

The machines live in ``models/``; :mod:`p2pfsm.session` runs them sans-IO;
:mod:`p2pfsm.executor` binds them to ZeroMQ and NIXL (or to a simulated world).
"""

from p2pfsm.errors import (
    ConfigError,
    HandshakeMismatch,
    InvalidTransition,
    LocalProtocolError,
    MalformedFrame,
    ModelError,
    P2PFSMError,
    RemoteProtocolError,
    TransportError,
    UnknownMessageType,
)
from p2pfsm.session import Session, SessionConfig, Timeouts

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "HandshakeMismatch",
    "InvalidTransition",
    "LocalProtocolError",
    "MalformedFrame",
    "ModelError",
    "P2PFSMError",
    "RemoteProtocolError",
    "Session",
    "SessionConfig",
    "Timeouts",
    "TransportError",
    "UnknownMessageType",
    "__version__",
]
