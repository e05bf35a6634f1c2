"""The remote agents loaded into a data plane's NIXL agent, kept for reuse.

Unloading a remote agent (``remove_remote_agent``) does not end the UCX connection: the
remote end keeps the endpoint that the wire-up made for us, so both processes keep one
TCP connection per load until one of the two agents goes away (measured here: one more
descriptor on each side per load and unload of a live agent, 500 after 500). So
:meth:`~p2pfsm.executor.nixl.plane.DataPlane.remove_peer` keeps the agent loaded and a
later :meth:`~p2pfsm.executor.nixl.plane.DataPlane.add_peer` with byte-identical
metadata reuses it (a reconnecting peer, or many ids naming one agent); metadata that
differs for the same name loads afresh. A registration refused after the load (the peer
announced blocks its agent did not register) leaves the agent loaded too: connects that
carry one agent cost one load however many there are, and an agent is never loaded again
while NIXL holds a load of its name (a kept one NIXL dropped itself after a remote
disconnect is loaded afresh). At most ``keep_agents`` agents that no peer uses stay
loaded (least recently used are unloaded first), and an agent whose transfers failed is
unloaded with its peer, as is the agent a peer id registered before once it registers
another (a restart with a new agent). No agent is loaded while the process is short of
descriptors (:mod:`p2pfsm.executor.fds`).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Set
from typing import Any

from p2pfsm.errors import TransportError
from p2pfsm.executor.fds import require_headroom
from p2pfsm.executor.nixl.layout import Layout

__all__ = ["LoadedAgents", "nixl_covers", "nixl_holds"]


def nixl_holds(agent: Any, agent_name: str, descs: Any = None) -> bool:
    """NIXL's ``agent`` holds ``agent_name``'s metadata (covering every descriptor of
    ``descs``, when given); a check that fails counts as no. Logs nothing, unlike a
    prep that fails."""
    try:
        if descs is None:
            return bool(agent.check_remote_metadata(agent_name))
        return bool(agent.check_remote_metadata(agent_name, descs))
    except Exception:
        return False


def nixl_covers(agent: Any, agent_name: str, layout: Layout) -> bool:
    """NIXL's ``agent`` holds ``agent_name``'s metadata covering every block of
    ``layout``: checked by each region's whole span, one descriptor per region, so an
    announcement of a million blocks the agent did not register costs a few rows (the
    descriptor per block is built only for one it did)."""
    rows = [(r.base_addr, r.extent(layout.num_blocks), 0) for r in layout.regions]
    try:
        spans = agent.get_xfer_descs(rows, "DRAM")
    except Exception:
        return False
    return nixl_holds(agent, agent_name, spans)


class LoadedAgents:
    """Remote agents loaded into one NIXL agent (passed to each call, since the data
    plane drops it on close), least recently used first, with the metadata each was
    loaded from."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._loaded: OrderedDict[str, bytes] = OrderedDict()
        self._owner: dict[str, str] = {}  # agent name -> the peer id that last loaded it

    def names(self) -> list[str]:
        """The loaded agents' names, least recently used first."""
        return list(self._loaded)

    def load(self, agent: Any, peer_id: str, agent_name: str, metadata: bytes) -> bool:
        """Make ``agent_name`` loaded with exactly ``metadata``; True when it was loaded
        now, False when an agent kept from an earlier peer is reused (only while NIXL
        holds it: one NIXL dropped itself, after a remote disconnect, is loaded afresh)."""
        kept = self._loaded.get(agent_name)
        if kept == metadata:
            if nixl_holds(agent, agent_name):
                self._loaded.move_to_end(agent_name)
                self._owner[agent_name] = peer_id
                return False
            self.forget(agent, agent_name)
            kept = None
        # UCX aborts the process on an endpoint it could only half make.
        require_headroom(f"not loading agent {agent_name!r} for {peer_id!r}")
        if kept is not None:  # the same name with other metadata: a new agent
            self.forget(agent, agent_name)
        try:
            loaded = agent.add_remote_agent(metadata)
        except Exception as exc:
            raise TransportError(f"add_remote_agent failed for {peer_id!r}: {exc!r}") from exc
        loaded_name = loaded.decode("utf-8") if isinstance(loaded, bytes) else str(loaded)
        if loaded_name != agent_name:
            self.forget(agent, loaded_name)
            raise TransportError(f"NIXL loaded {loaded_name!r}, expected {agent_name!r}")
        self._loaded[agent_name] = metadata
        self._owner[agent_name] = peer_id
        return True

    def unload_replaced(self, agent: Any, peer_id: str, agent_name: str,
                        used: Set[str]) -> None:
        """``peer_id`` registered ``agent_name``: the agents it loaded before (a replaced
        incarnation's) are unloaded unless in ``used``, so a peer holds one loaded agent
        however often it comes back with a new one."""
        for name in [n for n, owner in self._owner.items() if owner == peer_id]:
            if name != agent_name and name not in used:
                self.forget(agent, name)

    def trim(self, agent: Any, used: Set[str]) -> None:
        """Unload the least recently used agents not in ``used``, beyond ``keep``."""
        unused = [name for name in self._loaded if name not in used]
        for name in unused[: max(0, len(unused) - self._keep)]:
            self.forget(agent, name)

    def forget(self, agent: Any, agent_name: str) -> None:
        """Unload ``agent_name`` (NIXL may already have dropped it itself after a remote
        disconnect)."""
        self._loaded.pop(agent_name, None)
        self._owner.pop(agent_name, None)
        with contextlib.suppress(Exception):
            agent.remove_remote_agent(agent_name)
