"""NIXL data plane: one registered block region, block WRITEs into peers' regions over UCX.

(A host may instead register several regions, a cache laid out per layer: block ``i``
is then a slice in each, see :mod:`p2pfsm.executor.nixl.layout`; what follows holds per
block-slice.)

This is the data path of vLLM 0.33.0's P2P tier
(``vllm/v1/kv_offload/tiering/p2p/data/nixl.py``): each side registers
its whole region once (``num_blocks x block_len`` bytes, one slab: allocated by the plane,
or the host's own tensor or :class:`~p2pfsm.executor.nixl.memory.HostRegion`), describes block ``i``
as ``(base_addr + i * block_len, block_len)``, loads a peer's agent metadata with
``add_remote_agent`` and builds that peer's descriptor list from the plain integers
``(base_addr, num_blocks, block_len)`` it sent. A batch of blocks goes out as one prepped
NIXL WRITE; on one host UCX does it with CMA (``process_vm_writev``), zero-copy.

Progress runs without a progress thread: the executor's loop calls
:meth:`DataPlane.progress` at the pace :attr:`DataPlane.progress_interval_ms` gives
(:mod:`p2pfsm.executor.nixl.pace` says how and why).

Remote agents are kept loaded after their peer is removed, for reuse
(:mod:`p2pfsm.executor.nixl.agents` says why); what is checked before NIXL is touched
is :mod:`p2pfsm.executor.nixl.checks`.

Failure model: NIXL raises typed exceptions with no common base class, so every NIXL call
is guarded and turned into either :class:`~p2pfsm.errors.TransportError` (setup and API
misuse) or a failed transfer reported once by :meth:`DataPlane.poll`.
Each WRITE is named by the caller's own id (:data:`WriteId`, given to
:meth:`DataPlane.write`): :meth:`~DataPlane.poll` reports it and
:meth:`~DataPlane.cancel` takes it, so a caller keeps no map from NIXL's ids to its own
(:mod:`p2pfsm.executor.nixl.xfers` keeps the one table of them).
Not thread-safe: use one DataPlane from one thread (the agent runs with no locking).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from p2pfsm.errors import NIXL_INSTALL_HINT, ConfigError, TransportError
from p2pfsm.executor.nixl.agent import agent_name_of, agent_refusal, import_nixl
from p2pfsm.executor.nixl.agents import LoadedAgents, nixl_covers
from p2pfsm.executor.nixl.checks import (
    ADDR_LIMIT,
    MAX_INDEX,
    announced_layout,
    block_indexes,
    positive_int,
)
from p2pfsm.executor.nixl.layout import Layout, WireLayout
from p2pfsm.executor.nixl.memory import (
    MemoryDesc,
    RegionsDesc,
    describe_memory,
    describe_regions,
    device_name,
    parse_device,
    require_device,
)
from p2pfsm.executor.nixl.pace import IDLE_PROGRESS_MS, ProgressPace
from p2pfsm.executor.nixl.xfers import NixlPeer, Transfers, WriteId

if TYPE_CHECKING:
    import torch

__all__ = ["IDLE_PROGRESS_MS", "DataPlane", "WriteId"]

class DataPlane:
    """A block region registered with a NIXL agent (UCX, no progress thread).

    Args:
        name: NIXL agent name; must differ from every peer's.
        num_blocks, block_len: region geometry; block ``i`` is the ``block_len`` bytes at
            ``base_addr + i * block_len``.
        device: ``"cpu"`` (DRAM) or ``"cuda[:N]"`` (VRAM; peers are assumed to be DRAM).
            ``None`` means ``"cpu"`` when the plane allocates, and the memory's own device
            when ``memory`` is given; a device that disagrees with it is a ConfigError.
        memory: the host's own region, registered as it is (no copy, no allocation):
            a contiguous ``torch.Tensor`` of exactly ``num_blocks * block_len`` bytes (any
            dtype and shape) or a :class:`~p2pfsm.executor.nixl.memory.HostRegion` of that
            size. The host keeps it alive while the plane is open; :meth:`close`
            deregisters it and never frees it. ``None``: the plane allocates a zeroed
            uint8 tensor of shape ``(num_blocks, block_len)`` itself. A list (or tuple)
            of tensors or HostRegions: a cache laid out in several regions, e.g. a
            tensor per layer, block ``i`` being a slice of each
            (:func:`~p2pfsm.executor.nixl.memory.describe_regions` says what each must be);
            its slices sum to ``block_len`` (paired with a peer's by position). A mapping
            ``name -> tensor | HostRegion``: named regions, paired by name.
        busy_progress_ms, idle_progress_ms, warmup_s, prompt_s: the pace of progress
            (:mod:`p2pfsm.executor.nixl.pace`).
        max_peer_blocks: most descriptors a peer's announcement may cost: its
            ``num_blocks`` times its regions (each remote block-slice costs a prepped
            descriptor, so an unbounded announcement is a memory hazard), or our own
            count when that is larger (a peer as big as we are is always accepted).
        keep_agents: remote agents no peer uses that stay loaded for reuse (0: unload
            each with its peer).
        ucx_params: UCX backend parameters (default: the plugin's own, i.e. error
            handling mode ``peer``, one worker, no thread pool).

    Raises:
        ConfigError: bad arguments or memory (checked before anything is registered).
        TransportError: NIXL missing or failing, torch missing when the plane must
        allocate, or a CUDA device torch cannot use.
    """

    def __init__(
        self,
        name: str,
        num_blocks: int,
        block_len: int,
        device: str | None = None,
        *,
        memory: Any = None,
        busy_progress_ms: int = 1,
        idle_progress_ms: int = IDLE_PROGRESS_MS,
        warmup_s: float = 1.0,
        prompt_s: float = 0.0,
        max_peer_blocks: int = 1 << 20,
        keep_agents: int = 64,
        ucx_params: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty str, got {name!r}")
        self._num_blocks = positive_int("num_blocks", num_blocks, MAX_INDEX)
        self._block_len = positive_int("block_len", block_len, ADDR_LIMIT)
        busy_ms = positive_int("busy_progress_ms", busy_progress_ms, 60_000)
        idle_ms = positive_int("idle_progress_ms", idle_progress_ms, 60_000)
        self._max_peer_blocks = positive_int("max_peer_blocks", max_peer_blocks, MAX_INDEX)
        if type(keep_agents) is not int or not 0 <= keep_agents <= 1 << 16:
            raise ConfigError(f"keep_agents must be an int in [0, 65536], got {keep_agents!r}")
        self._agents = LoadedAgents(keep_agents)
        self.pace = ProgressPace(busy_ms, idle_ms, warmup_s, prompt_s)
        """How often :meth:`progress` must run (its windows are plain attributes)."""
        given: MemoryDesc | RegionsDesc | None = None
        if memory is None:
            mem_type, dev_id = parse_device("cpu" if device is None else device)
        else:
            if isinstance(memory, list | tuple | Mapping):
                given = describe_regions(memory, self._num_blocks, self._block_len)
            else:
                given = describe_memory(memory, self._num_blocks, self._block_len)
            mem_type, dev_id = given.mem_type, given.dev_id
            if device is not None and parse_device(device) != (mem_type, dev_id):
                raise ConfigError(
                    f"device {device!r} disagrees with the memory's device {given.device!r}"
                )
        require_device(mem_type, dev_id)
        self._name = name
        self._mem_type = mem_type
        self._device = device_name(mem_type, dev_id)

        nixl = import_nixl()

        self._peers: dict[str, NixlPeer] = {}
        self._xfers = Transfers(self.pace, self._retire_peer)
        self._closed = False

        self._region: torch.Tensor | None = None
        self._held: tuple[torch.Tensor, ...] = ()  # a layout's tensors, kept referenced
        if given is None:
            self._region = self._allocate(num_blocks, block_len, self._device)
            self._layout = Layout.plain(int(self._region.data_ptr()), num_blocks, block_len)
        elif isinstance(given, RegionsDesc):
            if given.layout.slice_count > MAX_INDEX:
                raise ConfigError(f"{num_blocks} blocks x {len(given.layout.regions)} "
                                  f"regions is more descriptors than NIXL indexes")
            self._held = given.tensors
            self._layout = given.layout
        else:
            self._region = given.tensor
            self._layout = Layout.plain(given.base_addr, num_blocks, block_len)

        config = nixl.nixl_agent_config(
            enable_prog_thread=False, enable_listen_thread=False, backends=[]
        )
        self._agent: Any = None
        self._reg: Any = None
        self._local: Any = None
        try:
            self._agent = nixl.nixl_agent(name, config)
            self._agent.create_backend("UCX", dict(ucx_params or {}))
            if self._region is not None:
                self._reg = self._agent.register_memory(self._region)
            else:
                spans = [(region.base_addr, region.extent(num_blocks), dev_id, "")
                         for region in self._layout.regions]
                self._reg = self._agent.register_memory(spans, mem_type)
            if self._reg is None:  # NIXL logs and returns None for what it cannot describe
                raise TransportError("NIXL could not describe the region for registration")
            self._local = self._agent.prep_xfer_dlist("", self._layout.rows(dev_id), mem_type)
            self._metadata = bytes(self._agent.get_agent_metadata())
            own_name, _ = agent_name_of(self._metadata)
            if own_name != name:
                raise TransportError(f"NIXL metadata names {own_name!r}, not {name!r}")
        except Exception as exc:
            self._teardown_agent()
            self._closed = True
            raise TransportError(f"cannot set up NIXL agent {name!r}: {exc!r}") from exc

    # -- properties ---------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_len(self) -> int:
        return self._block_len

    @property
    def metadata(self) -> bytes:
        """This agent's NIXL metadata, for the peer's ``add_peer`` (vLLM's agent_metadata)."""
        return self._metadata

    @property
    def base_addr(self) -> int:
        """Address of block 0 of the region (of region 0), for the peer's ``add_peer``."""
        return self._layout.base_addr

    @property
    def layout(self) -> Layout:
        """Where each block's bytes are: the plain region, or the host's regions."""
        return self._layout

    @property
    def region(self) -> torch.Tensor | None:
        """The registered tensor: the one the plane allocated (contiguous uint8, shape
        ``(num_blocks, block_len)``), the host's own tensor as given (same object, any
        dtype and shape), or ``None`` when the host gave a raw HostRegion or a list of
        regions."""
        return self._region

    @property
    def device(self) -> str:
        """Where the region lives: ``"cpu"`` or ``"cuda:N"``."""
        return self._device

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(self._peers)

    @property
    def in_flight(self) -> int:
        """Transfers whose NIXL handle is still held (posted, or awaiting release)."""
        return self._xfers.in_flight

    @property
    def progress_interval_ms(self) -> int:
        """The longest the event loop should go without calling :meth:`progress`."""
        return self.pace.interval_ms(self._xfers.in_flight > 0)

    @property
    def writes(self) -> Transfers:
        """The table of our WRITEs not reported yet (its ``len``, ``holds``,
        ``unreported``): the one table of them."""
        return self._xfers

    @property
    def closed(self) -> bool:
        return self._closed

    def is_faulted(self, peer_id: str) -> bool:
        """True once a transfer to ``peer_id`` failed (the peer likely died); writes to
        it will keep failing until it is removed and added again."""
        peer = self._peers.get(peer_id)
        return peer is not None and peer.faulted

    # -- peers --------------------------------------------------------------------

    def add_peer(
        self, peer_id: str, metadata: bytes, base_addr: int, num_blocks: int, block_len: int,
        layout: WireLayout | None = None, names: tuple[str, ...] | None = None,
    ) -> None:
        """Load a peer's NIXL metadata and prep the descriptors of its blocks.

        ``layout`` and ``names`` are the peer's connect fields (None: one plain region;
        unnamed regions). When both sides named their regions they pair by name (the
        same names, in any order), else by position. Re-adding
        ``peer_id`` removes its old registration first (:meth:`remove_peer`: a transfer
        still running to it is left to end).
        An agent kept loaded with the same metadata is reused while NIXL holds it.
        Raises :class:`TransportError` when the announcement is invalid: ``block_len``
        differs from ours, the regions do not pair up with ours (their number, or a
        slice length), its descriptors exceed ``max_peer_blocks``, a region would wrap
        past 2**64, the metadata is not NIXL's, describes this agent or one already
        registered under another peer id (under its name or another:
        :func:`~p2pfsm.executor.nixl.agent.agent_refusal`), or its blocks lie outside
        what the agent registered (the agent then stays loaded, kept for a later add).
        """
        self._check_open()
        theirs = announced_layout(
            self._layout, self._block_len, self._max_peer_blocks, peer_id=peer_id,
            metadata=metadata, base_addr=base_addr, num_blocks=num_blocks,
            block_len=block_len, layout=layout, names=names)
        agent_name, _ = agent_name_of(metadata)
        refused = agent_refusal(metadata, self._metadata, peer_id,
                                ((p.peer_id, p.metadata) for p in self._peers.values()))
        if refused is not None:
            raise TransportError(refused)

        if peer_id in self._peers:
            self.remove_peer(peer_id)
        self._agents.load(self._agent, peer_id, agent_name, metadata)
        # A refused announcement leaves the agent loaded (kept, as after remove_peer):
        # unloading it would make the next connect carrying it load it again, and every
        # load of a live agent leaves a UCX connection behind (nixl_agents).
        if not nixl_covers(self._agent, agent_name, theirs):  # by spans: a row a region
            self._keep_agents()
            raise TransportError(f"{peer_id!r} announces blocks its agent {agent_name!r} "
                                 f"did not register")
        try:
            descs = self._agent.get_xfer_descs(theirs.rows(0), "DRAM")
            dlist = self._agent.prep_xfer_dlist(agent_name, descs, "DRAM")
        except Exception as exc:
            self._keep_agents()
            raise TransportError(f"cannot prep descriptors of {peer_id!r}: {exc!r}") from exc
        self._peers[peer_id] = NixlPeer(peer_id, agent_name, metadata, theirs, dlist)
        self._agents.unload_replaced(self._agent, peer_id, agent_name, self._used_agents())
        self.pace.warm_up()

    def remove_peer(self, peer_id: str) -> None:
        """Forget a peer: no new transfer to it, and a later :meth:`add_peer` of the id
        starts afresh. Its transfers that have ended are released and reported by
        :meth:`poll`; one still running is left to end, as :meth:`cancel` leaves it
        (releasing a running WRITE does not stop the transport reading our blocks and
        writing the peer's, so a host told it failed could reuse a source block still
        being read), and reported when it ends. The peer's descriptors are released
        once none of its transfers runs; its agent stays loaded for a later
        :meth:`add_peer` (:mod:`p2pfsm.executor.nixl.agents`) unless a transfer to it failed.
        Unknown ids are ignored."""
        self._check_open()
        peer = self._peers.pop(peer_id, None)
        if peer is None:
            return
        peer.removed = True
        self._xfers.advance_peer(self._agent, peer)
        self._retire_peer(peer)

    # -- transfers ----------------------------------------------------------------

    def write(
        self, write_id: WriteId, peer_id: str,
        local_idxs: Sequence[int], remote_idxs: Sequence[int],
    ) -> None:
        """WRITE our blocks ``local_idxs[k]`` into the peer's blocks ``remote_idxs[k]``.

        One prepped NIXL transfer for the whole batch, named by the caller's
        ``write_id``: :meth:`poll` reports its outcome under that id exactly once (a post
        that fails, e.g. because the peer died, is reported there as failed too) and
        :meth:`cancel` takes it. The id is the caller's until it is reported or
        cancelled; after that it may name a new WRITE.

        Raises :class:`TransportError` for an id that is unhashable or still names a
        WRITE (in flight, or ended and not yet reported), an unknown peer, an empty
        batch, lists of different lengths, an index that is not an int or is out of
        range, or a remote block named twice; nothing is posted then.
        """
        self._check_open()
        self._xfers.check_free(write_id)
        peer = self._peers.get(peer_id)
        if peer is None:
            raise TransportError(f"unknown peer {peer_id!r}")
        local = block_indexes("local", local_idxs, self._num_blocks)
        remote = block_indexes("remote", remote_idxs, peer.layout.num_blocks)
        if len(local) != len(remote):
            raise TransportError(f"{len(local)} local indexes but {len(remote)} remote ones")
        if not local:
            raise TransportError("empty batch")
        if len(set(remote)) != len(remote):
            raise TransportError("a remote block is named twice in one batch")

        self._xfers.post(self._agent, write_id, peer, self._local,
                         self._layout.descriptors(local), peer.layout.descriptors(remote))

    def poll(self) -> list[tuple[WriteId, bool]]:
        """Finished transfers as ``(write id, ok)``, each reported once, in the order
        they were posted; their NIXL handles are released before they are reported."""
        self._check_open()
        return self._xfers.poll(self._agent)

    def cancel(self, write_id: WriteId) -> bool:
        """Abandon the transfer ``write_id`` names if it has ended; one still running is
        left to end.

        True: the transfer is over and released (already finished, or unknown), so NIXL
        will not touch either region for it again; it will not be reported by
        :meth:`poll`. False: it is still running; it stays in flight and :meth:`poll`
        reports it when it ends. A running WRITE is never released early: releasing it
        does not stop bytes already handed to the transport (over UCX TCP they are
        still written into the peer's memory after the release), so a receiver told
        the write is over could free blocks that are written afterwards.
        """
        self._check_open()
        return self._xfers.cancel(self._agent, write_id)

    def abandon(self, write_id: WriteId) -> None:
        """Stop waiting for ``write_id``: :meth:`poll` never reports it; one still
        running is left to end (released then, or at :meth:`close`)."""
        self._check_open()
        self._xfers.abandon(write_id)

    def progress(self) -> None:
        """Run UCX progress once (cheap). Call it on every loop tick, at least every
        :attr:`progress_interval_ms`; the passive side of a WRITE needs it."""
        self._check_open()
        try:
            # The protocol uses no NIXL notifications; draining them is what runs the
            # worker's progress loop, so whatever arrives is dropped.
            self._agent.get_new_notifs()
        except Exception as exc:
            raise TransportError(f"NIXL progress failed: {exc!r}") from exc

    def expect_inbound(self, seconds: float, prompt: bool = False) -> None:
        """Keep :attr:`progress_interval_ms` at the busy value for ``seconds`` more,
        e.g. while we wait for a peer to WRITE blocks we asked for; ``prompt``: and at
        0 for the next ``prompt_s`` (a WRITE may be landing now)."""
        self.pace.expect_inbound(seconds, prompt)

    def close(self) -> None:
        """Release every transfer and peer, deregister the region, drop the agent.
        Idempotent. Memory is never freed: the region tensor stays readable, and the
        host's own memory stays the host's."""
        if self._closed:
            return
        self._closed = True
        removed = self._xfers.close()
        for peer in [*self._peers.values(), *removed]:
            with contextlib.suppress(Exception):
                peer.dlist.release()
        self._peers.clear()
        for agent_name in self._agents.names():
            self._forget_agent(agent_name)
        self._teardown_agent()

    def __enter__(self) -> DataPlane:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------

    @staticmethod
    def _allocate(num_blocks: int, block_len: int, device: str) -> torch.Tensor:
        try:
            import torch
        except ImportError as exc:
            raise TransportError(f"the NIXL data plane needs torch ({exc}); install it with "
                                 f"{NIXL_INSTALL_HINT}") from None
        try:
            return torch.zeros((num_blocks, block_len), dtype=torch.uint8, device=device)
        except (AssertionError, RuntimeError, ValueError) as exc:  # torch: all three
            raise TransportError(f"cannot allocate the block region on {device}: {exc}") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("data plane is closed")

    def _retire_peer(self, peer: NixlPeer) -> None:
        """Release a removed peer's descriptors once no transfer of it runs."""
        if self._xfers.runs_for(peer):
            return
        with contextlib.suppress(Exception):  # it also frees itself when collected
            peer.dlist.release()
        reused = any(p.agent_name == peer.agent_name for p in self._peers.values())
        if peer.faulted and not reused:  # its endpoints failed: load it afresh later
            self._forget_agent(peer.agent_name)
        else:
            self._keep_agents()

    def _used_agents(self) -> set[str]:
        used = {peer.agent_name for peer in self._peers.values()}
        used.update(self._xfers.agent_names())
        return used

    def _keep_agents(self) -> None:
        """Unload the least recently used agents that no peer uses, beyond ``keep_agents``."""
        self._agents.trim(self._agent, self._used_agents())

    def _forget_agent(self, agent_name: str) -> None:
        self._agents.forget(self._agent, agent_name)

    def _teardown_agent(self) -> None:
        agent, self._agent = self._agent, None
        if agent is None:
            return
        if self._local is not None:
            with contextlib.suppress(Exception):
                self._local.release()
            self._local = None
        if self._reg is not None:
            with contextlib.suppress(Exception):
                agent.deregister_memory(self._reg)
            self._reg = None
        del agent

