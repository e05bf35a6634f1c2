"""A node: sessions bound to a real ZeroMQ control plane and a real NIXL data plane.

:class:`~p2pfsm.executor.node.node.Node` (the host API and the wiring of its parts) lives
in :mod:`p2pfsm.executor.node.node`, :class:`~p2pfsm.executor.node.config.NodeConfig`
in :mod:`~p2pfsm.executor.node.config`, each other part in a module of its own. The
names below are loaded on first use, so that importing one part (its config, its
redial book) does not load the node and everything it wires.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from p2pfsm.executor.node.config import NodeConfig, fingerprint
    from p2pfsm.executor.node.jobs import LookupAnswer, LookupAsk
    from p2pfsm.executor.node.node import Node

__all__ = ["LookupAnswer", "LookupAsk", "Node", "NodeConfig", "fingerprint"]

# A library stays silent until its host configures logging (no lastResort output).
logging.getLogger("p2pfsm").addHandler(logging.NullHandler())

_HOMES = {"Node": "node", "NodeConfig": "config", "fingerprint": "config",
          "LookupAnswer": "jobs", "LookupAsk": "jobs"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # found here directly from now on
    return value
