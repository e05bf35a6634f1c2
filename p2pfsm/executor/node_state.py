"""What every part of a :class:`~p2pfsm.executor.node.Node` shares: its state, declared
once, and the plumbing each part calls.

A node is one class put together from rooms, each with one job: this base (the fields,
host-call checks, and the way into its :class:`~p2pfsm.executor.driver.Driver`:
``_feed`` now, ``_queue`` for later, ``_drain``), :mod:`p2pfsm.executor.node_sessions`
(the peer/session table: open, frames in, ready, death, restart, redial, idle),
:mod:`p2pfsm.executor.node_effects` (carrying out the sessions' outputs and handing
results to the host), and :mod:`p2pfsm.executor.node` (the host API, the loop and the
wiring).
"""

from __future__ import annotations

import logging
import operator
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from p2pfsm.errors import LocalProtocolError
from p2pfsm.executor.admission import NewPeerRate
from p2pfsm.executor.bindings import Bindings
from p2pfsm.executor.config import NodeConfig
from p2pfsm.executor.driver import Driver
from p2pfsm.executor.jobs import Driven, JobFuture, LookupAsk, OpenJobs
from p2pfsm.executor.nixl_plane import DataPlane
from p2pfsm.executor.node_threads import DrivingThreads
from p2pfsm.executor.peer_ids import peer_address
from p2pfsm.executor.peer_policy import EndedSessions, IdleInbound, ViolationBudget
from p2pfsm.executor.redial import Parked, Redials
from p2pfsm.executor.served_lookups import ServedLookups
from p2pfsm.executor.writes import Writes
from p2pfsm.executor.zmq_plane import ControlPlane
from p2pfsm.logwindow import LogWindow
from p2pfsm.metrics import NodeMetrics
from p2pfsm.session import (
    DestinationReleased,
    FailReason,
    FetchArrived,
    HostDecline,
    HostFetch,
    HostFinish,
    HostLookup,
    HostSupply,
    Input,
    LoadResult,
    LookupResult,
    ProtocolViolation,
    RoundEnded,
    Session,
    SessionDead,
    StoreResult,
)
from p2pfsm.session.tombstones import TombstoneBudget
from p2pfsm.spec_log import CallHook

log = logging.getLogger("p2pfsm.node")

HOSTILE_LINES = "lines about refused peers"
"""The kind of the lines ``_hostile_log`` limits: ones a peer makes fire at will (a
refused handshake or registration, a session that dies before its handshake)."""

LookupAnswer = tuple[Mapping[bytes, int], Iterable[bytes]]
"""What ``on_lookup`` returns: hit key -> local block index, and still-pending keys."""

_HOST_CALLS: dict[type, str] = {HostFetch: "fetch", HostLookup: "lookup", HostSupply: "supply",
                                HostFinish: "finish", HostDecline: "decline"}
"""The host call each host input comes from (for the wrong-thread error)."""


def as_int(value: Any) -> Any:
    """A block index as a plain int: numpy and torch integers (anything with
    ``__index__`` but bool) become ints; anything else is left for the session to refuse
    with the index named."""
    if type(value) is int or isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def as_ints(values: Iterable[Any]) -> tuple[Any, ...]:
    """Block indexes as plain ints (:func:`as_int` each), with one C-level type check
    for the common case of a sequence of ints (256 indexes: ~3 us instead of ~25)."""
    t = tuple(values)
    if set(map(type, t)) == _JUST_INT:
        return t
    return tuple(map(as_int, t))


_JUST_INT = {int}


class NodeState(Driven):
    """A node's fields and shared plumbing (see the module docstring)."""

    config: NodeConfig
    on_lookup: Callable[[str, LookupAsk], LookupAnswer] | None
    on_fetch: Callable[[str, FetchArrived], None] | None
    on_result: Callable[[str, LoadResult | StoreResult | LookupResult], None] | None
    on_round_ended: Callable[[str, RoundEnded], None] | None
    on_released: Callable[[str, DestinationReleased], None] | None
    on_peer_state: Callable[[str, str, str], None] | None
    metrics: NodeMetrics
    control: ControlPlane
    data: DataPlane
    local_id: str
    incarnation: int
    sessions: dict[str, Session]
    deaths: OrderedDict[str, SessionDead]
    _holders: dict[str, list[Session]]
    _releases: OrderedDict[int, JobFuture[DestinationReleased]]
    violations: deque[tuple[str, ProtocolViolation]]
    _ended: EndedSessions
    _submitted: deque[Callable[[], None]]
    _writes: Writes
    _jobs: OpenJobs
    _started_at: dict[str, float]
    _served: ServedLookups
    _host_error_log: LogWindow
    _foreign_log: LogWindow
    _hostile_log: LogWindow
    _restarts: NewPeerRate
    _tombstones: TombstoneBudget
    _bindings: Bindings
    _violations: ViolationBudget
    _live: set[str]
    _idle: IdleInbound
    _job: int
    _closed: bool
    _threads: DrivingThreads
    _redials: Redials
    _unsent_death: Session | None
    _incarnations: OrderedDict[str, int | None]
    _hook: CallHook | None
    _driver: Driver

    if TYPE_CHECKING:  # defined by the other rooms of the node
        def finish(self, peer_id: str, kv_request_id: str) -> None: ...
        def connect(self, peer_id: str) -> Session: ...
        def _on_ready(self, peer_id: str, session: Session) -> None: ...
        def _on_death(self, peer_id: str, dead: SessionDead) -> None: ...
        def _close_for_violations(self, peer_id: str, session: Session) -> None: ...
        def _on_load_result(self, peer_id: str, res: LoadResult) -> None: ...
        def _fail_parked(self, peer_id: str, ev: Parked, reason: FailReason,
                         why: str) -> None: ...

    def new_job_id(self) -> int:
        self._job += 1
        return self._job

    def session(self, peer_id: str) -> Session:
        try:
            return self.sessions[peer_address(peer_id)]
        except KeyError:
            raise LocalProtocolError(f"no session to {peer_id}; connect first") from None

    def _check_open(self) -> None:
        if self._closed:
            raise LocalProtocolError("the node is closed")

    def _check_thread(self, what: str) -> None:
        """Refuse a call from another thread than the one driving the node."""
        self._threads.check(what)

    def _check_local_indexes(self, what: str, indexes: Iterable[object]) -> None:
        outside = [i for i in indexes
                   if type(i) is not int or not 0 <= i < self.config.num_blocks]
        if outside:
            raise LocalProtocolError(f"{what}: index {outside[0]!r} outside our region")

    def _host(self, peer_id: str, event: Input) -> None:
        self._check_open()
        self._check_thread(_HOST_CALLS.get(type(event), "a host call"))
        if self._redials.waiting(peer_id) and isinstance(event, HostFetch | HostLookup):
            # The session is dead and opens again soon: the call waits for it, up to
            # its own deadline.
            self.session(peer_id).check_host_call(event)  # bad arguments: refused now
            limit = (self.config.timeouts.load if isinstance(event, HostFetch)
                     else self.config.timeouts.lookup)
            self._redials.park(peer_id, time.monotonic() + limit, event)
            return
        self._feed(peer_id, event, session=self.session(peer_id))
        self._drain()

    def _queue(self, peer_id: str, event: Input, session: Session | None = None) -> None:
        """Queue ``event`` for ``session`` (default: the peer's session now)."""
        self._driver.queue(peer_id, event, session or self.sessions.get(peer_id))

    def _drain(self) -> None:
        """Handle queued events, then the queued host callbacks (the driver's drain)."""
        self._driver.drain()

    def _feed(self, peer_id: str, event: Input, *, session: Session | None = None) -> None:
        self._driver.feed(peer_id, event, session or self.sessions[peer_id])

    def _death_reason(self, peer_id: str) -> str:
        dead = self.deaths.get(peer_id)
        return f"session to {peer_id} died: {dead.reason if dead else 'unknown'}"

    def _peer_state(self, peer_id: str, state: str, detail: str) -> None:
        """Tell ``on_peer_state`` that a peer the host connected to is ``state``
        (``"connecting"``, ``"ready"``, ``"lost"``: a redial follows, ``"given up"``:
        none does), after the current step."""
        callback = self.on_peer_state
        if callback is None:
            return

        def call() -> None:
            try:
                callback(peer_id, state, detail)
            except Exception as exc:  # logged and counted; nothing depends on it
                self._host_failed("on_peer_state", peer_id, f"state {state!r}", exc)
        self._driver.defer(call)

    def _host_failed(self, callback: str, peer_id: str, what: str, exc: Exception) -> None:
        """A host callback raised: counted and logged (with its traceback, rate-limited);
        the caller fails only what the callback was about, and the node serves on."""
        self.metrics.count("host_errors")
        self._host_error_log.emit(
            log.error, "host callback errors", "host callback %s raised on the %s from %s "
            "(%s: %s); it fails, the node serves on", callback, what, peer_id,
            type(exc).__name__, exc, exc_info=exc)
