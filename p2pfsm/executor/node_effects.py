"""How a node carries out its sessions' outputs, and hands results to the host.

The :class:`~p2pfsm.executor.core.Executor` methods of a
:class:`~p2pfsm.executor.node.Node`, private to it (``_send_frame``, ...) and handed to
its driver through :class:`NodeOutputs`: frames go to the control plane, writes and
registrations to the data plane (:mod:`p2pfsm.executor.writes`); results resolve their
:class:`~p2pfsm.executor.jobs.JobFuture`; host callbacks (``on_lookup``, ``on_fetch``,
``on_result``, ``on_round_ended``) are deferred through the driver, so they run after
the session step, never inside it. Which session an output came from is the driver's
:attr:`~p2pfsm.executor.driver.Driver.applying`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from p2pfsm.errors import ConfigError, LocalProtocolError, TransportError
from p2pfsm.executor.core import Executor, handler_names
from p2pfsm.executor.jobs import JobFuture, LookupAsk
from p2pfsm.executor.node_state import HOSTILE_LINES, NodeState, as_int
from p2pfsm.executor.redial import Parked
from p2pfsm.executor.served_lookups import ServedLookup
from p2pfsm.logwindow import clip
from p2pfsm.protocol import AbortFetch, encode
from p2pfsm.session import (
    CancelWrite,
    DestinationReleased,
    FailReason,
    FetchArrived,
    HostAnswerLookup,
    HostFetch,
    HostLookup,
    LoadResult,
    LookupClosed,
    LookupRequest,
    LookupResult,
    ProtocolViolation,
    RegistrationFinished,
    RoundEnded,
    SendFrame,
    SendToLostPeer,
    Session,
    SessionDead,
    StartRegistration,
    StartWrite,
    StoreResult,
    TransportLost,
    WriteFinished,
)

log = logging.getLogger("p2pfsm.node")


class NodeOutputs(Executor):
    """What the node's driver carries each output out with: the node's own private
    method of the same name (``_send_frame`` for ``send_frame``, ...), bound here once,
    so that the node's public namespace holds host calls only. A method the node does
    not define keeps :class:`Executor`'s default."""

    def __init__(self, node: NodeEffects) -> None:
        for name in handler_names():
            own = getattr(node, f"_{name}", None)
            if own is not None:
                setattr(self, name, own)


class NodeEffects(NodeState):
    """The node's effects: each output of a session, carried out."""

    def _session_ready(self, peer: str, session: Session) -> None:
        self._on_ready(peer, session)

    def _session_over(self, peer: str, session: Session) -> None:
        if peer in self._live and self.sessions.get(peer) is session:
            self._live.discard(peer)  # died or closed

    def _send_frame(self, peer: str, out: SendFrame) -> None:
        if not self.control.send(peer, encode(out.message)):
            self._queue(peer, TransportLost("send failed"), self._driver.applying)
        elif isinstance(out.message, AbortFetch):
            self.metrics.count("aborts_sent")
            log.info("peer %s: aborting %s round %d", peer, out.message.kv_request_id,
                     out.message.round_seq)

    def _send_to_lost_peer(self, peer: str, out: SendToLostPeer) -> None:
        """A dead session tells a peer that may still hold it live that it is over: over
        our connection to it while it lasts, else the control plane dials it back."""
        if peer in self.control.peers:
            self._send_frame(peer, out)
            return
        if self.control.answer(peer, encode(out.message)):
            self.metrics.count("stale_answers")
            sender = self._driver.applying
            log.info("peer %s: told that its session is over (%s)", peer,
                     None if sender is None else sender.death_reason)

    def _start_write(self, peer: str, out: StartWrite) -> None:
        session = self._driver.applying
        assert session is not None  # outputs are applied only from the driver's feed
        try:
            self._writes.start(peer, out, session)
        except TransportError as exc:
            log.warning("write to %s failed to start: %s", peer, clip(exc))
            self._queue(peer, WriteFinished(out.xfer, False), session)

    def _cancel_write(self, peer: str, out: CancelWrite) -> None:
        write = self._writes.cancel(self._driver.applying, out.xfer)
        if write is not None:
            self._queue(peer, WriteFinished(out.xfer, False), write.session)

    def _start_registration(self, peer: str, out: StartRegistration) -> None:
        c = out.connect
        try:
            self.data.add_peer(peer, c.agent_metadata, c.base_addr, c.num_blocks, c.block_len,
                               c.layout, c.layout_names)
            result = RegistrationFinished(True)
        except (TransportError, ConfigError) as exc:
            self._hostile_log.emit(log.warning, HOSTILE_LINES,
                                   "peer %s: cannot register its memory: %s", peer, clip(exc))
            result = RegistrationFinished(False, clip(exc))
        self._queue(peer, result, self._driver.applying)

    def _load_result(self, peer: str, out: LoadResult) -> None:
        self._on_load_result(peer, out)

    def _store_result(self, peer: str, out: StoreResult) -> None:
        self._deliver(peer, self._jobs.stores.pop(out.job_id, None), out)

    def _lookup_result(self, peer: str, out: LookupResult) -> None:
        if (out.reason is FailReason.SESSION_ENDED and self._unsent_death is not None
                and self._driver.applying is self._unsent_death
                and self._redials.waiting(peer)):
            # Never sent (its session died before ready, and opens again): it waits for
            # the next session, as a fetch does, until the deadline it had when the host
            # asked (each failed attempt must not start it anew).
            waiting = self._jobs.lookups.get((peer, out.kv_request_id))
            asked = waiting[0].started if waiting else time.monotonic()
            deadline = asked + self.config.timeouts.lookup
            if deadline > time.monotonic():
                self._redials.park(peer, deadline, HostLookup(out.kv_request_id, out.keys))
                return
        if out.reason is not None:
            out = dataclasses.replace(out, detail=self._fail_detail(peer, out))
        fut = self._jobs.take_lookup(peer, out.kv_request_id)
        if fut is not None:
            self.metrics.observe("lookup_seconds", time.monotonic() - fut.started)
            hits = sum(out.hits)
            self.metrics.count("lookup_keys_hit", hits)
            self.metrics.count("lookup_keys_missed", len(out.hits) - hits)
            self.metrics.count("lookups_answered" if out.answered else "lookups_failed")
        self._deliver(peer, fut, out)

    def _lookup_request(self, peer: str, out: LookupRequest) -> None:
        session = self._driver.applying
        assert session is not None  # outputs are applied only from _feed
        self._driver.defer(lambda: self._answer(peer, session, out))

    def _lookup_closed(self, peer: str, out: LookupClosed) -> None:
        token = self._served.token_of(peer, out.token)
        if token is not None:
            self._served.forget(token)

    def _fetch_arrived(self, peer: str, out: FetchArrived) -> None:
        on_fetch = self.on_fetch
        if on_fetch is not None:
            self._driver.defer(lambda: self._call_on_fetch(on_fetch, peer, out))

    def _round_ended(self, peer: str, out: RoundEnded) -> None:
        on_round_ended = self.on_round_ended
        if on_round_ended is not None:
            self._driver.defer(lambda: self._call_on_round_ended(on_round_ended, peer, out))

    def _session_dead(self, peer: str, out: SessionDead) -> None:
        self._on_death(peer, out)

    def release_of(self, job_id: int) -> JobFuture[DestinationReleased]:
        """The release of load job ``job_id``'s destination, whose LoadResult said
        ``released=False``: the future resolves with its DestinationReleased (the cause
        says what proved the peer's writes over), exactly once. Ask for it once the
        result came (resolved ones are kept for ``history`` more).

        Raises:
            LocalProtocolError: no such result of this node held its destination.
        """
        fut = self._releases.get(job_id)
        if fut is None:
            raise LocalProtocolError(f"release_of: load job {job_id} has no held destination "
                                     "(its result said released=True, is not in yet, or is "
                                     "too old)")
        return fut

    def _destination_released(self, peer: str, out: DestinationReleased) -> None:
        self.metrics.count("destinations_released")
        log.info("load job %d (%s): destination released (%s)", out.job_id,
                 out.kv_request_id, out.cause.value)
        fut = self._release_future(out.job_id)
        if not fut.done():
            fut.set_result(out)
        on_released = self.on_released
        if on_released is not None:
            self._driver.defer(lambda: self._call_on_released(on_released, peer, out))

    def _release_future(self, job_id: int) -> JobFuture[DestinationReleased]:
        """The future of a held destination's release (made at its failed result, or at
        the notice); the oldest resolved ones are forgotten past ``history``."""
        fut = self._releases.get(job_id)
        if fut is None:
            fut = self._releases[job_id] = JobFuture(self)
            done = [j for j, f in self._releases.items() if f.done()]
            for old in done[:max(0, len(done) - self.config.history)]:
                del self._releases[old]
        return fut

    def _call_on_released(self, on_released: Callable[[str, DestinationReleased], None],
                          peer_id: str, out: DestinationReleased) -> None:
        try:
            on_released(peer_id, out)
        except Exception as exc:  # the notice is in its future already
            self._host_failed("on_released", peer_id, f"job {out.job_id}", exc)

    def _protocol_violation(self, peer: str, out: ProtocolViolation) -> None:
        self._on_violation(peer, out)

    def _call_on_fetch(self, on_fetch: Callable[[str, FetchArrived], None], peer_id: str,
                       arrived: FetchArrived) -> None:
        if peer_id in self.sessions and self.sessions[peer_id].alive:
            try:
                on_fetch(peer_id, arrived)
            except Exception as exc:
                # The request fails: finishing it fails the round (transfer_done(false)
                # once its writes have landed) and any later round of it at once.
                rid = arrived.kv_request_id
                self._host_failed("on_fetch", peer_id, f"request {rid}", exc)
                session = self.sessions.get(peer_id)
                if session is not None and session.alive:
                    with contextlib.suppress(LocalProtocolError):  # finished already
                        self.finish(peer_id, rid)

    def _call_on_round_ended(self, on_round_ended: Callable[[str, RoundEnded], None],
                             peer_id: str, ended: RoundEnded) -> None:
        try:
            on_round_ended(peer_id, ended)
        except Exception as exc:  # logged and counted; nothing else depends on it
            self._host_failed("on_round_ended", peer_id,
                              f"round {ended.kv_request_id}/{ended.round_seq}", exc)

    def _on_load_result(self, peer_id: str, res: LoadResult) -> None:
        load = self._jobs.loads.get(res.job_id)
        if (load is not None and res.reason is FailReason.SESSION_ENDED
                and self._unsent_death is not None and self._driver.applying is self._unsent_death
                and self._redials.waiting(peer_id)):
            deadline = load.started + self.config.timeouts.load
            if deadline > time.monotonic():  # never sent: it waits for the next session
                self._redials.park(peer_id, deadline, load.event)
                return
        self._jobs.loads.pop(res.job_id, None)
        if not res.success:
            res = dataclasses.replace(res, detail=self._fail_detail(peer_id, res))
        if load is not None:
            self.metrics.observe("fetch_seconds", time.monotonic() - load.started)
            if res.success:
                self.metrics.count("fetches_succeeded")
                self.metrics.count("fetch_bytes", load.nbytes)
            else:
                self.metrics.count("fetches_failed")
                if res.reason is not None:
                    self.metrics.count(f"fetches_failed_{res.reason.value}")
                log.info("load job %d (%s) failed: %s; destination released: %s",
                         res.job_id, res.kv_request_id, res.detail, res.released)
            if not res.released:
                self._release_future(res.job_id)  # what Node.release_of hands out
        self._deliver(peer_id, None if load is None else load.future, res)

    def _fail_detail(self, peer_id: str, res: LoadResult | LookupResult) -> str:
        """The session's detail, naming the peer (and why its session ended)."""
        text = f"from {peer_id}: {res.detail or 'failed'}"
        session = self._driver.applying or self.sessions.get(peer_id)
        if (res.reason is FailReason.SESSION_ENDED and session is not None
                and session.death_reason):
            text += f" ({session.death_reason})"
        return text

    def _deliver(self, peer_id: str, fut: JobFuture[Any] | None,
                 value: LoadResult | StoreResult | LookupResult) -> None:
        """Hand a result to its future (and ``on_result``); count one nobody holds."""
        if fut is None:
            self.metrics.count("results_dropped")
            log.error("result with no job waiting for it (a bug): %r", value)
        elif not fut.done():
            fut.set_result(value)
        on_result = self.on_result
        if on_result is not None:
            self._driver.defer(lambda: self._call_on_result(on_result, peer_id, value))

    def _call_on_result(self, on_result: Callable[[str, Any], None], peer_id: str,
                        value: LoadResult | StoreResult | LookupResult) -> None:
        try:
            on_result(peer_id, value)
        except Exception as exc:  # the result is in its future already
            self._host_failed("on_result", peer_id, type(value).__name__, exc)

    def _fail_parked(self, peer_id: str, ev: Parked, reason: FailReason,
                     why: str) -> None:
        if isinstance(ev, HostFetch):
            self._on_load_result(peer_id, LoadResult(
                ev.job_id, ev.kv_request_id, False, True, reason, why))
        else:
            self._lookup_result(peer_id, LookupResult(
                ev.kv_request_id, ev.keys, (False,) * len(ev.keys), False, reason, why))

    def _on_violation(self, peer_id: str, violation: ProtocolViolation) -> None:
        self.violations.append((peer_id, violation))
        self.metrics.count("violations")
        count = self._violations.rejected(peer_id)
        session = self._driver.applying
        if self._violations.crossed(count) and session is not None:
            log.warning("peer %s: %d rejected frames (budget %d): closing the session",
                        peer_id, count, self._violations.budget)
            self.metrics.count("violation_closes")
            self._driver.defer(lambda: self._close_for_violations(peer_id, session))
        self._violations.log(peer_id, log, violation.error)

    def _answer(self, peer_id: str, session: Session, req: LookupRequest) -> None:
        """Ask ``on_lookup``, showing it our token for the lookup (unique in this node,
        unlike the session's, which restarts with each session) and the future of the
        pins it returns."""
        token = self._served.new_token()
        pins: JobFuture[StoreResult] = JobFuture(self)
        hits: dict[bytes, int] = {}
        pending: frozenset[bytes] = frozenset()
        self.metrics.count("lookups_served")
        if self.on_lookup is not None:
            ask = LookupAsk(token, req.kv_request_id, req.round_seq, req.keys, pins)
            self._served.asking = token
            try:
                answer_hits, answer_pending = self.on_lookup(peer_id, ask)
                hits = {k: as_int(v) for k, v in answer_hits.items()}
                pending = frozenset(answer_pending)
                self._check_local_indexes("on_lookup", hits.values())
            except Exception as exc:  # answered all MISS: nothing was pinned for it
                self._host_failed("on_lookup", peer_id, f"lookup of {req.kv_request_id}", exc)
                hits, pending = {}, frozenset()
            finally:
                self._served.asking = None
        job = None
        if hits:
            job = self.new_job_id()
            self._jobs.stores[job] = pins
        else:
            pins.set_result(StoreResult(0, False, FailReason.NOT_SERVED, "nothing was pinned"))
        if pending - hits.keys():
            self._served.hold(token, ServedLookup(peer_id, session, req.token,
                                                  pending - hits.keys()))
        self._feed(peer_id, HostAnswerLookup(req.token, hits, job, pending), session=session)
