"""Lookup keys the host leaves pending and resolves later (``Node.resolve_lookup``).

Two nodes in this process, over real ZeroMQ and NIXL on 127.0.0.1, stepped in turn by
one loop (a NIXL WRITE into a node needs that node to progress too). The producer's
host answers some keys at once, reports others pending, and settles those later; the
consumer sees one lookup answer that holds the late hits, then fetches them. Every
wait is bounded and names what it waited for; both nodes are closed after each test.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from helpers.requires import needs_nixl_and_torch

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.errors import LocalProtocolError
from p2pfsm.executor.node import LookupAnswer, Node, NodeConfig
from p2pfsm.executor.node.effects import NodeEffects
from p2pfsm.protocol import LookupResp
from p2pfsm.session import LookupRequest, LookupResult, SendFrame, StoreResult, Timeouts
from p2pfsm.tools.demo.host import fill_demo_region

needs_nixl_and_torch()

BLOCK = 4096
HELD = 8  # the producer holds demo blocks 0..7, block i at index i


class PendingHost:
    """A producer host that holds demo blocks but reports the ``later`` ones pending."""

    def __init__(self, later: set[int]) -> None:
        self.index = {demo_key(i): i for i in range(HELD)}
        self.later = {demo_key(i) for i in later}
        self.asked: list[tuple[str, LookupRequest]] = []
        self.node: Node | None = None
        self.inner_error: LocalProtocolError | None = None

    def on_lookup(self, peer_id: str, req: LookupRequest) -> LookupAnswer:
        self.asked.append((peer_id, req))
        assert self.node is not None
        try:  # too early: the answer is what this callback returns
            self.node.resolve_lookup(peer_id, req.token)
        except LocalProtocolError as exc:
            self.inner_error = exc
        hits = {k: self.index[k] for k in req.keys if k in self.index and k not in self.later}
        return hits, frozenset(k for k in req.keys if k in self.later)


class _CoalescingEffects(NodeEffects):
    """Effects that hold each lookup_resp back until the next one of the same request
    and send the two as one frame."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held_back: dict[str, LookupResp] = {}
        self.coalesced = 0

    def send_frame(self, peer: str, out: SendFrame) -> None:
        msg = out.message
        if isinstance(msg, LookupResp):
            first = self.held_back.pop(msg.kv_request_id, None)
            if first is None:
                self.held_back[msg.kv_request_id] = msg
                return
            self.coalesced += 1
            out = SendFrame(LookupResp(msg.kv_request_id, first.keys + msg.keys,
                                       first.hits + msg.hits))
        super().send_frame(peer, out)


class CoalescingNode(Node):
    """A producer that coalesces, as the protocol allows (:class:`_CoalescingEffects`)."""

    _effects_part = _CoalescingEffects

    @property
    def coalesced(self) -> int:
        assert isinstance(self._effects, _CoalescingEffects)
        return self._effects.coalesced


class Pair:
    """A consumer node and a producer node, both stepped by :meth:`drive`."""

    def __init__(self, host: PendingHost, lookup_pending: float, parts: bool = False,
                 trace: str | None = None, producer: type[Node] = Node) -> None:
        self.host = host
        self.made: list[Node] = []
        self.producer = self._node(Timeouts(lookup_pending=lookup_pending), host.on_lookup,
                                   kind=producer, answer_lookups_in_parts=parts)
        host.node = self.producer
        fill_demo_region(self.producer, HELD)
        self.consumer = self._node(Timeouts(), None, trace=trace)
        self.peer = self.producer.local_id
        session = self.consumer.connect(self.peer)
        self.drive(lambda: session.ready or not session.alive, 30.0, "handshake")
        assert session.ready, self.consumer.deaths

    def _node(self, timeouts: Timeouts, on_lookup: Any, kind: type[Node] = Node,
              **options: Any) -> Node:
        node = kind(NodeConfig("tcp://127.0.0.1:0", 16, BLOCK, timeouts=timeouts, **options),
                    on_lookup=on_lookup)
        self.made.append(node)
        return node

    def drive(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() >= deadline:
                raise AssertionError(f"no {what} within {timeout:.1f} s; deaths: "
                                     f"{self.consumer.deaths} / {self.producer.deaths}")
            for node in self.made:
                node.step(0.005)

    def asked(self, count: int) -> LookupRequest:
        """The producer host's ``count``-th lookup request, once it has come."""
        self.drive(lambda: len(self.host.asked) >= count, 20.0, f"lookup request {count}")
        peer_id, req = self.host.asked[count - 1]
        assert peer_id == self.consumer.local_id
        return req

    def fetch_verified(self, rid: str, blocks: list[int], pins: list[Future[StoreResult]],
                       dest: list[Any] | None = None) -> None:
        """Fetch ``blocks`` under ``rid`` into ``dest`` (default: blocks 0, 1, ...); the
        load and the release of the producer's ``pins`` succeed; every byte landed; the
        request is finished and neither node rejected a frame."""
        load = self.consumer.fetch(self.peer, rid, keys_of(blocks),
                                   dest if dest is not None else range(len(blocks)))
        self.drive(lambda: load.done() and all(p.done() for p in pins), 20.0,
                   "the fetch of the hits and the release of their pins")
        assert load.result().success, load.result()
        assert [p.result().success for p in pins] == [True] * len(pins)
        for d, block in enumerate(blocks):
            assert bytes(self.consumer.region[d].numpy()) == demo_block(block, BLOCK)
        self.consumer.finish(self.peer, rid)
        assert not self.producer.violations and not self.consumer.violations

    def close(self) -> None:
        for node in self.made:
            node.close(timeout=2.0)


@pytest.fixture
def pairs() -> Iterator[Callable[..., Pair]]:
    made: list[Pair] = []

    def make(later: set[int], lookup_pending: float = 30.0, **options: Any) -> Pair:
        pair = Pair(PendingHost(later), lookup_pending, **options)
        made.append(pair)
        return pair

    try:
        yield make
    finally:
        for pair in made:
            pair.close()


def keys_of(blocks: list[int]) -> list[bytes]:
    return [demo_key(b) for b in blocks]


def test_pending_keys_resolved_later_are_answered_and_fetched(
        pairs: Callable[..., Pair]) -> None:
    # The pending deadline is far past every wait here: only resolve_lookup settles keys.
    pair = pairs(later={4, 5, 6})
    producer, peer = pair.producer, pair.peer
    asked = [1, 4, 5, 6, 100]  # 1: hit at once; 4, 5, 6: pending; 100: unknown
    lookup = pair.consumer.lookup(peer, "late-1", keys_of(asked))
    req = pair.asked(1)
    assert isinstance(pair.host.inner_error, LocalProtocolError)
    assert "on_lookup" in str(pair.host.inner_error)
    me = pair.consumer.local_id

    # Bad resolutions are refused and change nothing.
    bad: list[tuple[str, Callable[[], object]]] = [
        ("no lookup", lambda: producer.resolve_lookup(me, req.token + 1000, {})),
        ("no lookup", lambda: producer.resolve_lookup(me, 0)),
        ("not from", lambda: producer.resolve_lookup("127.0.0.1:9", req.token)),
        ("not pending", lambda: producer.resolve_lookup(me, req.token, {demo_key(1): 1})),
        ("not pending", lambda: producer.resolve_lookup(me, req.token, pending=[demo_key(7)])),
        ("both hit and pending",
         lambda: producer.resolve_lookup(me, req.token, {demo_key(4): 4}, [demo_key(4)])),
        ("outside our region",
         lambda: producer.resolve_lookup(me, req.token, {demo_key(4): 16})),
        ("outside our region",
         lambda: producer.resolve_lookup(me, req.token, {demo_key(4): True})),
    ]
    for needle, call in bad:
        with pytest.raises(LocalProtocolError, match=needle):
            call()

    # Block 4 is found now, 5 and 6 stay pending; then 5 is found and 6 is a miss.
    first = producer.resolve_lookup(me, req.token, {demo_key(4): 4}, [demo_key(5), demo_key(6)])
    assert not lookup.done()
    second = producer.resolve_lookup(me, req.token, {demo_key(5): 5})
    assert first is not None and second is not None
    assert producer.resolve_lookup(me, req.token) is None  # nothing is pending any more
    pair.drive(lookup.done, 20.0, "the lookup answer")
    answer: LookupResult = lookup.result()
    assert answer.answered and answer.hits == (True, True, True, False, False), answer

    pair.fetch_verified("late-1", [1, 4, 5], [first, second])


def test_tokens_are_the_nodes_and_lookups_are_answered_in_order(
        pairs: Callable[..., Pair]) -> None:
    """A later lookup of the same request waits for an earlier pending one."""
    pair = pairs(later={3})
    producer, me = pair.producer, pair.consumer.local_id
    early = pair.consumer.lookup(pair.peer, "order-1", keys_of([3]))
    late = pair.consumer.lookup(pair.peer, "order-1", keys_of([2]))
    first, second = pair.asked(1), pair.asked(2)
    assert second.token == first.token + 1
    assert not early.done() and not late.done()
    producer.resolve_lookup(me, first.token, {demo_key(3): 3})
    pair.drive(lambda: early.done() and late.done(), 20.0, "both lookup answers")
    assert early.result().hits == (True,) and late.result().hits == (True,)
    pair.consumer.finish(pair.peer, "order-1")


def test_pending_keys_never_resolved_are_misses_after_lookup_pending(
        pairs: Callable[..., Pair]) -> None:
    # The consumer's own lookup deadline (30 s) is past the wait's bound: an answer
    # within it can only come from the producer's pending deadline (0.3 s).
    pair = pairs(later={2, 3}, lookup_pending=0.3)
    producer, me = pair.producer, pair.consumer.local_id
    lookup = pair.consumer.lookup(pair.peer, "expire-1", keys_of([1, 2, 3]))
    req = pair.asked(1)
    pair.drive(lookup.done, 20.0, "the lookup answer after the pending deadline")
    answer = lookup.result()
    assert answer.answered and answer.hits == (True, False, False), answer

    # Resolving after the deadline takes nothing: new pins are released at once.
    late = producer.resolve_lookup(me, req.token, {demo_key(2): 2})
    assert late is not None and late.done() and not late.result().success
    assert producer.resolve_lookup(me, req.token) is None
    pair.consumer.finish(pair.peer, "expire-1")
    assert not producer.violations and not pair.consumer.violations


def test_a_producer_answering_in_parts_sends_the_found_keys_first(
        pairs: Callable[..., Pair], tmp_path: Path) -> None:
    """answer_lookups_in_parts: the keys the host settles at once go out in one
    lookup_resp; the consumer's lookup takes them and keeps waiting (its trace shows the
    part: client_lookup probing -> probing), then ends with the pending keys' part."""
    trace = tmp_path / "consumer.jsonl"
    pair = pairs(later={4, 5}, parts=True, trace=str(trace))
    producer, peer, me = pair.producer, pair.peer, pair.consumer.local_id
    lookup = pair.consumer.lookup(peer, "parts-1", keys_of([1, 4, 5, 100]))
    req = pair.asked(1)
    part = ["client_lookup", "recv_lookup_resp", "probing", "probing"]

    def parts_taken() -> int:
        lines = [json.loads(line) for line in trace.read_text().splitlines()]
        return sum(1 for line in lines if part in line["steps"])

    pair.drive(lambda: parts_taken() == 1, 20.0, "the first part at the consumer")
    assert not lookup.done()
    pins = producer.resolve_lookup(me, req.token, {demo_key(4): 4, demo_key(5): 5})
    assert pins is not None
    pair.drive(lookup.done, 20.0, "the lookup answer")
    answer: LookupResult = lookup.result()
    assert answer.answered and answer.hits == (True, True, True, False), answer
    assert parts_taken() == 1

    pair.fetch_verified("parts-1", [1, 4, 5], [pins])


def test_answers_coalesced_into_one_frame_answer_each_lookup(
        pairs: Callable[..., Pair]) -> None:
    """Two lookups of one request answered in one lookup_resp (key 2 asked by both, so
    it is in the frame twice): each (key, hit) pair goes to the oldest lookup still
    waiting for that key; both end answered and their hits are fetched byte-exact."""
    pair = pairs(later=set(), producer=CoalescingNode)
    peer = pair.peer
    first = pair.consumer.lookup(peer, "co-1", keys_of([1, 2]))
    second = pair.consumer.lookup(peer, "co-1", keys_of([2, 3, 100]))
    pair.drive(lambda: first.done() and second.done(), 20.0, "both lookup answers")
    producer = pair.producer
    assert isinstance(producer, CoalescingNode) and producer.coalesced == 1
    assert first.result().answered and first.result().hits == (True, True)
    assert second.result().answered and second.result().hits == (True, True, False)

    pair.fetch_verified("co-1", [1, 2, 3], [])


def test_numpy_and_torch_integers_are_block_indexes(pairs: Callable[..., Pair]) -> None:
    """Engines hold block indexes as numpy or torch integers: they are taken as ints
    (a float or a bool is still refused, naming it)."""
    import numpy
    import torch

    pair = pairs(later={4})
    producer, peer, me = pair.producer, pair.peer, pair.consumer.local_id
    lookup = pair.consumer.lookup(peer, "ints-1", keys_of([1, 4]))
    req = pair.asked(1)
    pins = producer.resolve_lookup(me, req.token, {demo_key(4): numpy.int64(4)})
    assert pins is not None
    pair.drive(lookup.done, 20.0, "the lookup answer")
    assert lookup.result().hits == (True, True)
    for bad in (1.0, True, torch.tensor(1.5)):
        with pytest.raises(LocalProtocolError, match="outside our 16 blocks"):
            pair.consumer.fetch(peer, "ints-1", keys_of([1]), [bad])
    pair.fetch_verified("ints-1", [1, 4], [pins], dest=[numpy.int32(0), torch.tensor(1)])
