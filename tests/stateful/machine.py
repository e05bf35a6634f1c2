"""The rule-based state machine: two real sessions, an adversarial environment.

The environment events are the rules; the sessions decide what they mean. Besides host
calls, delivery, writes landing and completing, timers and faults, rules aim at the
windows where vLLM's races live: an abort or a timer while a write is in flight, a
load deadline while its transfer_done is on the wire and a reload right after, a second
round of a request answered before the first, a cancelled write that still lands before
its cancel completes, the session lost while work is in flight (an abort whose write may
still land, a draining round, a lookup whose answer the host holds back), idle time within a
frame's lifetime while frames are on the wire, a host's lookup answer held back past the
lookup's end, a hostile fetch naming the block one past the region, the peer's connect
heard again (same incarnation, a new one, or none at all); and examples start
in such contended states (:data:`CONTENDED`).
Each example first draws a *swarm* (a random subset of the
optional rule families, the number of request ids, whether cancelled writes land) so
that rare interleavings are not drowned by the other rules, and reports *targets*
(``hypothesis.target``) that steer generation towards more of those windows.

What is checked is described in ``tests/stateful/world.py`` and
``tests/stateful/test_two_sessions.py``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import hypothesis.strategies as st
from hypothesis import note, target
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from p2pfsm.demo_blocks import demo_key
from p2pfsm.errors import LocalProtocolError
from p2pfsm.fsm import Tracer
from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, TransferDone, decode
from p2pfsm.session import HostAnswerLookup, Timeouts, TimerId

from .oracle import Oracle
from .world import CheckedWorld

NODES = st.sampled_from(("a", "b"))
REQUEST_IDS = ("r1", "r2", "r3")
HELD = {"a": range(0, 6), "b": range(6, 12)}
KEY_OF = {demo_key(i): i for i in range(16)}
PICKS = st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True)
"""Offsets into a node's held blocks; 6 and above name a block nobody stores (a miss)."""
FAMILIES = ("lookup", "finish", "timers", "races", "rounds", "faults", "malformed", "parts")
"""Optional rule families a swarm may switch off (the core rules are always on)."""
GARBAGE = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([
        b"\x81\xa4type\xa5fetch",  # fetch without fields
        b"\x84\xa4type\xadtransfer_done\xadkv_request_id\xa2r1\xa7success\x01\xa9round_seq\x00",
        b"\x83\xa4type\xa5fetch\xa4keys\x91\xa1k\xadblock_indexes\x91\xff",
        b"\x91\x91\x91\x91",
    ]),
)
ROUND_MACHINES = ("client_round", "server_round")
CONTENDED = ("writing", "replied", "replied", "two rounds")
"""States an example may start in, after the handshake (each a load of two blocks):
its writes in flight; its transfer_done on the wire (twice the weight: P4's window opens
from there); a second round of the same request with its own write in flight."""
LOSSES = ("consumer closes", "producer closes", "cut", "consumer's link down",
          "producer's link down")
"""How a session is lost: a host closes it (the peer learns it from the disconnect), the
connection is cut (both sides learn it), or one side alone sees its transport go."""
LOSS_AFTER = 10
"""Steps an example takes before a loss rule may end its sessions."""
TIMEOUTS = Timeouts(handshake=50, load=5, abort_ack=2, store=8, lookup=4, lookup_pending=1,
                    tombstone=60)
HOSTILE_RID = "rx"
"""The request a hostile peer's out-of-region fetch names (no host loads it)."""


def _blocks(node: str, picks: list[int]) -> list[int]:
    base = HELD[node].start
    return [base + p if p < 6 else 6 + p for p in picks]  # 12..15: stored nowhere


def _on(family: str) -> Any:
    return lambda self: family in getattr(self, "swarm", ())


class TwoSessions(RuleBasedStateMachine):
    """Two sessions over FIFO channels that may lose frames or be cut (ZeroMQ over TCP).

    :class:`HostileNetwork` also duplicates and reorders frames.
    """

    CHECK_DESTINATIONS = True

    @initialize(faults=st.integers(0, 4), fatal=st.sampled_from((False, False, False, True)),
                handshake_first=st.sampled_from((True, True, False)),
                swarm=st.frozensets(st.sampled_from(FAMILIES)),
                requests=st.integers(1, len(REQUEST_IDS)),
                late_cancel=st.sampled_from((True, True, False)),
                retries=st.sampled_from((0, 2, 5)),
                contended=st.lists(st.sampled_from(CONTENDED), min_size=1, max_size=2),
                incarnations=st.sampled_from((True, True, False)))
    def setup(self, faults: int, fatal: bool, handshake_first: bool, swarm: frozenset[str],
              requests: int, late_cancel: bool, retries: int,
              contended: list[str], incarnations: bool = True) -> None:
        self.tracer = Tracer()
        self.swarm = swarm
        self.rids = REQUEST_IDS[:requests]
        self.stats: Counter[str] = Counter()
        note(f"swarm: {sorted(swarm)}, requests {self.rids}, late cancel {late_cancel}, "
             f"retries {retries}, contended {contended}")
        # Each node stores 0..5 (a) or 6..11 (b); both can serve and load.
        self.oracle = Oracle({n: frozenset(demo_key(i) for i in HELD[n]) for n in HELD},
                             exact_lookups="parts" not in swarm,
                             fifo=self.CHECK_DESTINATIONS, clock=lambda: self.world.now,
                             tombstone=TIMEOUTS.tombstone)
        self.world = CheckedWorld(0, block_len=8, num_blocks=48,
                                  check_destinations=self.CHECK_DESTINATIONS,
                                  check_rounds=self.CHECK_DESTINATIONS,
                                  cancelled_writes_land=late_cancel, retries=retries,
                                  held=HELD, parts="parts" in swarm,
                                  incarnations=incarnations,
                                  timeouts=TIMEOUTS,
                                  tracer=self.tracer, hook=self.oracle)
        self.fault_budget = faults
        self.fatal_budget = int(fatal)
        self.lost = False  # a loss rule ended the sessions (one per example)
        self.world.start()
        if handshake_first:
            self.world.stabilize()
            stages = [("ab"[i % 2], self.rids[i % len(self.rids)], i, stage)
                      for i, stage in enumerate(contended)]
            for node, rid, i, stage in stages:
                self._contend(node, rid, i, stage)
            # Replies last: a later stage's fetch would deliver an earlier one's reply.
            for node, _, _, stage in stages:
                if stage == "replied":
                    self._reply(self.world.other(node))

    def _contend(self, node: str, rid: str, i: int, stage: str) -> None:
        """Start in a contended state (:data:`CONTENDED`): ``node`` loads two of its
        peer's blocks, the peer has supplied them and its writes are in flight."""
        peer = self.world.other(node)
        held = list(HELD[peer])
        self._load_with_writes_in_flight(node, rid, held[2 * i: 2 * i + 2])
        if stage == "two rounds":
            self._load_with_writes_in_flight(node, rid, held[4 + i: 5 + i])

    def _reply(self, producer: str) -> None:
        """``producer``'s writes land and complete: its transfer_done is on the wire."""
        for key in sorted(k for k in self.world.writes if k[0] == producer):
            self.world.land(*key)
            self.world.complete(*key)

    def _load_with_writes_in_flight(self, node: str, rid: str, blocks: list[int]) -> None:
        peer = self.world.other(node)
        self.world.supply(peer, rid, blocks)
        self.world.fetch(node, rid, blocks)
        while self.world.channels[(node, peer)]:
            self.world.deliver(node)
        while self.world.registrations:
            self.world.register(sorted(self.world.registrations)[0])

    def _rid(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(self.rids), label="rid")

    # ---------------------------------------------------------------- host
    @rule(data=st.data(), node=NODES, picks=PICKS)
    def fetch(self, data: st.DataObject, node: str, picks: list[int]) -> None:
        self.world.fetch(node, self._rid(data), _blocks(self.world.other(node), picks))

    @rule(data=st.data(), node=NODES, picks=PICKS)
    def supply(self, data: st.DataObject, node: str, picks: list[int]) -> None:
        self.world.supply(node, self._rid(data), _blocks(node, picks))

    @precondition(_on("lookup"))
    @rule(data=st.data(), node=NODES, picks=PICKS)
    def lookup(self, data: st.DataObject, node: str, picks: list[int]) -> None:
        self.world.lookup(node, self._rid(data), _blocks(self.world.other(node), picks))

    @precondition(lambda self: _on("lookup")(self) and any(
        r.answered and any(r.hits) for h in self.world.hosts.values() for r in h.lookup_results))
    @rule(data=st.data())
    def fetch_lookup_hits(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from([n for n, h in self.world.hosts.items()
                                          if any(r.answered and any(r.hits)
                                                 for r in h.lookup_results)]))
        res = [r for r in self.world.hosts[node].lookup_results if r.answered and any(r.hits)][-1]
        hits = [KEY_OF[k] for k, hit in zip(res.keys, res.hits, strict=True) if hit]
        self.world.fetch(node, res.kv_request_id, hits)

    @precondition(lambda self: bool(self.world.deferred))
    @rule(data=st.data())
    def resolve_deferred_lookup(self, data: st.DataObject) -> None:
        """A host finds the keys it left pending ("parts": its producer has sent the
        first part already); the rest of the answer follows in another lookup_resp."""
        self.world.resolve_deferred(
            data.draw(st.integers(0, len(self.world.deferred) - 1), label="deferred"))

    @precondition(lambda self: self.fatal_budget > 0)
    @rule(node=NODES)
    def close(self, node: str) -> None:
        self.fatal_budget -= 1
        self.world.close(node)

    @precondition(_on("finish"))
    @rule(data=st.data(), node=NODES)
    def finish(self, data: st.DataObject, node: str) -> None:
        self.world.finish(node, self._rid(data))

    def _looking_up(self) -> list[tuple[str, str]]:
        """(consumer, request) pairs with a lookup round no fetch has closed: the
        consumer's finish of one sends the terminal fetch."""
        return [(n, rid) for n in "ab"
                for rid in sorted(self.world.sessions[n].view.lookup_rounds)]

    def _finished_by_peer(self, producer: str, rid: str) -> bool:
        """The peer's terminal fetch of ``rid`` reached ``producer`` and the peer named no
        round of it since (and ``producer``'s host did not finish it)."""
        return (self.world.sessions[producer].view.peer_finished(rid) is not None
                and rid not in self.world.hosts[producer].finished)

    @precondition(lambda self: _on("finish")(self) and bool(self._looking_up()))
    @rule(data=st.data(), picks=PICKS)
    def supply_after_the_peer_finished(self, data: st.DataObject, picks: list[int]) -> None:
        """A consumer finishes a request it looked up and did not fetch (its terminal
        fetch), and the producer's host supplies the request once that fetch arrived: no
        fetch will read the supply, so its job has its result (its pins released) in
        that step, not at the store deadline."""
        node, rid = data.draw(st.sampled_from(self._looking_up()), label="looking up")
        seq = self.world.sessions[node].view.lookup_rounds[rid]
        producer = self.world.other(node)
        self.world.finish(node, rid)
        self._deliver_until(node, Fetch, (rid, seq))  # up to the terminal fetch
        if not self._finished_by_peer(producer, rid):
            return  # the fetch is still queued or was lost, or a session ended
        self.stats["supplies after the peer finished"] += 1
        job = self.world.supply(producer, rid, _blocks(producer, picks))
        assert job is not None
        result = self.world.hosts[producer].store_results.get(job)
        assert result is not None and not result.success, (producer, rid, job, result)

    @precondition(lambda self: _on("rounds")(self) and any(self._open_loads(n) for n in "ab"))
    @rule(data=st.data(), picks=PICKS)
    def another_round(self, data: st.DataObject, picks: list[int]) -> None:
        """A second load of a request whose first is still open (a new round)."""
        node = data.draw(st.sampled_from([n for n in "ab" if self._open_loads(n)]))
        rid = data.draw(st.sampled_from(sorted({ld.kv_request_id
                                                for ld in self._open_loads(node)})))
        self.world.fetch(node, rid, _blocks(self.world.other(node), picks))

    def _failed_loads(self, node: str) -> list:  # type: ignore[type-arg]
        host = self.world.hosts[node]
        return [host.loads[j] for j, r in sorted(host.load_results.items()) if not r.success]

    @precondition(lambda self: _on("rounds")(self) and any(self._failed_loads(n) for n in "ab"))
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        """The host loads a failed load's keys again, for the same request (a new round)."""
        node = data.draw(st.sampled_from([n for n in "ab" if self._failed_loads(n)]))
        load = data.draw(st.sampled_from(self._failed_loads(node)[-3:]))
        self.world.fetch(node, load.kv_request_id, load.key_ids)

    def _replied_requests(self, node: str) -> list[str]:
        """Requests of ``node`` with a load that ended while a frame of the same request
        that asks for or is a reply is still on the wire (an abort_fetch that crossed the
        transfer_done, the abort_ack it will get, a duplicate reply): the window in which
        a reused round number is taken for the old one (vLLM P4)."""
        host = self.world.hosts[node]
        ended = {host.loads[j].kv_request_id for j in host.load_results}
        replies = set()
        for frame in [*self.world.channels[(self.world.other(node), node)],
                      *self.world.channels[(node, self.world.other(node))]]:
            try:
                msg = decode(frame)
            except Exception:  # injected garbage
                continue
            if isinstance(msg, TransferDone | AbortAck | AbortFetch):
                replies.add(msg.kv_request_id)
        return sorted(ended & replies)

    @precondition(lambda self: any(self._replied_requests(n) for n in "ab"))
    @rule(data=st.data(), picks=PICKS, wait=st.sampled_from((0.0, 0.0, 0.5, 1.0)))
    def new_round_while_replies_in_flight(self, data: st.DataObject, picks: list[int],
                                          wait: float) -> None:
        """The host loads a request again while a reply to its ended round is on the
        wire, maybe after time passed idly (``wait``: that share of what is left of the
        oldest frame's lifetime): the new round must not be mistaken for the old one."""
        node = data.draw(st.sampled_from([n for n in "ab" if self._replied_requests(n)]))
        rid = data.draw(st.sampled_from(self._replied_requests(node)))
        self.stats["new rounds while a reply of the request is in flight"] += 1
        self._idle(wait)
        self.world.fetch(node, rid, _blocks(self.world.other(node), picks))

    # ------------------------------------------------------------- network
    @precondition(lambda self: any(self.world.channels.values()))
    @rule(data=st.data(), count=st.sampled_from((1, 1, 1, 3)))
    def deliver(self, data: st.DataObject, count: int) -> None:
        src = data.draw(st.sampled_from([s for (s, _), c in self.world.channels.items() if c]))
        chan = self.world.channels[(src, self.world.other(src))]
        for _ in range(count):
            if not chan:
                break
            self._deliver_one(src)

    def _deliver_one(self, src: str) -> bytes:
        """Deliver ``src``'s next frame, checking that it touched only its own round."""
        frame = self.world.channels[(src, self.world.other(src))][0]
        before = len(self.tracer.records)
        self.world.deliver(src)
        self._check_isolation(frame, self.tracer.records[before:])
        return frame

    @precondition(lambda self: any(self.world.registrations))
    @rule(data=st.data())
    def register(self, data: st.DataObject) -> None:
        self.world.register(data.draw(st.sampled_from(sorted(self.world.registrations))))

    @precondition(lambda self: bool(self.world.writes))
    @rule(data=st.data())
    def land(self, data: st.DataObject) -> None:
        self.world.land(*data.draw(st.sampled_from(sorted(self.world.writes))))

    @precondition(lambda self: any(w.landed or w.cancelled for w in self.world.writes.values()))
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        done = sorted(k for k, w in self.world.writes.items() if w.landed or w.cancelled)
        self.world.complete(*data.draw(st.sampled_from(done)))

    @rule()
    def progress(self) -> None:
        """Everything in flight happens, in order, without faults or timers."""
        self.world.stabilize()

    @precondition(lambda self: any(self._open_loads(n) for n in ("a", "b")))
    @rule(data=st.data(), partial=st.booleans())
    def supply_for_peer_load(self, data: st.DataObject, partial: bool) -> None:
        node = data.draw(st.sampled_from([n for n in ("a", "b")
                                          if self._open_loads(self.world.other(n))]))
        load = data.draw(st.sampled_from(self._open_loads(self.world.other(node))))
        blocks = load.key_ids[: max(1, len(load.key_ids) // 2)] if partial else load.key_ids
        self.world.supply(node, load.kv_request_id, blocks)

    def _open_loads(self, node: str) -> list:  # type: ignore[type-arg]
        host = self.world.hosts[node]
        return [ld for j, ld in sorted(host.loads.items()) if j not in host.load_results]

    # -------------------------------------------------------------- timers
    @precondition(lambda self: _on("timers")(self) and self.world.can_advance())
    @rule(now=st.sampled_from((True, False, False)))
    def advance(self, now: bool) -> None:
        """Fire the next timer (one draw in three, so timeouts race progress, not swamp it)."""
        if now:
            self._count_race()
            self.world.advance()

    def _firable(self, node: str) -> list:  # type: ignore[type-arg]
        """Timers of ``node`` that may fire now: late is possible, but no frame may outlive
        its lifetime (the sessions' tombstone assumption)."""
        w = self.world
        oldest = min((t for times in w.sent_at.values() for t in times), default=None)
        return sorted(((d, str(t), t) for t, d in w.timers[node].items()
                       if oldest is None or d <= oldest + w.max_delay), key=lambda x: x[:2])

    @precondition(lambda self: _on("timers")(self) and any(self._firable(n) for n in "ab"))
    @rule(data=st.data(), count=st.sampled_from((1, 1, 2, 3)))
    def fire_a_timer(self, data: st.DataObject, count: int) -> None:
        """Any armed timer of a node fires (the executor may be late with the others),
        then the node's next ones, ``count`` in all (its clock runs ahead)."""
        node = data.draw(st.sampled_from([n for n in "ab" if self._firable(n)]))
        _, _, timer = data.draw(st.sampled_from(self._firable(node)))
        self._count_race()
        self.world.fire_timer(node, timer)
        self._fire_next(node, count - 1)

    @precondition(lambda self: _on("timers")(self) and any(
        self._open_loads(n) and self._firable(n) for n in "ab"))
    @rule(data=st.data(), count=st.sampled_from((2, 3)))
    def load_times_out(self, data: st.DataObject, count: int) -> None:
        """A node with loads open lets its next timers fire (load deadline, abort re-sent)."""
        node = data.draw(st.sampled_from([n for n in "ab" if self._open_loads(n)
                                          and self._firable(n)]))
        self._count_race()
        self._fire_next(node, count)

    def _fire_next(self, node: str, count: int) -> None:
        for _ in range(count):
            firable = self._firable(node)
            if not firable:
                return
            self.world.fire_timer(node, firable[0][2])

    # --------------------------------------------------------------- races
    def _writes_in_flight(self) -> list[tuple[str, int]]:
        return sorted(k for k, w in self.world.writes.items() if not w.cancelled)

    def _count_race(self) -> None:
        if self.world.writes:
            self.stats["timers or aborts while writing"] += 1

    @precondition(lambda self: _on("races")(self) and bool(self._writes_in_flight()))
    @rule(data=st.data(), how=st.sampled_from(("finish", "timer")),
          timers=st.sampled_from((1, 1, 2, 3)))
    def abort_while_writing(self, data: st.DataObject, how: str, timers: int) -> None:
        """The consumer of a write in flight gives up on its request: its host finishes
        it, or its next ``timers`` timers fire (the load deadline, then the abort_ack
        deadline: the abort is re-sent)."""
        src, xfer = data.draw(st.sampled_from(self._writes_in_flight()))
        consumer = self.world.other(src)
        host = self.world.hosts[consumer]
        remote = set(self.world.writes[(src, xfer)].remote_indexes)
        rids = sorted({ld.kv_request_id for ld in host.loads.values() if remote & set(ld.dest)})
        self._count_race()
        firable = self._firable(consumer)
        if how == "timer" and firable:
            self._fire_next(consumer, timers)
        elif rids:
            self.world.finish(consumer, data.draw(st.sampled_from(rids)))

    # The race rules weigh three times the others (swarm weights: when "races" is on).
    @precondition(lambda self: _on("races")(self) and bool(self._writes_in_flight()))
    @rule(data=st.data(), how=st.sampled_from(("finish", "timer")),
          timers=st.sampled_from((1, 2, 3)))
    def abort_while_writing_again(self, data: st.DataObject, how: str, timers: int) -> None:
        self.abort_while_writing(data, how, timers)

    @precondition(lambda self: _on("races")(self) and bool(self._writes_in_flight()))
    @rule(data=st.data(), how=st.sampled_from(("finish", "timer")),
          timers=st.sampled_from((1, 2, 3)))
    def abort_while_writing_once_more(self, data: st.DataObject, how: str, timers: int) -> None:
        self.abort_while_writing(data, how, timers)

    def _load_timer(self, node: str, key: tuple[str, int]) -> Any:
        """``node``'s load deadline of round ``key`` if it may fire now, else None."""
        return next((t for _, _, t in self._firable(node) if t == TimerId("load", key)), None)

    def _deadlines_while_writing(self) -> list[tuple[str, int, str, tuple[str, int]]]:
        """Writes in flight into a load whose load deadline may fire now:
        (producer, xfer, consumer, round)."""
        found = []
        for (src, xfer), w in sorted(self.world.writes.items()):
            consumer = self.world.other(src)
            for job in sorted({j for j in w.owner_jobs if j is not None}):
                key = self.world.load_round[consumer].get(job)
                if key is not None and self._load_timer(consumer, key) is not None:
                    found.append((src, xfer, consumer, key))
        return found

    @precondition(lambda self: bool(self._deadlines_while_writing()))
    @rule(data=st.data(), how=st.sampled_from(("deadline", "deadline", "host finishes")),
          then=st.sampled_from(("nothing", "abort_ack deadline", "abort arrives",
                                "abort arrives", "session lost", "abort arrives, supply")),
          lost=st.sampled_from(LOSSES))
    def give_up_while_writing(self, data: st.DataObject, how: str, then: str,
                              lost: str) -> None:
        """A consumer gives up on a load while the producer's write into it is in flight:
        its deadline passes or its host finishes the request; then the abort_ack deadline
        passes too (the abort is re-sent), the abort reaches the producer (which must
        cancel and wait for the cancel before it answers), or the session is lost
        (``lost``) while the write may still land, or the abort arrives and the producer's
        host supplies the round again while it drains."""
        _, _, consumer, key = data.draw(st.sampled_from(self._deadlines_while_writing()))
        self._count_race()
        if how == "host finishes":
            self.world.finish(consumer, key[0])
        else:
            self.world.fire_timer(consumer, TimerId("load", key))
        if then == "abort_ack deadline":
            timer = TimerId("abort_ack", key)
            if any(t == timer for _, _, t in self._firable(consumer)):
                self.world.fire_timer(consumer, timer)
        elif then.startswith("abort arrives"):
            self._deliver_until(consumer, AbortFetch, key)
            if then.endswith("supply"):  # more supply for the draining round: refused
                self._supply_round_again(consumer, key)
        elif then == "session lost" and self._may_lose():
            self._lose_session(consumer, lost)

    @precondition(lambda self: bool(self._deadlines_while_writing()))
    @rule(data=st.data(), how=st.sampled_from(("deadline", "host finishes")))
    def supply_while_the_round_drains(self, data: st.DataObject, how: str) -> None:
        """A consumer gives up on a load while the producer writes into it (deadline or
        finish); the abort reaches the producer, whose round drains its write; then the
        producer's host supplies that round's keys again: refused at once (a failed
        StoreResult with its reason), nothing else changes."""
        _, _, consumer, key = data.draw(st.sampled_from(self._deadlines_while_writing()))
        self._count_race()
        if how == "host finishes":
            self.world.finish(consumer, key[0])
        else:
            self.world.fire_timer(consumer, TimerId("load", key))
        self._deliver_until(consumer, AbortFetch, key)
        self._supply_round_again(consumer, key)

    def _supply_round_again(self, consumer: str, key: tuple[str, int]) -> None:
        """The producer's host supplies the keys of ``consumer``'s round ``key`` once
        more (the round is draining: the supply fails at once, its pins released)."""
        host = self.world.hosts[consumer]
        jobs = [j for j, r in sorted(self.world.load_round[consumer].items()) if r == key]
        if jobs:
            self.stats["supplies while draining"] += 1
            with contextlib.suppress(LocalProtocolError):
                self.world.supply(self.world.other(consumer), key[0], host.loads[jobs[-1]].key_ids)

    def _deliver_until(self, src: str, kind: type, key: tuple[str, int]) -> None:
        """Deliver ``src``'s frames in order up to the first ``kind`` frame of ``key``."""
        chan = self.world.channels[(src, self.world.other(src))]
        while chan:
            msg = decode(self._deliver_one(src))
            if isinstance(msg, kind) and (msg.kv_request_id, msg.round_seq) == key:
                return

    def _deadlines_while_replying(self) -> list[tuple[str, tuple[str, int]]]:
        """A transfer_done on its way to a consumer whose load deadline of that round may
        fire now: (consumer, round)."""
        found = []
        for (_src, dst), chan in sorted(self.world.channels.items()):
            for frame in chan:
                msg = decode(frame)
                if isinstance(msg, TransferDone):
                    key = (msg.kv_request_id, msg.round_seq)
                    if self._load_timer(dst, key) is not None:
                        found.append((dst, key))
        return found

    @precondition(lambda self: bool(self._deadlines_while_replying()))
    @rule(data=st.data(), then=st.sampled_from(("nothing", "reply arrives", "reload", "reload",
                                                "idle, reload")),
          picks=PICKS)
    def load_deadline_while_reply_on_wire(self, data: st.DataObject, then: str,
                                          picks: list[int]) -> None:
        """A load's deadline passes while its transfer_done is on the wire, so the abort
        crosses the reply; then the reply arrives, and maybe the host loads the request
        again, at once or after time passed idly (within the abort's lifetime), while
        the abort and its abort_ack are still to come."""
        consumer, key = data.draw(st.sampled_from(self._deadlines_while_replying()))
        self._count_race()
        self.world.fire_timer(consumer, TimerId("load", key))
        if then != "nothing":
            self._deliver_until(self.world.other(consumer), TransferDone, key)
        if then == "idle, reload":
            self._idle(0.75)
        if then.endswith("reload"):
            self.stats["new rounds while a reply of the request is in flight"] += 1
            self.world.fetch(consumer, key[0], _blocks(self.world.other(consumer), picks))

    @precondition(lambda self: bool(self._deadlines_while_replying()))
    @rule(data=st.data(), then=st.sampled_from(("reply arrives", "reload", "idle, reload")),
          picks=PICKS)
    def load_deadline_while_reply_on_wire_again(self, data: st.DataObject, then: str,
                                                picks: list[int]) -> None:
        self.load_deadline_while_reply_on_wire(data, then, picks)  # twice the weight

    def _newer_rounds_writing(self) -> list[tuple[str, tuple[str, int]]]:
        """Rounds with a write in flight while an older round of the same request is open
        at the consumer: (consumer, newer round)."""
        found = set()
        for (src, _xfer), w in self.world.writes.items():
            consumer = self.world.other(src)
            rounds = self.world.load_round[consumer]
            done = self.world.hosts[consumer].load_results
            for job in {j for j in w.owner_jobs if j is not None and j not in done}:
                key = rounds.get(job)
                if key is not None and any(r[0] == key[0] and r[1] < key[1] and j not in done
                                           for j, r in rounds.items()):
                    found.add((consumer, key))
        return sorted(found)

    @precondition(lambda self: bool(self._newer_rounds_writing()))
    @rule(data=st.data())
    def newer_round_answered_first(self, data: st.DataObject) -> None:
        """Two rounds of one request are open and the newer one's writes land and
        complete first: its transfer_done reaches the consumer before the older's."""
        consumer, key = data.draw(st.sampled_from(self._newer_rounds_writing()))
        producer = self.world.other(consumer)
        rounds = self.world.load_round[consumer]
        for wkey, w in sorted(self.world.writes.items()):
            if wkey[0] == producer and any(rounds.get(j) == key for j in w.owner_jobs):
                if not w.cancelled or self.world.cancelled_writes_land:
                    self.world.land(*wkey)
                self.world.complete(*wkey)
        self._deliver_until(producer, TransferDone, key)

    # ---------------------------------------- losses, idle time, held answers, bounds
    def _lose_session(self, consumer: str, how: str) -> None:
        """The sessions between ``consumer`` and its producer are lost, ``how`` (one of
        :data:`LOSSES`); a producer's disconnect reaches the consumer at once."""
        self.lost = True
        producer = self.world.other(consumer)
        self.stats["sessions lost with work in flight"] += 1
        note(f"session lost: {how}")
        if how == "cut":
            self.world.cut()
        elif how.endswith("closes"):
            node = consumer if how.startswith("consumer") else producer
            self.world.close(node)
            while self.world.channels[(node, self.world.other(node))]:
                self._deliver_one(node)
        else:
            self.world.link_down(consumer if how.startswith("consumer") else producer)

    def _aborting_while_writing(self) -> list[str]:
        """Consumers with a round aborting while a write into it may still land."""
        found = set()
        for (src, _xfer), w in self.world.writes.items():
            consumer = self.world.other(src)
            loads = self.world.sessions[consumer].view.loads
            for job in w.owner_jobs:
                key = self.world.load_round[consumer].get(job) if job is not None else None
                rnd = None if key is None else loads.get(key[0], {}).get(key[1])
                if rnd is not None and rnd.fsm_state == "aborting":
                    found.add(consumer)
        return sorted(found)

    def _work_in_flight(self) -> list[tuple[str, str]]:
        """(window, consumer) for each window with work in flight that a session loss
        must not corrupt: an abort whose write may still land, a producer draining a
        cancelled write (a lookup answer held back: :meth:`lookup_answered_after_it_ended`)."""
        found = [("abort with its write in flight", c) for c in self._aborting_while_writing()]
        found += [("cancelled write draining", self.world.other(src))
                  for (src, _), w in sorted(self.world.writes.items()) if w.cancelled]
        return sorted(set(found))

    def _may_lose(self) -> bool:
        """A loss rule may end the sessions: races or faults are on or a fatal fault is
        allowed, and the example has taken :data:`LOSS_AFTER` steps (a loss ends the
        example's work, so the other windows get their chance first)."""
        return (not self.lost and getattr(self, "steps", 0) >= LOSS_AFTER
                and (_on("races")(self) or _on("faults")(self) or self.fatal_budget > 0))

    @precondition(lambda self: self._may_lose() and bool(self._loads_with_deadline()))
    @rule(data=st.data(), how=st.sampled_from(LOSSES))
    def session_lost_while_an_abort_waits_for_its_write(self, data: st.DataObject,
                                                        how: str) -> None:
        """A load's fetch reaches the producer, whose host supplies it: a write into the
        load starts. The load's deadline passes (the consumer aborts) and the session is
        lost (``how``) before the write ends: the destination must stay unreleased."""
        consumer, key = data.draw(st.sampled_from(self._loads_with_deadline()))
        producer = self.world.other(consumer)
        host = self.world.hosts[consumer]
        job = next(j for j, r in sorted(self.world.load_round[consumer].items())
                   if r == key and j not in host.load_results)
        self._deliver_until(consumer, Fetch, key)
        self.world.supply(producer, key[0], host.loads[job].key_ids)
        if not any(job in w.owner_jobs for w in self.world.writes.values()):
            return  # no write into it started (a key the producer lacks, a session ended)
        if self._load_timer(consumer, key) is not None:
            self.world.fire_timer(consumer, TimerId("load", key))
        self._lose_session(consumer, how)

    @precondition(lambda self: self._may_lose() and bool(self._work_in_flight()))
    @rule(data=st.data(), how=st.sampled_from(LOSSES))
    def session_lost_with_work_in_flight(self, data: st.DataObject, how: str) -> None:
        """The session is lost in a window with work in flight (:meth:`_work_in_flight`),
        ``how``: nothing of that work may be reported free while it can still happen.
        (With faults on or a fatal fault allowed: a loss ends the example's work.)"""
        window, consumer = data.draw(st.sampled_from(self._work_in_flight()), label="window")
        note(f"window: {window}")
        self._lose_session(consumer, how)

    def _loads_with_deadline(self, newest: bool = False) -> list[tuple[str, tuple[str, int]]]:
        """(consumer, round) of each open load whose load deadline may fire now (with
        ``newest``, only the newest open round of its request)."""
        found = []
        for node in "ab":
            rounds = self.world.load_round[node]
            keys = {rounds[ld.job_id] for ld in self._open_loads(node) if ld.job_id in rounds}
            found += [(node, key) for key in sorted(keys)
                      if self._load_timer(node, key) is not None and not (
                          newest and any(k[0] == key[0] and k[1] > key[1] for k in keys))]
        return found

    @precondition(lambda self: bool(self._loads_with_deadline(newest=True)))
    @rule(data=st.data(), picks=PICKS)
    def reload_while_a_resent_abort_is_on_the_wire(self, data: st.DataObject,
                                                   picks: list[int]) -> None:
        """A load's deadline passes and then its abort_ack deadline (the abort is sent
        twice); the first abort reaches the producer, which ends the round's writes and
        acknowledges it, and the round ends. The second abort (or its abort_ack) is
        still on the wire: time passes idly up to the oldest frame's lifetime, and the
        host loads the request again. The new round must not take the old number while
        a frame of it may arrive (the round floor outlives every frame). The newest round
        of its request is the one whose number a new round would take without it."""
        consumer, key = data.draw(st.sampled_from(self._loads_with_deadline(newest=True)))
        producer = self.world.other(consumer)
        self._count_race()
        self.world.fire_timer(consumer, TimerId("load", key))
        timer = TimerId("abort_ack", key)
        if any(t == timer for _, _, t in self._firable(consumer)):
            self.world.fire_timer(consumer, timer)
        self._deliver_until(consumer, AbortFetch, key)
        jobs = {j for j, r in self.world.load_round[consumer].items() if r == key}
        for wkey, w in sorted(self.world.writes.items()):
            if wkey[0] == producer and jobs & set(w.owner_jobs):
                self.world.complete(*wkey)
        self._deliver_until(producer, AbortAck, key)
        self.stats["new rounds while a reply of the request is in flight"] += 1
        self._idle(1.0)
        self.world.fetch(consumer, key[0], _blocks(producer, picks))

    def _idle(self, share: float) -> None:
        """Time passes idly: ``share`` of what is left of the oldest frame's lifetime."""
        left = self.world.lifetime_left()
        if share > 0 and left != float("inf"):
            self.stats["idle time with frames on the wire"] += 1
            self.world.idle(left * share)

    @precondition(lambda self: _on("timers")(self) and any(self.world.channels.values())
                  and self.world.lifetime_left() > 0)
    @rule(share=st.sampled_from((0.25, 0.5, 1.0)))
    def time_passes_idly(self, share: float) -> None:
        """Nothing happens for a while, frames on the wire (as late as their lifetime
        allows): a tombstone must outlive every frame it guards against."""
        self._idle(share)

    def _end_held_lookup(self, entry: tuple[str, HostAnswerLookup], how: str,
                         lost: str) -> None:
        """End the lookup whose answer ``entry`` its host holds, ``how``; then answer."""
        producer, answer = entry
        req = self.world.hosts[producer].lookup_requests[answer.token]
        consumer = self.world.other(producer)
        self.stats["lookups ended while their answer was held"] += 1
        if how == "producer finishes":
            self.world.finish(producer, req.kv_request_id)
        elif how == "consumer finishes":
            self.world.finish(consumer, req.kv_request_id)
            self._deliver_until(consumer, Fetch, (req.kv_request_id, req.round_seq))
        elif how == "lookup_pending":
            timer = next((t for _, _, t in self._firable(producer)
                          if t.kind == "lookup_pending"), None)
            if timer is not None:
                self.world.fire_timer(producer, timer)
        elif not self.lost and self._may_lose():
            self._lose_session(consumer, lost)
        index = next((i for i, (_, a) in enumerate(self.world.held) if a is answer), None)
        if index is not None:
            self.world.answer_held(index)

    def _lookup_would_reach(self) -> list[str]:
        """Consumers whose session and peer's are ready (a lookup goes out at once)."""
        return [n for n in "ab" if self.world.sessions[n].ready
                and self.world.sessions[self.world.other(n)].ready]

    @precondition(lambda self: not self.lost and bool(self._lookup_would_reach()))
    @rule(data=st.data(), picks=PICKS,
          how=st.sampled_from(("producer finishes", "consumer finishes", "lookup_pending",
                               "session lost")),
          lost=st.sampled_from(LOSSES))
    def lookup_answered_after_it_ended(self, data: st.DataObject, picks: list[int], how: str,
                                       lost: str) -> None:
        """A consumer looks up keys; its producer's host takes the pins but holds the
        answer back; the lookup ends (``how``: the producer's host finishes the request,
        the consumer's finish sends its terminal fetch, the lookup_pending deadline makes
        its keys MISS, the session is lost), then the answer comes: its pins must be
        released (always on, whatever the swarm)."""
        consumer = data.draw(st.sampled_from(self._lookup_would_reach()))
        producer = self.world.other(consumer)
        held = len(self.world.held)
        self.oracle.exact_lookups = False  # the answer may come after lookup_pending
        self.world.lookup(consumer, self._rid(data), _blocks(producer, picks), hold=True)
        while self.world.channels[(consumer, producer)] and len(self.world.held) == held:
            self._deliver_one(consumer)
        if len(self.world.held) > held:
            self._end_held_lookup(self.world.held[-1], how, lost)

    @precondition(lambda self: self._may_lose() and all(
        n in self.world.connects for n in "ab"))
    @rule(node=NODES, restarted=st.booleans())
    def peer_connects_again(self, node: str, restarted: bool) -> None:
        """``node`` hears its peer connect again: the same incarnation (the peer lost its
        side and reconnects) or a new one (it restarted): ``node``'s session ends with
        every job's result, as the oracle says (its reason names which)."""
        self.lost = True
        self.stats["connects again"] += 1
        self.world.connect_again(node, restarted)

    @precondition(_on("malformed"))
    @rule(node=NODES, offsets=st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True),
          position=st.integers(0, 2), beyond=st.sampled_from((0, 0, 0, 1)),
          round_seq=st.integers(0, 2))
    def fetch_beyond_the_region(self, node: str, offsets: list[int], position: int,
                                beyond: int, round_seq: int) -> None:
        """A hostile peer's fetch names a block index at the region's end (num_blocks,
        the first index outside it) among valid ones, for keys ``node`` holds; then
        ``node``'s host supplies them: no write may go outside the region."""
        self.world.fetch_beyond_region(node, HOSTILE_RID, round_seq,
                                       tuple(HELD[node].start + o for o in offsets),
                                       position, beyond)

    # -------------------------------------------------------------- faults
    def _fault(self) -> bool:
        if self.fault_budget <= 0:
            return False
        self.fault_budget -= 1
        return True

    NETWORK_FAULTS: tuple[str, ...] = ("drop",)

    @precondition(lambda self: _on("faults")(self) and self.fault_budget > 0
                  and any(self.world.channels.values()))
    @rule(data=st.data(), pick=st.integers(0, 2))
    def network_fault(self, data: st.DataObject, pick: int) -> None:
        kind = self.NETWORK_FAULTS[pick % len(self.NETWORK_FAULTS)]
        src = data.draw(st.sampled_from([s for (s, _), c in self.world.channels.items() if c]))
        queued = self.world.channels[(src, self.world.other(src))]
        index = data.draw(st.integers(0, len(queued) - 1))
        self._fault()
        note(f"fault: {kind} {src}[{index}]")
        if kind == "drop":
            self.world.drop(src, index)
        elif kind == "duplicate":
            self.world.duplicate(src, index)
        else:
            self.world.lossy = True  # a reordered frame is outside the FIFO model
            self.world.deliver(src, index)

    @precondition(lambda self: _on("faults")(self) and self.fatal_budget > 0)
    @rule()
    def cut(self) -> None:
        self.fatal_budget -= 1
        self.world.cut()

    @precondition(lambda self: _on("faults")(self) and self.fault_budget > 0
                  and bool(self.world.writes))
    @rule(data=st.data())
    def write_fails(self, data: st.DataObject) -> None:
        self._fault()
        src, xfer = data.draw(st.sampled_from(sorted(self.world.writes)))
        self.world.complete(src, xfer, fail=True)

    @precondition(_on("malformed"))
    @rule(node=NODES, frame=GARBAGE)
    def malformed_frame_changes_nothing(self, node: str, frame: bytes) -> None:
        session = self.world.sessions[node]
        before = (session.state, session.open_counts(), session.has_pending_work,
                  dict(self.world.timers[node]), self._moves())
        try:
            decode(frame)
        except Exception:
            self.world.inject(node, frame)
            after = (session.state, session.open_counts(), session.has_pending_work,
                     dict(self.world.timers[node]), self._moves())
            assert after == before

    def _moves(self) -> int:
        """Recorded steps, less the session's answers to host calls on a session that is
        over (internal; a host retry the world runs meanwhile may take one)."""
        return sum(1 for r in self.tracer.records
                   if not (r.machine == "session" and r.trigger.endswith("_over")))

    # ----------------------------------------------------------- properties
    def _check_isolation(self, frame: bytes, records: list) -> None:  # type: ignore[type-arg]
        msg = decode(frame)
        if isinstance(msg, TransferDone | AbortAck | AbortFetch) or (
            isinstance(msg, Fetch) and not msg.is_terminal
        ):
            label = f"{msg.kv_request_id}/{msg.round_seq}"
            # A host_fetch is the host's retry, made after the frame's batch, not the frame.
            touched = {r.instance for r in records
                       if r.machine in ROUND_MACHINES and r.trigger != "host_fetch"}
            assert touched <= {label}, (msg, touched)

    @invariant()
    def at_most_one_result_per_job(self) -> None:
        for host in self.world.hosts.values():
            assert host.load_results.keys() <= host.loads.keys()
            assert host.store_results.keys() <= host.store_jobs.keys()

    @invariant()
    def no_protocol_error_between_conformant_peers(self) -> None:
        if self.CHECK_DESTINATIONS:
            self.world.check_no_protocol_errors()

    @invariant()
    def watch_the_windows(self) -> None:
        self.steps = getattr(self, "steps", -1) + 1
        rounds: Counter[tuple[str, str]] = Counter()
        for node in "ab":
            for ld in self._open_loads(node):
                rounds[(node, ld.kv_request_id)] += 1
        self.stats["rounds of one request open at once"] = max(
            self.stats["rounds of one request open at once"], max(rounds.values(), default=0))

    def teardown(self) -> None:
        world = getattr(self, "world", None)
        if world is None:
            return
        stats = self.stats + world.stats
        for label in ("timers or aborts while writing", "rounds of one request open at once",
                      "cancelled writes landed",
                      "new rounds while a reply of the request is in flight"):
            target(float(stats[label]), label=label)
        for _ in range(2000):  # faults off: deliver, register, complete, fire timers
            if world.stabilize() == 0 and not world.advance():
                break
        else:
            raise AssertionError("no quiescence within 2000 rounds")
        world.check_no_protocol_errors() if self.CHECK_DESTINATIONS else None
        self.oracle.check_quiet()
        for node, host in world.hosts.items():
            assert host.quiet, (node, host.loads.keys() - host.load_results.keys(),
                                host.store_jobs.keys() - host.store_results.keys())
            counts = world.sessions[node].open_counts()
            assert all(v == 0 for v in counts.values()), (node, counts)
            world.check_canaries(node, sorted(world.canaried[node]))


class HostileNetwork(TwoSessions):
    """Frames are also duplicated and reordered, which no ZeroMQ channel does. The wire
    protocol cannot keep destinations safe then (vLLM consumers restart round numbers, so
    a duplicated fetch looks like a new round); what must still hold: no crash, at most
    one result per job and exactly one once quiet, no pin released while a write reads
    it, malformed frames change nothing, rounds isolated, nothing left open."""

    CHECK_DESTINATIONS = False
    NETWORK_FAULTS = ("drop", "duplicate", "reorder")
