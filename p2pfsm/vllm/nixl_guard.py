"""The own-agent refusal on vLLM's ``NixlTransport``, turned on by :func:`p2pfsm.vllm.install`.

A connect carrying this node's own NIXL agent metadata (under its name or renamed) makes
vLLM's ``NixlTransport`` register the node as its own peer: a fetch then writes the node's
blocks over its own blocks, and the store reports a success. Which metadata a data
transport accepts is that transport's decision, so the refusal lives here, on the NIXL
transport, and not in the session (which serves any ``DataTransport``). :func:`install`
wraps ``NixlTransport.add_remote_peer_async`` (vLLM's ``add_remote_peer`` goes through
it) so that metadata describing the transport's own agent gives a failed future, which
the session takes as a failed registration; everything else goes to vLLM's method as it
is (metadata that is not NIXL's included: vLLM's transport refuses what NIXL cannot
load). p2pfsm's own data transport (the full install, :mod:`p2pfsm.vllm.data`) refuses
the same in its :class:`~p2pfsm.executor.nixl_plane.DataPlane`, and a transport of
another kind decides for itself. Nothing is patched at import time; :func:`uninstall`
puts vLLM's method back.
"""

from __future__ import annotations

import importlib
from concurrent.futures import Future
from typing import Any

from p2pfsm.errors import TransportError
from p2pfsm.executor.nixl_agent import describes_same_agent

NIXL_MODULE = "vllm.v1.kv_offload.tiering.p2p.data.nixl"
OWN_AGENT = "peer metadata describes this node's own NIXL agent"

_originals: dict[str, Any] = {}


def own_agent(metadata: bytes, own: bytes) -> bool:
    """Whether ``metadata`` describes the agent whose metadata is ``own``; False when
    either is not NIXL's serialised metadata (the transport then decides)."""
    try:
        return describes_same_agent(bytes(metadata), bytes(own))
    except TransportError:
        return False


def _add_remote_peer_async(self: Any, peer_id: str, agent_metadata: bytes, base_addr: int,
                           num_blocks: int, block_len: int) -> Future[None]:
    """vLLM's registration, refused for this transport's own agent (module docstring)."""
    if own_agent(agent_metadata, self.get_agent_metadata()):
        refused: Future[None] = Future()
        refused.set_exception(TransportError(OWN_AGENT))
        return refused
    future: Future[None] = _originals["add_remote_peer_async"](
        self, peer_id, agent_metadata, base_addr, num_blocks, block_len)
    return future


def install() -> None:
    """Refuse own-agent metadata on every vLLM ``NixlTransport`` (idempotent)."""
    if _originals:
        return
    module: Any = importlib.import_module(NIXL_MODULE)
    _originals["add_remote_peer_async"] = module.NixlTransport.add_remote_peer_async
    module.NixlTransport.add_remote_peer_async = _add_remote_peer_async


def uninstall() -> None:
    """vLLM's ``NixlTransport`` as it ships (idempotent)."""
    if not _originals:
        return
    module: Any = importlib.import_module(NIXL_MODULE)
    module.NixlTransport.add_remote_peer_async = _originals.pop("add_remote_peer_async")


def installed() -> bool:
    """True while vLLM's ``NixlTransport`` refuses own-agent metadata."""
    return bool(_originals)
