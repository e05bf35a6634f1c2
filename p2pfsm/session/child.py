"""What a child machine (a round or lookup the session owns) may produce.

A child's actions never call into the session. They append to the step's outbox: the
executor-facing outputs of :mod:`~p2pfsm.session.outputs` (results, writes, host
requests) and the requests below, which only the owner can carry out (a frame goes out
now or waits in the send queue, a timer's deadline is the owner's clock plus a delay).
The owner applies the outbox in order once the child's step has returned, so a step
that raises leaves nothing half-applied (the dispatcher truncates the outbox).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import count

from p2pfsm.fsm import Behaviour, Tracer, profile
from p2pfsm.fsm.profiles import DEFAULT_PROFILE
from p2pfsm.protocol import Message
from p2pfsm.protocol.frozen import quick_init
from p2pfsm.session.config import Timeouts
from p2pfsm.session.inputs import TimerId
from p2pfsm.session.outputs import Output


@quick_init
@dataclass(frozen=True, slots=True)
class Send:
    """Send a frame to the peer (at once when ready, else after the handshake, in order)."""

    message: Message


@quick_init
@dataclass(frozen=True, slots=True)
class Arm:
    """Arm ``timer`` ``delay`` seconds from now; ``keep``: leave an armed one as it is."""

    timer: TimerId
    delay: float
    keep: bool = False


@quick_init
@dataclass(frozen=True, slots=True)
class Disarm:
    """Disarm ``timer`` if it is armed."""

    timer: TimerId


@quick_init
@dataclass(frozen=True, slots=True)
class HoldJob:
    """This serve round now holds the pins of store job ``job_id`` (until it ends)."""

    job_id: int


@quick_init
@dataclass(frozen=True, slots=True)
class PinHits:
    """Lookup hits pinned by ``job_id``: supply of (kv_request_id, round_seq)."""

    kv_request_id: str
    round_seq: int
    job_id: int
    keys: tuple[bytes, ...]
    local_indexes: tuple[int, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class ExpireLookupRound:
    """The lookup pins of (kv_request_id, round_seq) expired: its fetch fails fast."""

    kv_request_id: str
    round_seq: int


@quick_init
@dataclass(frozen=True, slots=True)
class BindRound:
    """This serve round, supplied before any frame named it, now answers to its fetch's
    round_seq: the owner files it under that number."""


@quick_init
@dataclass(frozen=True, slots=True)
class EndRoles:
    """The session ended: every open child of the client part receives ``trigger``
    (``session_lost``, or ``session_lost_unsent`` before ready), every serve round and
    served lookup its session-loss trigger."""

    trigger: str


@quick_init
@dataclass(frozen=True, slots=True)
class EndSession:
    """A child's deadline ends the whole session: the owner fires the session machine's
    ``trigger`` (its actions end every role)."""

    trigger: str


@quick_init
@dataclass(frozen=True, slots=True)
class ReleaseHeld:
    """The peer can no longer write into us (``cause``): every destination the session
    holds past its end is released (each round's ``peer_gone``)."""

    cause: str


@quick_init
@dataclass(frozen=True, slots=True)
class WithdrawFetch:
    """Take the fetch of (kv_request_id, round_seq) out of the handshake's queue: it is
    never sent (a load retired before the flush)."""

    kv_request_id: str
    round_seq: int


ChildOutput = (Output | Send | Arm | Disarm | HoldJob | PinHits | ExpireLookupRound | BindRound
               | EndRoles | EndSession | ReleaseHeld | WithdrawFetch)
"""One item of a step's outbox."""


@dataclass(slots=True)
class ChildEnv:
    """What the session gives each child: the outbox, the deadlines, the tracer (the
    session's: setting ``Session.tracer`` sets it), the session-wide write ids (an
    id a raising step took is skipped, never reused) and whether served lookups are
    answered in parts (``SessionConfig.answer_lookups_in_parts``) and the behaviour
    profile's choices the guards read (``SessionConfig.profile``)."""

    timeouts: Timeouts
    tracer: Tracer | None
    lookup_parts: bool = False
    behaviour: Behaviour = field(default_factory=lambda: profile(DEFAULT_PROFILE).behaviour)
    outbox: list[ChildOutput] = field(default_factory=list)
    xfers: Iterator[int] = field(default_factory=count)
