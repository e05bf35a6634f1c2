"""Agent refusals on vLLM's ``NixlTransport``, turned on by :func:`p2pfsm.vllm.install`.

A connect carrying this node's own NIXL agent metadata (under its name or renamed) makes
vLLM's ``NixlTransport`` register the node as its own peer: a fetch then writes the
node's blocks over its own blocks, and the store reports a success. A connect carrying
another registered peer's agent (a victim's metadata, ``base_addr`` and ``num_blocks``)
makes it write into the victim's memory on the sender's behalf, and the sender's removal
unloads the victim's agent. Which metadata a data transport accepts is that transport's
decision, so the refusals live here, on the NIXL transport, and not in the session
(which serves any ``DataTransport``). :func:`install` wraps
``NixlTransport.add_remote_peer_async`` (vLLM's ``add_remote_peer`` goes through it):
metadata describing the transport's own agent, or an agent another peer id registered or
is registering on it, gives a failed future, which the session takes as a failed
registration; ``remove_remote_peer`` frees a peer id's claim. Everything else goes to
vLLM's method as it is (metadata that is not NIXL's included: vLLM's transport refuses
what NIXL cannot load). The rule is :func:`~p2pfsm.executor.nixl.agent.agent_refusal`,
which p2pfsm's own :class:`~p2pfsm.executor.nixl.plane.DataPlane` (the node's, and the
full install's :mod:`p2pfsm.vllm.data`) applies too; a transport of another kind decides
for itself. The session's own check (a connect carrying our metadata byte for byte) does
not cover it: a renamed agent, or another peer's agent, passes the session, and a
session vLLM built before :func:`install` checks nothing of it. Nothing is patched at
import time; :func:`uninstall` puts vLLM's methods back.
"""

from __future__ import annotations

import importlib
from concurrent.futures import Future
from typing import Any

from p2pfsm.errors import TransportError
from p2pfsm.executor.nixl.agent import agent_name_of, agent_refusal

NIXL_MODULE = "vllm.v1.kv_offload.tiering.p2p.data.nixl"

_originals: dict[str, Any] = {}


def _claims(transport: Any) -> dict[str, bytes]:
    """The NIXL metadata each peer id registered (or is registering) on ``transport``."""
    claims = transport.__dict__.get("_p2pfsm_claims")
    if claims is None:
        claims = transport.__dict__["_p2pfsm_claims"] = {}
    return claims  # type: ignore[no-any-return]


def _refused(reason: str) -> Future[None]:
    refused: Future[None] = Future()
    refused.set_exception(TransportError(reason))
    return refused


def _add_remote_peer_async(self: Any, peer_id: str, agent_metadata: bytes, base_addr: int,
                           num_blocks: int, block_len: int) -> Future[None]:
    """vLLM's registration, refused for this transport's own agent and for an agent
    another peer id registered (module docstring)."""
    metadata = bytes(agent_metadata)
    claims = _claims(self)
    if is_nixl(metadata):  # else vLLM's transport refuses what NIXL cannot load
        try:
            refused = agent_refusal(metadata, bytes(self.get_agent_metadata()), peer_id,
                                    claims.items())
        except TransportError:  # our own metadata is not NIXL's: the transport decides
            refused = None
        if refused is not None:
            return _refused(refused)
    future: Future[None] = _originals["add_remote_peer_async"](
        self, peer_id, agent_metadata, base_addr, num_blocks, block_len)
    if is_nixl(metadata):
        claims[peer_id] = metadata

        def settle(done: Future[None]) -> None:  # a failed registration claims nothing
            if done.exception() is not None and claims.get(peer_id) is metadata:
                del claims[peer_id]

        future.add_done_callback(settle)
    return future


def _remove_remote_peer(self: Any, peer_id: str) -> None:
    """vLLM's removal; the peer id's agent is free for another peer id again."""
    _claims(self).pop(peer_id, None)
    _originals["remove_remote_peer"](self, peer_id)


def is_nixl(metadata: bytes) -> bool:
    """Whether ``metadata`` is NIXL's serialised agent metadata."""
    try:
        agent_name_of(metadata)
    except TransportError:
        return False
    return True


def install() -> None:
    """Refuse own-agent metadata on every vLLM ``NixlTransport`` (idempotent)."""
    if _originals:
        return
    module: Any = importlib.import_module(NIXL_MODULE)
    cls = module.NixlTransport
    _originals.update(add_remote_peer_async=cls.add_remote_peer_async,
                      remove_remote_peer=cls.remove_remote_peer)
    cls.add_remote_peer_async = _add_remote_peer_async
    cls.remove_remote_peer = _remove_remote_peer


def uninstall() -> None:
    """vLLM's ``NixlTransport`` as it ships (idempotent)."""
    if not _originals:
        return
    module: Any = importlib.import_module(NIXL_MODULE)
    module.NixlTransport.add_remote_peer_async = _originals.pop("add_remote_peer_async")
    module.NixlTransport.remove_remote_peer = _originals.pop("remove_remote_peer")


def installed() -> bool:
    """True while vLLM's ``NixlTransport`` refuses own-agent metadata."""
    return bool(_originals)
