"""What vLLM's tier manager reads off a session, as plain data, for the installed release.

The result tuples of :class:`~p2pfsm.vllm.session.P2PSession` (poll, close, store drain),
the release's deadlines read from vLLM's modules, the server-role view the manager's
``shutdown()`` reads, and the conversions of vLLM's keys, block ids and decoded frames.
Importing this module imports vLLM.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import NamedTuple

import msgspec
from vllm import envs
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.tiering.p2p.session import client as vllm_client
from vllm.v1.kv_offload.tiering.p2p.session import server as vllm_server
from vllm.v1.kv_offload.tiering.p2p.session.client import LoadResult as VllmLoadResult
from vllm.v1.kv_offload.tiering.p2p.session.protocol import (
    TYPE_KEY,
    AbortAckMsg,
    DisconnectMsg,
    FetchMsg,
    TransferDoneMsg,
)
from vllm.v1.kv_offload.tiering.p2p.session.server import StoreResult as VllmStoreResult

from p2pfsm.fsm import profile
from p2pfsm.session import LookupRequest, Timeouts
from p2pfsm.vllm import releases

RELEASE = releases.installed()
"""The installed vLLM release: the behaviour this module mirrors."""


class SessionPollResult(NamedTuple):
    """One poll's news, as vLLM's manager reads it."""

    loads: list[VllmLoadResult]
    stores: list[VllmStoreResult]
    new_fetch_ids: list[str]
    terminal_fetch_ids: frozenset[str] = frozenset()
    """Ids whose latest fetch this poll was the terminal (empty) one."""


class SessionCloseResult(NamedTuple):
    """What close() leaves the manager to fail or release, as vLLM's manager reads it."""

    failed_jobs: list[int]
    failed_req_ids: list[str]
    failed_stores: list[int]
    failed_serves: list[ReqContext]
    retained: Mapping[int, frozenset[int]] = MappingProxyType({})
    """Transfers still running at close -> the store jobs they read (left pinned; the
    release's manager holds them until the transport retires them)."""


class StoreDrainResult(NamedTuple):
    """What drain_stores() failed, as vLLM's manager reads it."""

    stores: list[VllmStoreResult]
    reaped_pd_ids: set[str]


def timeouts_from_vllm() -> Timeouts:
    """The release's profile's deadlines, each set to vLLM's module constant as it is now
    (a test may have patched one): the load deadline is the PD one, ``load_probed`` that
    of a fetch of an id that ran lookups; the profile's ``hold`` stays. vLLM ends a
    handshake only once strictly more than its timeout has passed (a load at its deadline):
    the handshake deadline is the next float above vLLM's setting, so a load due at the
    same instant is retired before the handshake is given up, as in vLLM."""
    base = Timeouts.of_profile(profile(RELEASE.profile))
    handshake = math.nextafter(float(envs.VLLM_P2P_HANDSHAKE_TIMEOUT_S), math.inf)
    return replace(base, handshake=handshake,
                   load=float(getattr(vllm_client, RELEASE.pd_load_timeout)),
                   load_probed=float(getattr(vllm_client, RELEASE.p2p_load_timeout)),
                   abort_ack=float(vllm_client._ABORT_ACK_TIMEOUT_S),
                   lookup=float(vllm_client._LOOKUP_TIMEOUT_S),
                   store=float(vllm_server._STORE_TIMEOUT_S),
                   lookup_pending=float(vllm_server._LOOKUP_PENDING_TIMEOUT_S))


def stall_timeout() -> float | None:
    """The producer's transfer stall deadline in seconds, or None (none, or disabled): the
    release's profile states whether it has one (``stall``); vLLM's setting of it, where
    the release names one, is taken over the profile's default, as vLLM does."""
    default = profile(RELEASE.profile).stall
    if default is None:
        return None
    env = RELEASE.stall_timeout_env
    value = default if env is None else float(getattr(envs, env))
    return value if value > 0 else None


class Served:
    """A peer's lookup being answered from the tier manager (``serve_external_requests``)."""

    def __init__(self, req: LookupRequest, ctx: ReqContext) -> None:
        self.req = req
        self.ctx = ctx
        self.asked = False
        self.pending: set[bytes] = set(req.keys)


class ServerRoleView:
    """The one piece of vLLM's server role its tier manager reads from outside:
    ``shutdown()`` drains ``session._server._inflight``, the transport ids of the writes
    still reading our blocks, before it closes the data transport."""

    def __init__(self, by_tid: dict[int, int]) -> None:
        self._inflight: Mapping[int, int] = MappingProxyType(by_tid)

    @property
    def has_inflight_transfers(self) -> bool:
        return bool(self._inflight)


def pack(msg: object) -> bytes:
    """A frame vLLM's connection already decoded, encoded again for the Session to check
    (msgspec, as vLLM's connection encodes: the same bytes as msgpack, a few times faster)."""
    try:
        frame: bytes = _ENCODE(msg)
    except (TypeError, ValueError, OverflowError):
        return b""  # not encodable: the Session rejects it as malformed
    return frame


_ENCODE = msgspec.msgpack.Encoder().encode


def keys_of(keys: Sequence[bytes]) -> tuple[bytes, ...]:
    """vLLM's keys (``OffloadKey`` is ``bytes``) as the Session takes them, at C speed:
    taken as they are when every one is exactly ``bytes`` (one C pass over their types)."""
    if set(map(type, keys)) <= _BYTES:
        return tuple(keys)
    return tuple(map(bytes, keys))


def indexes_of(block_ids: Sequence[int]) -> tuple[int, ...]:
    """Block ids (a list, or a numpy array as vLLM's jobs hold them) as Python ints."""
    tolist = getattr(block_ids, "tolist", None)
    if callable(tolist):
        return tuple(tolist())
    if set(map(type, block_ids)) <= _INT:
        return tuple(block_ids)
    return tuple(map(int, block_ids))


_BYTES = frozenset((bytes,))
_INT = frozenset((int,))


def vllm_load(job_id: int, kv_request_id: str, success: bool,
              release: threading.Event | None = None,
              request_finished: bool = False) -> VllmLoadResult:
    """vLLM's own LoadResult, with the fields the installed release has."""
    if not RELEASE.early_load_failure:
        return VllmLoadResult(job_id, kv_request_id, success)
    return VllmLoadResult(job_id, kv_request_id, success, deferred_release=release,
                          request_finished=request_finished)


def fetch_of(msg: object) -> tuple[str, bool] | None:
    """A decoded frame that is a fetch: its kv_request_id and whether it is terminal
    (names no blocks); None for any other frame."""
    if not isinstance(msg, dict) or msg.get(TYPE_KEY) != FetchMsg.TYPE:
        return None
    kv_request_id = msg.get(FetchMsg.KV_REQUEST_ID)
    if not isinstance(kv_request_id, str):
        return None
    return kv_request_id, not msg.get(FetchMsg.BLOCK_INDEXES)


def _type_of(msg: object) -> object:
    return msg.get(TYPE_KEY) if isinstance(msg, dict) else None


def is_disconnect(msg: object) -> bool:
    """A decoded frame that is the peer's disconnect."""
    return bool(_type_of(msg) == DisconnectMsg.TYPE)


def is_terminal(msg: object) -> bool:
    """A decoded frame that may settle a load: a transfer_done or an abort_ack (checked
    by the Session like any other frame)."""
    return _type_of(msg) in (TransferDoneMsg.TYPE, AbortAckMsg.TYPE)


def stalled(posted_at: Iterable[float], stall_s: float | None, now: float) -> str | None:
    """The peer fault of writes posted at ``posted_at`` once the oldest is ``stall_s``
    old (vLLM 0.34.0's wording); None before, or without a stall timeout."""
    oldest = min(posted_at, default=None)
    if stall_s is None or oldest is None or now - oldest < stall_s:
        return None
    return f"transfer stalled for {now - oldest:.0f}s"
