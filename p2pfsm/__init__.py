"""p2pfsm: vLLM-compatible P2P KV-cache block sharing driven by explicit state machines.

The machines live in ``models/``; :mod:`p2pfsm.session` runs them sans-IO;
:mod:`p2pfsm.executor` binds them to ZeroMQ and NIXL (or to a simulated world).

The host API an engine imports is here, each name loaded on first use (so that
``import p2pfsm`` stays cheap): ``Node``, ``NodeConfig``, ``AsyncNode``,
``HostRegion``, ``DataPlane``, the results and callbacks' events, the metrics
(``NodeMetrics``; ``MetricsCollector`` and ``serve_metrics``, which need
``prometheus_client``, are left out of ``__all__``) and the host helpers
(``BlockHasher``, ``PinnedBlocks``).
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:
    from p2pfsm.aio import AsyncNode, FetchHandle
    from p2pfsm.blocks import BlockHasher, PinnedBlocks
    from p2pfsm.executor.nixl.memory import HostRegion
    from p2pfsm.executor.nixl.plane import DataPlane
    from p2pfsm.executor.node import LookupAnswer, LookupAsk, Node, NodeConfig, fingerprint
    from p2pfsm.metrics import NodeMetrics
    from p2pfsm.prometheus import MetricsCollector as MetricsCollector
    from p2pfsm.prometheus import serve_metrics as serve_metrics
    from p2pfsm.session import (
        FailReason,
        FetchArrived,
        LoadResult,
        LookupRequest,
        LookupResult,
        RoundEnded,
        SessionDead,
    )

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "Node": "p2pfsm.executor.node",
    "NodeConfig": "p2pfsm.executor.node",
    "LookupAnswer": "p2pfsm.executor.node",
    "LookupAsk": "p2pfsm.executor.node",
    "fingerprint": "p2pfsm.executor.node",
    "AsyncNode": "p2pfsm.aio",
    "FetchHandle": "p2pfsm.aio",
    "HostRegion": "p2pfsm.executor.nixl.memory",
    "DataPlane": "p2pfsm.executor.nixl.plane",
    "NodeMetrics": "p2pfsm.metrics",
    "MetricsCollector": "p2pfsm.prometheus",
    "serve_metrics": "p2pfsm.prometheus",
    "BlockHasher": "p2pfsm.blocks",
    "PinnedBlocks": "p2pfsm.blocks",
    "FailReason": "p2pfsm.session",
    "FetchArrived": "p2pfsm.session",
    "LoadResult": "p2pfsm.session",
    "LookupRequest": "p2pfsm.session",
    "LookupResult": "p2pfsm.session",
    "RoundEnded": "p2pfsm.session",
    "SessionDead": "p2pfsm.session",
}
"""Host API names loaded on first use: name -> the module that defines it."""


def __getattr__(name: str) -> object:
    """The host API's names (:data:`_LAZY`), imported on first use; ``p2pfsm.BUILD``:
    which build runs, ``"pure"`` (Python), ``"compiled"`` (the mypyc extension modules
    of ``p2pfsm/fsm`` and ``p2pfsm/protocol``) or ``"mixed"``; see :mod:`p2pfsm.native`."""
    module = _LAZY.get(name)
    if module is not None:
        import importlib

        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name == "BUILD":
        from p2pfsm.native import build_kind

        return build_kind()
    raise AttributeError(f"module 'p2pfsm' has no attribute {name!r}")


__all__ = [
    "BUILD",
    "AsyncNode",
    "BlockHasher",
    "ConfigError",
    "DataPlane",
    "FailReason",
    "FetchArrived",
    "FetchHandle",
    "HandshakeMismatch",
    "HostRegion",
    "InvalidTransition",
    "LoadResult",
    "LocalProtocolError",
    "LookupAnswer",
    "LookupAsk",
    "LookupRequest",
    "LookupResult",
    "MalformedFrame",
    "MetricsCollector",
    "ModelError",
    "Node",
    "NodeConfig",
    "NodeMetrics",
    "P2PFSMError",
    "PinnedBlocks",
    "RemoteProtocolError",
    "RoundEnded",
    "Session",
    "SessionConfig",
    "SessionDead",
    "Timeouts",
    "TransportError",
    "UnknownMessageType",
    "__version__",
    "fingerprint",
]
