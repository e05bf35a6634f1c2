"""Sessions in every reachable state, and a structural digest of a session.

``STATES`` maps a name to a builder of a :class:`helpers.world.Driver` whose session
sits in that state; ``fresh(name)`` hands out a deep copy of a cached build, so each
fuzz example starts from the same state and may change it freely.

``digest(session)`` walks every attribute of the session and of its two parts (except
the clock, the output buffer, the immutable config, the owner link and the view) into
nested tuples: the session machine's state, the peer, the queue, the timers, the
tombstones, and for each round and lookup table its machine objects' identity,
``fsm_state`` and every data slot. A
rejected frame must leave it equal. The walker refuses a value type it does not know,
so a new kind of session state cannot slip past it unnoticed.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Callable

from helpers.world import (
    PEER_ID,
    Driver,
    key,
    peer_connect,
    ready_driver,
    ready_world,
    snapshot,
)

from p2pfsm.errors import P2PFSMError
from p2pfsm.protocol import ConnectAck, Disconnect, Fetch, Lookup
from p2pfsm.session import (
    HostAnswerLookup,
    HostClose,
    HostFetch,
    HostLookup,
    HostStart,
    HostSupply,
    LookupRequest,
    RegistrationFinished,
    Session,
    TimerId,
    TransportLost,
)
from p2pfsm.session.child import ChildEnv
from p2pfsm.session.client import ClientLookup, ClientRound
from p2pfsm.session.client_part import ClientPart
from p2pfsm.session.server import ServerLookup, ServerRound
from p2pfsm.session.server_part import ServerPart
from p2pfsm.session.timers import TimerTable
from p2pfsm.session.tombstones import Tombstones, purge_due

# last_disconnect: when a dead session last answered (its rate limit), not frame state.
_SKIP = frozenset({"now", "_out", "config", "tracer", "last_disconnect", "_view", "owner",
                   "env"})
_MACHINES = (ClientRound, ClientLookup, ServerRound, ServerLookup)


def _walk(v: object) -> object:
    if v is None or type(v) in (str, bytes, int, float, bool):
        return v
    if isinstance(v, enum.Enum):  # a round's FailReason
        return (type(v).__name__, v.value)
    if isinstance(v, _MACHINES):
        return (type(v).__name__, id(v),
                tuple((n, _walk(getattr(v, n))) for n in type(v).__slots__ if n != "env"))
    if isinstance(v, ChildEnv):  # the outbox (empty between steps) and the next write id
        return ("env", _walk(v.outbox), repr(v.xfers))
    if isinstance(v, Tombstones):
        return ("tombstones", v.ttl, _walk(v.entries()))
    if isinstance(v, TimerTable):  # the armed timers (not the heap's stale entries)
        return ("timers", _walk(dict(v)))
    if isinstance(v, ClientPart | ServerPart):  # a part: every table it owns
        return (type(v).__name__, _fields(v))
    if isinstance(v, dict):
        return ("dict", tuple((_walk(k), _walk(x)) for k, x in v.items()))
    if isinstance(v, list):
        return ("list", tuple(_walk(x) for x in v))
    if isinstance(v, tuple):
        return ("tuple", tuple(_walk(x) for x in v))
    if isinstance(v, set | frozenset):
        return ("set", tuple(sorted((_walk(x) for x in v), key=repr)))
    if isinstance(v, P2PFSMError):
        return ("error", type(v).__name__, str(v))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return (type(v).__name__,
                tuple((f.name, _walk(getattr(v, f.name))) for f in dataclasses.fields(v)))
    raise TypeError(f"digest: no rule for a {type(v).__name__} in the session")


def _fields(obj: object) -> tuple[tuple[str, object], ...]:
    return tuple((name, _walk(value)) for name, value in sorted(vars(obj).items())
                 if name not in _SKIP)


def digest(s: Session, unqueued: int = 0) -> object:
    """Everything a frame could change in ``s``, as comparable nested tuples; the last
    ``unqueued`` frames of its send queue left out."""
    fields = _fields(s)
    if unqueued:
        kept = list(s.view.queued)[:-unqueued]
        fields = tuple((n, _walk(kept) if n == "_queue" else v) for n, v in fields)
    return fields


def full_snapshot(s: Session, unqueued: int = 0) -> tuple[object, ...]:
    """``helpers.world.snapshot`` (state, open counts, pending work) plus the digest
    (:func:`digest`'s ``unqueued``)."""
    return (*snapshot(s), s.alive, s.ready, digest(s, unqueued))


def settle_clock(d: Driver) -> None:
    """Purge tombstones due at ``d.now``, as ``Session.handle`` does before anything else,
    so a before/after comparison sees only what the input itself changed."""
    purge_due((*d.s.client.tombstone_tables(), *d.s.server.tombstone_tables()), d.now)


# ------------------------------------------------------------------ builders
def _started() -> Driver:
    d = Driver()
    d(HostStart())
    return d


def _queued() -> Driver:
    # connecting, with a load and a lookup queued behind the handshake
    d = _started()
    d(HostFetch(1, "load", (key(1), key(2)), (10, 11)))
    d(HostLookup("look", (key(5),)))
    return d


def _registering() -> Driver:
    d = _queued()
    d.recv(peer_connect())
    return d


def _registering_acked() -> Driver:
    d = _registering()
    d.recv(ConnectAck(PEER_ID))
    return d


def _awaiting_ack() -> Driver:
    d = _registering()
    d(RegistrationFinished(True))
    return d


def _token(out: list[object]) -> int:
    reqs = [o for o in out if isinstance(o, LookupRequest)]
    assert len(reqs) == 1, out
    return reqs[0].token


def _busy() -> Driver:
    """Every kind of work open at once (see the comments)."""
    d = ready_driver()
    d(HostFetch(1, "load", (key(1), key(2)), (10, 11)))  # client round 0, loading
    d(HostFetch(2, "load2", (key(3),), (12,)))
    d(HostFetch(3, "abrt", (key(4),), (13,)))
    d.fire(TimerId("load", ("abrt", 0)))  # client round aborted, waiting for abort_ack
    d(HostLookup("look", (key(5), key(6))))  # client lookup probing
    d.recv(Fetch("serve", (key(3), key(4)), (20, 21), 0))  # server round serving
    d(HostSupply(50, "serve", (key(3),), (3,)))  # ... with a write in flight
    d.recv(Fetch("dem", (key(7),), (22,), 0))  # server round waiting for supply
    d(HostSupply(51, "pd", (key(8),), (8,)))  # unbound PD supply, no fetch yet
    _token(d.recv(Lookup("probe", (key(5),), 0)))  # served lookup waiting for the host
    token = _token(d.recv(Lookup("pinned", (key(9),), 1)))
    d(HostAnswerLookup(token, {key(9): 9}, 52))  # lookup-pinned round waiting for its fetch
    return d


def _after_abort() -> Driver:
    # a request whose aborted round left a tombstone, plus an expired lookup pin
    d = ready_driver()
    d(HostFetch(3, "abrt", (key(4),), (13,)))
    d.fire(TimerId("load", ("abrt", 0)))
    d.fire(TimerId("abort_ack", ("abrt", 0)))
    token = _token(d.recv(Lookup("pinned", (key(9),), 1)))
    d(HostAnswerLookup(token, {key(9): 9}, 52))
    for timer in d.armed("store"):
        d.fire(timer)
    return d


def _dead() -> Driver:
    """Its transport lost: the peer may still hold the session (it answers stale frames)."""
    d = _busy()
    d(TransportLost("heartbeat expired"))
    return d


def _ended() -> Driver:
    d = _busy()
    d.recv(Disconnect())
    return d


def _closed() -> Driver:
    d = _busy()
    d(HostClose())
    return d


def _sim_midrun() -> Driver:
    """Node a of a two-node SimWorld stopped mid-run: loads, lookups and supply in flight
    on both roles, frames still on the wire."""
    w = ready_world(auto_answer=False)
    w.load("a", "load", [8, 9])
    w.lookup("a", "look", [10, 11])
    w.supply("a", "serve", [1, 2])
    w.load("b", "serve", [1, 2, 3])
    w.lookup("b", "probe", [4])
    for _ in range(3):
        for node in ("a", "b"):
            if w.channels[(node, w.other(node))]:
                w.deliver(node)
    d = Driver(w.sessions["a"].config)
    d.s, d.now = w.sessions["a"], w.now
    return d


STATES: dict[str, Callable[[], Driver]] = {
    "idle": Driver,
    "connecting": _started,
    "connecting+queued": _queued,
    "registering": _registering,
    "registering_acked": _registering_acked,
    "awaiting_ack": _awaiting_ack,
    "ready": ready_driver,
    "ready+busy": _busy,
    "ready+tombstones": _after_abort,
    "dead": _dead,
    "ended": _ended,
    "closed": _closed,
    "sim-midrun": _sim_midrun,
}

_BUILT: dict[str, Driver] = {}


def fresh(name: str) -> Driver:
    """A private copy of the driver of state ``name`` (built once, then deep-copied)."""
    if name not in _BUILT:
        _BUILT[name] = STATES[name]()
    return copy.deepcopy(_BUILT[name])
