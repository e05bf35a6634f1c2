"""Actions a session asks its executor to perform, in the order given.

Ordering obligations: SendFrame outputs must reach the wire in order;
StartWrite must be started before any later CancelWrite of the same ``xfer``;
results are final (each job gets exactly one LoadResult or StoreResult; a LoadResult
with ``released=False`` is followed by exactly one DestinationReleased).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from p2pfsm.errors import HandshakeMismatch, RemoteProtocolError
from p2pfsm.protocol import Connect, Message
from p2pfsm.protocol.frozen import quick_init


@quick_init
@dataclass(frozen=True, slots=True)
class SendFrame:
    """Send one control message to the peer."""

    message: Message


@quick_init
@dataclass(frozen=True, slots=True)
class SendToLostPeer(SendFrame):
    """Send one control message to a peer whose session with us is dead but that may
    still hold it live (a one-sided loss): over the connection we still have to it, else
    by dialling it back for this frame. Only a dead session asks for this; the executor
    decides nothing about the protocol here, it only reaches the peer."""


@quick_init
@dataclass(frozen=True, slots=True)
class StartRegistration:
    """Register the peer's memory with the data plane; answer with RegistrationFinished."""

    connect: Connect


@quick_init
@dataclass(frozen=True, slots=True)
class StartWrite:
    """Write our blocks ``local_indexes[i]`` into the peer's ``remote_indexes[i]`` in one go."""

    xfer: int
    local_indexes: tuple[int, ...]
    remote_indexes: tuple[int, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class CancelWrite:
    """Stop transfer ``xfer``; report WriteFinished once it can no longer touch memory."""

    xfer: int


class FailReason(enum.StrEnum):
    """Why a job did not succeed (the ``reason`` of a failed result)."""

    PEER_FAILED = "peer_failed"
    """The peer answered transfer_done(false): it lacks a key, declined the round, or its
    host finished the request."""
    TIMEOUT = "timeout"
    """Our deadline passed: a load's round was aborted (and acknowledged), a lookup's
    unanswered keys became MISS."""
    FINISHED = "finished"
    """The host finished (or cancelled) the request first."""
    SESSION_ENDED = "session_ended"
    """The session died or was closed (``detail`` says why, where the node knows)."""
    NOT_SERVED = "not_served"
    """A store: the round or request ended without a fetch reading these pins."""


@quick_init
@dataclass(frozen=True, slots=True)
class LoadResult:
    """The one result of a load job.

    ``released`` is True when the peer can no longer write into the job's destination
    blocks (transfer_done or abort_ack arrived): only then may the host reuse them.
    When False, exactly one :class:`DestinationReleased` of the job follows once they
    are free.
    A failed result says why: ``reason`` and a human ``detail`` (neither is compared).
    ``never_sent``: the fetch never left the queue of a session that ended before it was
    ready (the detail says so too), so the peer never saw it: an executor that opens a
    new session to the peer may hand the job to that session instead of delivering this
    result (the node does, up to the job's deadline).
    """

    job_id: int
    kv_request_id: str
    success: bool
    released: bool
    reason: FailReason | None = field(default=None, compare=False)
    detail: str = field(default="", compare=False)
    never_sent: bool = field(default=False, compare=False, repr=False)


class ReleaseCause(enum.StrEnum):
    """Why a held destination (a LoadResult with ``released=False``) became free."""

    ABORT_ACK = "abort_ack"
    """The peer acknowledged the abort reported at its sending."""
    TRANSFER_DONE = "transfer_done"
    """The peer's transfer_done raced the abort reported at its sending."""
    NEVER_SENT = "never_sent"
    """The session ended before it was ready: the fetch never left the queue."""
    PEER_RESTARTED = "peer_restarted"
    """A new incarnation of the peer connected: the process that could write is gone."""
    DATA_PLANE = "data_plane"
    """The data plane proved the peer's writes over (its agent gone, transfers ended)."""
    HOLD_EXPIRED = "hold_expired"
    """The host's bounded hold (``Timeouts.hold``) ended."""


@quick_init
@dataclass(frozen=True, slots=True)
class DestinationReleased:
    """The destination of load job ``job_id``, reported with ``released=False``, is free
    now: no write of the peer can land in it. Exactly one follows each such result."""

    job_id: int
    kv_request_id: str
    round_seq: int
    cause: ReleaseCause


@quick_init
@dataclass(frozen=True, slots=True)
class StoreResult:
    """The one result of a store (supply or lookup pin) job; its pins may be released now.
    ``success`` says a fetch read them; otherwise ``reason`` says why not."""

    job_id: int
    success: bool
    reason: FailReason | None = field(default=None, compare=False)
    detail: str = field(default="", compare=False)


@quick_init
@dataclass(frozen=True, slots=True)
class LookupResult:
    """The one answer to a host lookup: ``hits[i]`` for ``keys[i]``; ``answered`` is False
    when the peer did not answer every key (deadline, finish or session end): the keys it
    answered keep their answer, the others are MISS."""

    kv_request_id: str
    keys: tuple[bytes, ...]
    hits: tuple[bool, ...]
    answered: bool
    reason: FailReason | None = field(default=None, compare=False)
    """Why not every key was answered (None when ``answered``)."""
    detail: str = field(default="", compare=False)
    never_sent: bool = field(default=False, compare=False, repr=False)
    """The lookup never left the queue of a session that ended before it was ready: as
    :attr:`LoadResult.never_sent`."""


@quick_init
@dataclass(frozen=True, slots=True)
class RoundEnded:
    """A round the host heard of (through FetchArrived) takes no more supply.

    ``served``: the peer got every block (transfer_done(true)). Otherwise ``why``:
    ``aborted`` (the peer's abort_fetch), ``peer_finished`` (its terminal fetch),
    ``session_ended``, ``demand_timeout`` (our demand deadline), ``write_failed``,
    ``declined`` (our host's decline) or ``failed`` (the host finished the request before
    supplying all). A supply the host still prepares for it is not needed: one given now
    fails at once after ``peer_finished`` (until the peer names a round of the request
    again) or ``session_ended``, and is otherwise taken for a later round of the request.
    """

    kv_request_id: str
    round_seq: int
    served: bool
    why: str


@quick_init
@dataclass(frozen=True, slots=True)
class LookupRequest:
    """The peer asks which keys we hold; answer with HostAnswerLookup(token, ...)."""

    token: int
    kv_request_id: str
    round_seq: int
    keys: tuple[bytes, ...]


@quick_init
@dataclass(frozen=True, slots=True)
class LookupClosed:
    """The lookup ``token`` is over (answered or dropped); the host may drop its context."""

    token: int


@quick_init
@dataclass(frozen=True, slots=True)
class FetchArrived:
    """The peer fetched ``keys`` for (kv_request_id, round_seq).

    ``supplied`` are the keys the round already holds supply for (an earlier
    :class:`~p2pfsm.session.inputs.HostSupply` or lookup pins); supply is wanted only for
    :attr:`missing`. A round answered from a lookup takes no further supply.

    Never emitted for a request the host has finished (within the tombstone lifetime):
    no supply may follow a finish, and the fetch is answered without the host (a new
    round of it fails at once with transfer_done(false)).
    """

    kv_request_id: str
    round_seq: int
    keys: tuple[bytes, ...] = ()
    supplied: tuple[bytes, ...] = ()

    @property
    def missing(self) -> tuple[bytes, ...]:
        """The fetched keys with no supply yet, in fetch order."""
        if not self.supplied:
            return self.keys
        have = set(self.supplied)
        return tuple(k for k in self.keys if k not in have)


@quick_init
@dataclass(frozen=True, slots=True)
class ProtocolViolation:
    """A frame was rejected; it changed nothing."""

    error: RemoteProtocolError


@quick_init
@dataclass(frozen=True, slots=True)
class FrameIgnored:
    """A well-formed but stale or unknown frame was dropped (benign races)."""

    message_type: str
    reason: str


@quick_init
@dataclass(frozen=True, slots=True)
class SessionDead:
    """The session failed; ``mismatch`` is set when the peer's config is incompatible,
    ``restarted_by`` when a connect of the peer ended it: of a new incarnation (reason
    "peer restarted"), or of the same one on a ready session ("peer reconnected": the
    peer lost its side). The host serves that connect with a fresh session."""

    reason: str
    mismatch: HandshakeMismatch | None = None
    restarted_by: Connect | None = None


ABORT_ACK_TIMED_OUT = "abort ack timed out"
"""The ``SessionDead.reason`` of a session its profile ended on a missing abort_ack
(``abort_ack_timeout = "end_session"``; vLLM 0.34.0's wording)."""

LOOKUP_TIMED_OUT = "lookup response timed out"
"""The ``SessionDead.reason`` of a session its profile ended on an overdue lookup answer
(``lookup_timeout = "end_session"``; vLLM's wording)."""


Output = (
    SendFrame | SendToLostPeer | StartRegistration | StartWrite | CancelWrite
    | LoadResult | StoreResult | LookupResult | LookupRequest | LookupClosed
    | FetchArrived | RoundEnded | ProtocolViolation | FrameIgnored | SessionDead
    | DestinationReleased
)
