"""NIXL's Python API, loaded, and what an agent's serialised metadata says of it.

NIXL ships as ``nixl`` (a shim) or ``nixl_cu12``; :func:`import_nixl` finds either
and names what is missing or broken. An agent's metadata starts with its name, which
:func:`agent_name_of` reads, so that a peer's metadata can be told apart from our own
(:func:`describes_same_agent`) before NIXL loads it. :func:`agent_refusal` is the one
rule every NIXL transport of p2pfsm's applies to a peer's registration: the
:class:`~p2pfsm.executor.nixl.plane.DataPlane` and vLLM's ``NixlTransport`` as
:func:`p2pfsm.vllm.install` wraps it (:mod:`p2pfsm.vllm.nixl_guard`). A session checks
only that a connect does not carry our metadata byte for byte (a session serves any
data transport and cannot read NIXL's metadata, nor see the other peers' sessions).
"""

from __future__ import annotations

import importlib
import logging
import struct
from collections.abc import Iterable
from typing import Any, Final

from p2pfsm.errors import NIXL_INSTALL_HINT, TransportError

__all__ = ["OWN_AGENT", "agent_name_of", "agent_refusal", "describes_same_agent",
           "import_nixl"]

OWN_AGENT: Final = "peer metadata describes this node's own NIXL agent"

_MD_PREFIX: Final = b"nixlSerDes|Agent"
_MD_LEN: Final = struct.Struct("<Q")


def import_nixl() -> Any:
    """The NIXL Python API module: the ``nixl`` shim if present, else ``nixl_cu12``."""
    failures: list[str] = []
    for module in ("nixl._api", "nixl_cu12._api"):
        try:
            api = importlib.import_module(module)
        except (ImportError, OSError) as exc:
            package = module.partition(".")[0]
            if not (isinstance(exc, ModuleNotFoundError) and exc.name == package):
                failures.append(f"{module}: {exc}")  # installed but broken: say why
            continue
        # NIXL logs every agent start at INFO; keep the CLI's output to what we print.
        logging.getLogger("nixl").setLevel(logging.WARNING)
        return api
    why = "; ".join(failures) or "No module named 'nixl_cu12'"
    raise TransportError(f"NIXL cannot be imported ({why}); install it with {NIXL_INSTALL_HINT}")


def agent_name_of(metadata: bytes) -> tuple[str, bytes]:
    """Split NIXL agent metadata into (agent name, everything after the name).

    NIXL serialises the agent name first: ``b"nixlSerDes|Agent"``, a little-endian u64
    length, the name, then ``b"|"`` and the connection and memory sections.
    """
    start = len(_MD_PREFIX) + _MD_LEN.size
    if not metadata.startswith(_MD_PREFIX) or len(metadata) < start:
        raise TransportError("agent metadata is not NIXL serialised metadata")
    (name_len,) = _MD_LEN.unpack_from(metadata, len(_MD_PREFIX))
    end = start + name_len
    if name_len == 0 or end >= len(metadata) or metadata[end : end + 1] != b"|":
        raise TransportError("agent metadata has a malformed agent name")
    try:
        name = metadata[start:end].decode("utf-8")
    except UnicodeDecodeError:
        raise TransportError("agent metadata names a non-UTF-8 agent") from None
    return name, metadata[end:]


def describes_same_agent(metadata: bytes, own: bytes) -> bool:
    """Whether ``metadata`` names the agent whose metadata is ``own``, or describes it
    under another name (the same bytes after the name: its backends and addresses).
    Raises :class:`TransportError` when either is not NIXL's metadata."""
    name, tail = agent_name_of(metadata)
    own_name, own_tail = agent_name_of(own)
    return name == own_name or tail == own_tail


def agent_refusal(metadata: bytes, own: bytes, peer_id: str,
                  claims: Iterable[tuple[str, bytes]]) -> str | None:
    """Why a transport whose agent's metadata is ``own`` refuses to register
    ``metadata`` as the agent of peer ``peer_id``; None when it does not.

    Refused: metadata that describes the transport's own agent (a WRITE to the peer
    would land in our own memory), or an agent that another peer id registered, under
    its name or another (a WRITE would land in that peer's memory on the sender's
    behalf); ``claims`` are the (peer id, metadata) pairs registered already. Raises
    :class:`TransportError` when ``metadata`` or ``own`` is not NIXL's metadata.
    """
    if describes_same_agent(metadata, own):
        return OWN_AGENT
    for other, theirs in claims:
        if other != peer_id and describes_same_agent(metadata, theirs):
            return (f"peer metadata describes NIXL agent {agent_name_of(metadata)[0]!r}, "
                    f"already peer {other!r}")
    return None
