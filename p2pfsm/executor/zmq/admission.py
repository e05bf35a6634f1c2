"""Who a control plane lets in: the dial-back rule, new identities per host, eviction.

A frame from an identity with no DEALER is dialled back only when it is a connect from
that identity (:func:`is_connect_from`, the check a node passes); each source host may
open only so many new identities a second (:class:`NewPeerRate`); and when the budget of
dial-backs whose handshake has not finished is full, :func:`eviction_victim` picks the
one to give up.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Final, Protocol, TypeVar

from p2pfsm.errors import ConfigError, RemoteProtocolError
from p2pfsm.protocol import DEFAULT_LIMITS, Connect, Limits, decode

__all__ = ["EVICTED", "NewPeerRate", "check_int", "eviction_victim", "is_connect_from"]

EVICTED: Final = "evicted: too many unfinished handshakes"
""":class:`~p2pfsm.executor.zmq.plane.PeerLost` reason of a dial-back pushed out of the
``max_pending`` budget."""

_TOKEN_SLACK: Final = 1e-9
"""A bucket this close below a whole token holds one (float rounding of the refill)."""
_RATE_HOSTS_MAX: Final = 4096
"""Source hosts a :class:`NewPeerRate` keeps a bucket for at once (each a few dozen bytes)."""


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` when it is an int (not a bool) in ``[low, high]``, else :class:`ConfigError`."""
    if type(value) is not int or value < low or (high is not None and value > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(f"{name} must be an int {bound}, got {value!r}")
    return value


def is_connect_from(peer_id: str, frame: bytes, limits: Limits = DEFAULT_LIMITS) -> bool:
    """True when ``frame`` is a well-formed connect (within ``limits``) whose ``peer_id``
    is ``peer_id``: the only frame a node dials an unknown identity back for."""
    try:
        message = decode(frame, limits)
    except RemoteProtocolError:
        return False
    return isinstance(message, Connect) and message.peer_id == peer_id


class NewPeerRate:
    """How many new identities each source host may have admitted: a token bucket per
    host, refilled at ``rate`` a second and holding at most ``rate`` (a burst of
    ``rate`` at once, then ``rate`` a second).

    Time is an input: every call passes ``now`` (seconds of a monotonic clock), so the
    buckets are refilled lazily when asked, never by a timer. A host's bucket is full
    again one second after its last use; such buckets are forgotten (a fresh one is the
    same), so the table holds only the hosts seen in the last second, and at most
    ``max_hosts`` of them (past that the least recently used goes, and that host starts
    afresh: more lenient, never stricter). ``refill``: tokens a second when not
    ``rate`` (a burst of ``rate``, then ``refill`` a second); any key may stand for a
    host (a peer id, for a bucket per identity).
    """

    __slots__ = ("_full_after", "_hosts", "_max_hosts", "_refill", "rate")

    def __init__(self, rate: int, max_hosts: int = _RATE_HOSTS_MAX,
                 refill: float | None = None) -> None:
        self.rate = check_int("max_new_peers_per_s", rate, 1)
        self._max_hosts = check_int("max_hosts", max_hosts, 1)
        # Tokens a second (default ``rate``: the bucket is full one second after use).
        self._refill = float(rate) if refill is None else refill
        if not self._refill > 0:
            raise ConfigError(f"refill must be > 0, got {refill!r}")
        self._full_after = self.rate / self._refill
        # host -> [tokens, when they were counted], least recently used first
        self._hosts: OrderedDict[str, list[float]] = OrderedDict()

    def tokens(self, host: str, now: float) -> float:
        """What ``host`` may still open at ``now`` (``rate`` for a host not seen lately)."""
        entry = self._hosts.get(host)
        if entry is None:
            return float(self.rate)
        return min(float(self.rate), entry[0] + max(0.0, now - entry[1]) * self._refill)

    def take(self, host: str, now: float) -> bool:
        """Charge one new identity to ``host``: True when its bucket held one (taken),
        False when it is empty (nothing changes but the refill up to ``now``)."""
        tokens = self.tokens(host, now)
        # A whole token up to rounding: 0.2 s at 5 a second after 10.0 s is 0.99999...
        taken = tokens >= 1.0 - _TOKEN_SLACK
        if taken:
            tokens = max(0.0, tokens - 1.0)
        hosts = self._hosts
        entry = hosts.get(host)
        if entry is None:
            hosts[host] = [tokens, now]
        else:
            entry[0], entry[1] = tokens, max(now, entry[1])
            hosts.move_to_end(host)
        # Forget the hosts whose bucket is full again (unused for a second).
        while hosts:
            oldest = next(iter(hosts.values()))
            if now - oldest[1] < self._full_after and len(hosts) <= self._max_hosts:
                break
            hosts.popitem(last=False)
        return taken

    def refund(self, host: str) -> None:
        """Give back the identity last charged to ``host`` (it was not admitted after all)."""
        entry = self._hosts.get(host)
        if entry is not None:
            entry[0] = min(float(self.rate), entry[0] + 1.0)

    def __len__(self) -> int:
        """How many hosts have a bucket that is not full."""
        return len(self._hosts)


class PendingDialBack(Protocol):
    """What eviction knows of a dial-back whose session is not ready."""

    @property
    def done(self) -> bool: ...  # its session is over already
    @property
    def origin(self) -> str: ...  # the host it is charged to
    @property
    def connected(self) -> bool: ...  # its ZMTP handshake succeeded


_P = TypeVar("_P", bound=PendingDialBack)


def eviction_victim(pending: Sequence[_P], origin: str) -> _P:
    """The dial-back to give up, oldest first in ``pending``, for a newcomer from
    ``origin``: a session already over; else, among those of hosts holding more pending
    dial-backs than the newcomer's (and the newcomer's own), one whose ZMTP handshake
    has not succeeded, of the host holding the most (the newcomer's own on a tie), the
    oldest; only when every one of them has succeeded, the oldest of the busiest host.
    So a host never loses a pending dial-back to a host holding as many, and a
    handshake that came up outlives every unproven one."""
    victim = next((p for p in pending if p.done), None)
    if victim is not None:
        return victim
    load: dict[str, int] = {}
    for p in pending:
        load[p.origin] = load.get(p.origin, 0) + 1
    mine = load.get(origin, 0)
    # Oldest first (sequence order); min() keeps the first of equal keys. One whose
    # handshake came up goes only when no unproven one may: a flood from many hosts
    # (each holding one) pushes out its own unproven dial-backs, never a progressing one.
    return min((p for p in pending if p.origin == origin or load[p.origin] > mine),
               key=lambda p: (p.connected, -load[p.origin], p.origin != origin))
