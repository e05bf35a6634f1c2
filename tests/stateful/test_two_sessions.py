"""Hypothesis drives two sessions over the simulated network with host calls, timers and
faults, and checks the protocol's properties after every step.

Checked on every step (SimWorld raises SafetyViolation inside the step), over FIFO
channels that may lose frames or be cut:
* each job gets at most one result; successful loads carry the right bytes;
* no write lands in a destination after its job was reported released;
* no pinned source is released while a write reads it; no write before registration;
* rounds are isolated: a frame about (kv_request_id, round) fires only that round's machines;
* a malformed frame changes nothing.
Checked once the run is quiet (faults off, everything delivered, timers fired):
* every job has exactly one result, every pin is released, no machine is left open.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import note
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from p2pfsm.demo.blocks import demo_key
from p2pfsm.fsm import Tracer
from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, TransferDone, decode
from p2pfsm.session import Timeouts
from p2pfsm.sim.world import SimWorld

NODES = st.sampled_from(("a", "b"))
REQUESTS = st.sampled_from(("r1", "r2", "r3"))
HELD = {"a": range(0, 6), "b": range(6, 12)}
KEY_OF = {demo_key(i): i for i in range(16)}
PICKS = st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True)
"""Offsets into a node's held blocks; 6 and above name a block nobody stores (a miss)."""


def _blocks(node: str, picks: list[int]) -> list[int]:
    base = HELD[node].start
    return [base + p if p < 6 else 6 + p for p in picks]  # 12..15: stored nowhere
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


class TwoSessions(RuleBasedStateMachine):
    """Environment events are the rules; the sessions decide what they mean.

    Channels are FIFO and may lose frames or be cut (ZeroMQ over TCP): every property
    above is checked. :class:`HostileNetwork` also duplicates and reorders frames.
    """

    CHECK_DESTINATIONS = True

    @initialize(faults=st.integers(0, 4), fatal=st.sampled_from((False, False, False, True)),
                handshake_first=st.sampled_from((True, True, False)))
    def setup(self, faults: int, fatal: bool, handshake_first: bool) -> None:
        self.tracer = Tracer()
        # Each node stores 0..5 (a) or 6..11 (b); both can serve and load.
        self.world = SimWorld(0, block_len=8, num_blocks=48,
                              check_destinations=self.CHECK_DESTINATIONS,
                              held=HELD,
                              timeouts=Timeouts(handshake=50, load=5, abort_ack=2, store=8,
                                                lookup=4, lookup_pending=1, tombstone=60),
                              tracer=self.tracer)
        self.fault_budget = faults
        self.fatal_budget = int(fatal)
        self.world.start()
        if handshake_first:
            self.world.stabilize()

    # ---------------------------------------------------------------- host
    @rule(node=NODES, rid=REQUESTS, picks=PICKS)
    def fetch(self, node: str, rid: str, picks: list[int]) -> None:
        self.world.fetch(node, rid, _blocks(self.world.other(node), picks))

    @rule(node=NODES, rid=REQUESTS, picks=PICKS)
    def supply(self, node: str, rid: str, picks: list[int]) -> None:
        self.world.supply(node, rid, _blocks(node, picks))

    @rule(node=NODES, rid=REQUESTS, picks=PICKS)
    def lookup(self, node: str, rid: str, picks: list[int]) -> None:
        self.world.lookup(node, rid, _blocks(self.world.other(node), picks))

    @precondition(lambda self: any(r.answered and any(r.hits)
                                   for h in self.world.hosts.values() for r in h.lookup_results))
    @rule(data=st.data())
    def fetch_lookup_hits(self, data: st.DataObject) -> None:
        node = data.draw(st.sampled_from([n for n, h in self.world.hosts.items()
                                          if any(r.answered and any(r.hits)
                                                 for r in h.lookup_results)]))
        res = [r for r in self.world.hosts[node].lookup_results if r.answered and any(r.hits)][-1]
        hits = [KEY_OF[k] for k, hit in zip(res.keys, res.hits, strict=True) if hit]
        self.world.fetch(node, res.kv_request_id, hits)

    @precondition(lambda self: self.fatal_budget > 0)
    @rule(node=NODES)
    def close(self, node: str) -> None:
        self.fatal_budget -= 1
        self.world.close(node)

    @rule(node=NODES, rid=REQUESTS)
    def finish(self, node: str, rid: str) -> None:
        self.world.finish(node, rid)

    # ------------------------------------------------------------- network
    @precondition(lambda self: any(self.world.channels.values()))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        src = data.draw(st.sampled_from([s for (s, _), c in self.world.channels.items() if c]))
        frame = self.world.channels[(src, self.world.other(src))][0]
        before = len(self.tracer.records)
        self.world.deliver(src)
        self._check_isolation(frame, self.tracer.records[before:])

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

    @precondition(lambda self: self.world.can_advance())
    @rule(now=st.sampled_from((True, False, False)))
    def advance(self, now: bool) -> None:
        """Fire the next timer (one draw in three, so timeouts race progress, not swamp it)."""
        if now:
            self.world.advance()

    # -------------------------------------------------------------- faults
    def _fault(self) -> bool:
        if self.fault_budget <= 0:
            return False
        self.fault_budget -= 1
        return True

    NETWORK_FAULTS: tuple[str, ...] = ("drop",)

    @precondition(lambda self: self.fault_budget > 0 and any(self.world.channels.values()))
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
            self.world.deliver(src, index)

    @precondition(lambda self: self.fatal_budget > 0)
    @rule()
    def cut(self) -> None:
        self.fatal_budget -= 1
        self.world.cut()

    @precondition(lambda self: self.fault_budget > 0 and bool(self.world.writes))
    @rule(data=st.data())
    def write_fails(self, data: st.DataObject) -> None:
        self._fault()
        src, xfer = data.draw(st.sampled_from(sorted(self.world.writes)))
        self.world.complete(src, xfer, fail=True)

    @rule(node=NODES, frame=GARBAGE)
    def malformed_frame_changes_nothing(self, node: str, frame: bytes) -> None:
        session = self.world.sessions[node]
        before = (session.state, session.open_counts(), len(session._queue),
                  dict(session._timers), len(self.tracer.records))
        try:
            decode(frame)
        except Exception:
            self.world.inject(node, frame)
            after = (session.state, session.open_counts(), len(session._queue),
                     dict(session._timers), len(self.tracer.records))
            assert after == before

    # ----------------------------------------------------------- properties
    def _check_isolation(self, frame: bytes, records: list) -> None:  # type: ignore[type-arg]
        msg = decode(frame)
        if isinstance(msg, TransferDone | AbortAck | AbortFetch) or (
            isinstance(msg, Fetch) and not msg.is_terminal
        ):
            label = f"{msg.kv_request_id}/{msg.round_seq}"
            touched = {r.instance for r in records if r.machine in ROUND_MACHINES}
            assert touched <= {label}, (msg, touched)

    @invariant()
    def at_most_one_result_per_job(self) -> None:
        for host in self.world.hosts.values():
            assert host.load_results.keys() <= host.loads.keys()
            assert host.store_results.keys() <= host.store_jobs.keys()

    def teardown(self) -> None:
        world = getattr(self, "world", None)
        if world is None:
            return
        for _ in range(2000):  # faults off: deliver, register, complete, fire timers
            if world.stabilize() == 0 and not world.advance():
                break
        else:
            raise AssertionError("no quiescence within 2000 rounds")
        for node, host in world.hosts.items():
            assert host.quiet, (node, host.loads.keys() - host.load_results.keys(),
                                host.store_jobs.keys() - host.store_results.keys())
            counts = world.sessions[node].open_counts()
            assert all(v == 0 for v in counts.values()), (node, counts)


TestTwoSessions = TwoSessions.TestCase


class HostileNetwork(TwoSessions):
    """Frames are also duplicated and reordered, which no ZeroMQ channel does. The wire
    protocol cannot keep destinations safe then (vLLM consumers restart round numbers, so
    a duplicated fetch looks like a new round); what must still hold: no crash, at most
    one result per job and exactly one once quiet, no pin released while a write reads
    it, malformed frames change nothing, rounds isolated, nothing left open."""

    CHECK_DESTINATIONS = False
    NETWORK_FAULTS = ("drop", "duplicate", "reorder")


TestHostileNetwork = HostileNetwork.TestCase
