"""Events a session consumes: frames, timers, data-plane news and host calls.

All are frozen, slotted dataclasses. A session consumes them one at a time with
:meth:`p2pfsm.session.Session.handle`, together with the current time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from p2pfsm.protocol import Message
from p2pfsm.protocol.frozen import quick_init


class TimerId(NamedTuple):
    """A timer's identity: its kind (a timer input of ``models/inputs.toml``) and the
    instance key of the machine it fires on, e.g. ``TimerId("load", ("req-1", 0))``.

    Armed and disarmed by outputs; the executor only compares and hashes it.
    """

    kind: str
    key: tuple[str | int, ...] = ()


timer_id: Callable[[tuple[str, tuple[str | int, ...]]], TimerId] = partial(
    tuple.__new__, TimerId)
"""``timer_id((kind, key))`` is ``TimerId(kind, key)``, made without the NamedTuple's
Python-level ``__new__`` (the children make one on most steps that arm or disarm)."""


@quick_init
@dataclass(frozen=True, slots=True)
class FrameReceived:
    """One control frame from the peer, still encoded (untrusted bytes).

    ``message``: what :func:`~p2pfsm.protocol.decode` gave for ``frame`` under the
    session's limits, when the executor had to decode it already (to see whether it
    opens a session); the session then takes it instead of decoding the frame a second
    time. Only an executor that decoded this very frame passes it; it is left out of
    ``repr`` and comparison (it is the frame, decoded).
    """

    frame: bytes
    message: Message | None = field(default=None, repr=False, compare=False)


@quick_init
@dataclass(frozen=True, slots=True)
class TimerFired:
    """A timer of the session reached its deadline (one of
    :meth:`Session.due_timers <p2pfsm.session.core.Session.due_timers>`)."""

    timer: TimerId


@quick_init
@dataclass(frozen=True, slots=True)
class RegistrationFinished:
    """The data plane finished registering the peer (answer to StartRegistration)."""

    ok: bool
    reason: str = ""


@quick_init
@dataclass(frozen=True, slots=True)
class WriteFinished:
    """A write started by StartWrite can no longer touch memory (landed, failed or cancelled)."""

    xfer: int
    ok: bool


@quick_init
@dataclass(frozen=True, slots=True)
class TransportLost:
    """The control connection to the peer failed."""

    reason: str


@quick_init
@dataclass(frozen=True, slots=True)
class PeerGone:
    """The peer can no longer write into our memory: its new incarnation connected, or
    the data plane reports its agent gone and every transfer of it ended (``cause``:
    "peer_restarted" or "data_plane"). A session that is over releases every destination
    it holds; a live one ignores it."""

    cause: str


@quick_init
@dataclass(frozen=True, slots=True)
class HostStart:
    """Open the session: send our connect."""


@quick_init
@dataclass(frozen=True, slots=True)
class HostFetch:
    """Load ``keys`` from the peer into our blocks ``dest_indexes`` (one load job)."""

    job_id: int
    kv_request_id: str
    keys: tuple[bytes, ...]
    dest_indexes: tuple[int, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class HostLookup:
    """Ask the peer which of ``keys`` it holds (symmetric P2P)."""

    kv_request_id: str
    keys: tuple[bytes, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class HostSupply:
    """Stored blocks the peer may fetch: ``keys[i]`` lives at our block ``local_indexes[i]``.

    The blocks stay pinned until the job's StoreResult.
    """

    job_id: int
    kv_request_id: str
    keys: tuple[bytes, ...]
    local_indexes: tuple[int, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class HostAnswerLookup:
    """The host's answer to a LookupRequest.

    ``hits`` maps each hit key to the local block now pinned for it under ``job_id``;
    keys in ``pending`` are not known yet (answer again later); all others are misses.
    """

    token: int
    hits: Mapping[bytes, int] = field(default_factory=dict)
    job_id: int | None = None
    pending: frozenset[bytes] = frozenset()


@quick_init
@dataclass(frozen=True, slots=True)
class HostFinish:
    """The host is done with ``kv_request_id`` on both roles."""

    kv_request_id: str


@quick_init
@dataclass(frozen=True, slots=True)
class HostDecline:
    """The host will not supply the rest of round ``round_seq`` of ``kv_request_id`` (a
    fetch named blocks it does not hold): that round fails, the request goes on."""

    kv_request_id: str
    round_seq: int


@quick_init
@dataclass(frozen=True, slots=True)
class HostClose:
    """Close the session; every outstanding job gets its result."""


Input = (
    FrameReceived | TimerFired | RegistrationFinished | WriteFinished | TransportLost | PeerGone
    | HostStart | HostFetch | HostLookup | HostSupply | HostAnswerLookup | HostFinish | HostDecline
    | HostClose
)
