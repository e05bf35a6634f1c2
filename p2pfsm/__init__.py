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



def __getattr__(name: str) -> str:
    """``p2pfsm.BUILD``: which build runs, ``"pure"`` (Python), ``"compiled"`` (the mypyc
    extension modules of ``p2pfsm/fsm`` and ``p2pfsm/protocol``) or ``"mixed"``; see
    :mod:`p2pfsm.native`."""
    if name == "BUILD":
        from p2pfsm.native import build_kind

        return build_kind()
    raise AttributeError(f"module 'p2pfsm' has no attribute {name!r}")


__all__ = [
    "BUILD",
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
