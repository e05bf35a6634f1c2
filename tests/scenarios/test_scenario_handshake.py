"""Handshake scenarios: connect both ways, ack after registration, send gating, mismatches,
deadline, out-of-order and duplicated handshake frames."""

from __future__ import annotations

import pytest
from helpers.world import (
    LOCAL_ID,
    LOCAL_METADATA,
    PEER_ID,
    Driver,
    World,
    key,
    local_config,
    of_type,
    only,
    peer_connect,
    ready_driver,
    sent,
    snapshot,
    wire_types,
)

from p2pfsm.protocol import (
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    Lookup,
    TransferDone,
)
from p2pfsm.session import (
    FetchArrived,
    FrameIgnored,
    HostFetch,
    HostStart,
    HostSupply,
    LoadResult,
    ProtocolViolation,
    RegistrationFinished,
    SessionDead,
    StartRegistration,
    StartWrite,
    StoreResult,
    TimerId,
    WriteFinished,
)


def test_both_sides_send_their_connect_on_start() -> None:
    w = World()
    w.start()
    for node in ("a", "b"):
        msg = only(w.wire(node))
        cfg = w.sessions[node].config
        assert msg == Connect(cfg.local_id, cfg.agent_metadata, cfg.base_addr, cfg.num_blocks,
                              cfg.block_len, cfg.config_fingerprint, cfg.hash_seed)
        assert w.sessions[node].state == "connecting"


def test_connect_ack_is_sent_only_after_registration_finished() -> None:
    w = World()
    w.start()
    w.deliver("a")  # a's connect reaches b
    b = w.sessions["b"]
    assert b.state == "registering"
    assert only(w.out("b", StartRegistration)).connect.peer_id == w.sessions["a"].config.local_id
    assert w.types("b") == ["connect"]  # no ack while registering
    w.register("b")
    assert w.types("b") == ["connect", "connect_ack"]
    assert w.wire("b")[1] == ConnectAck(b.config.local_id)
    assert b.state == "awaiting_ack"


def test_handshake_completes_both_ways() -> None:
    w = World()
    w.start()
    w.stabilize()
    assert w.sessions["a"].ready and w.sessions["b"].ready
    assert wire_types(w.sent["a"]) == ["connect", "connect_ack"]
    assert wire_types(w.sent["b"]) == ["connect", "connect_ack"]


def test_frames_queued_until_ready_then_flushed_in_order() -> None:
    w = World()
    w.start()
    w.load("a", "r1", [8])
    w.lookup("a", "r2", [9, 10])
    w.load("a", "r3", [11])
    assert w.types("a") == ["connect"]
    w.deliver("a")
    w.deliver("b")
    w.register("a")
    w.register("b")
    assert not w.sessions["a"].ready
    assert wire_types(w.sent["a"]) == ["connect", "connect_ack"]  # b has not acked us yet
    w.deliver("b")  # b's connect_ack makes a ready
    assert w.sessions["a"].ready
    msgs = w.sent["a"]
    assert wire_types(msgs) == ["connect", "connect_ack", "fetch", "lookup", "fetch"]
    assert isinstance(msgs[2], Fetch) and msgs[2].kv_request_id == "r1"
    assert isinstance(msgs[3], Lookup) and msgs[3].kv_request_id == "r2"
    assert isinstance(msgs[4], Fetch) and msgs[4].kv_request_id == "r3"
    assert w.types("a") == ["connect_ack", "fetch", "lookup", "fetch"]


def test_peer_ack_during_registration_waits_for_registration() -> None:
    w = World()
    w.start()
    w.load("a", "r1", [8])
    w.deliver("a")
    w.deliver("b")
    w.register("b")
    w.deliver("b")  # b's connect_ack reaches a, whose registration is still running
    a = w.sessions["a"]
    assert a.state == "registering_acked"
    assert w.types("a") == []  # a's connect was already delivered; nothing else leaves
    w.register("a")
    assert a.ready
    assert w.types("a") == ["connect_ack", "fetch"]  # our ack first, then the queue


MISMATCHES = [
    ("block_len", {}, {"block_len": 32}),
    ("hash_seed", {}, {"hash_seed": "another-seed"}),
    ("config_fingerprint", {}, {"config_fingerprint": "2f401c72601e93f9"}),
    ("config_fingerprint", {"config_fingerprint": "2f401c72601e93f9"}, {}),
    ("config_fingerprint", {"config_fingerprint": "aaaa"}, {"config_fingerprint": "bbbb"}),
    ("peer_id", {"expected_peer_id": PEER_ID}, {"peer_id": "10.0.0.9:7001"}),
    ("agent_metadata", {}, {"agent_metadata": LOCAL_METADATA}),
    ("agent_metadata", {}, {"peer_id": LOCAL_ID}),
    # Per-layer layouts: the regions must pair up, and a connect without a layout (as
    # vLLM's) pairs only with another without one.
    ("layout", {"layout": ((0x1000, 8, 8), (0x2000, 8, 8))}, {}),
    ("layout", {}, {"layout": ((0x9000, 8, 8), (0xA000, 8, 8))}),
    ("layout", {"layout": ((0x1000, 8, 8), (0x2000, 8, 8))},
     {"layout": ((0x9000, 12, 12), (0xA000, 4, 4))}),
    ("layout", {"layout": ((0x1000, 8, 8), (0x2000, 8, 8))},
     {"layout": ((0x9000, 16, 16),)}),
    ("layout", {"layout": ((0x1000, 32, 16),)}, {}),
]


@pytest.mark.parametrize(("field", "ours", "theirs"), MISMATCHES,
                         ids=[f"{m[0]}-{i}" for i, m in enumerate(MISMATCHES)])
def test_handshake_mismatch_kills_the_session(
    field: str, ours: dict[str, object], theirs: dict[str, object],
) -> None:
    d = Driver(local_config(**ours))
    d(HostStart())
    out = d.recv(peer_connect(**theirs))
    dead = only(of_type(out, SessionDead))
    assert dead.mismatch is not None
    assert dead.mismatch.field == field
    assert not of_type(out, StartRegistration)
    assert not any(isinstance(m, ConnectAck) for m in sent(out))
    assert d.s.state == "ended" and not d.s.alive
    assert d.s.mismatch == dead.mismatch
    # Nothing more is accepted from that peer.
    assert of_type(d.recv(ConnectAck(PEER_ID)), FrameIgnored)


def test_equal_fingerprints_and_expected_peer_id_are_accepted() -> None:
    cfg = local_config(config_fingerprint="2f401c72601e93f9", expected_peer_id=PEER_ID)
    d = Driver(cfg)
    d.handshake(peer_connect(config_fingerprint="2f401c72601e93f9"))
    assert d.s.ready
    assert not of_type(d.log, SessionDead)


def test_regions_that_pair_up_are_accepted_whatever_their_bases_and_strides() -> None:
    d = Driver(local_config(layout=((0x1000, 8, 8), (0x2000, 64, 8))))
    d.handshake(peer_connect(layout=((0x9000, 24, 8), (0x9008, 24, 8))))
    assert d.s.ready
    assert not of_type(d.log, SessionDead)


def test_a_layout_mismatch_names_both_layouts() -> None:
    d = Driver(local_config(layout=((0x1000, 8, 8), (0x2000, 8, 8))))
    d(HostStart())
    dead = only(of_type(d.recv(peer_connect()), SessionDead))
    assert dead.mismatch is not None
    assert "2 regions of slices [8, 8]" in str(dead.mismatch)
    assert "no layout field" in str(dead.mismatch)


def test_mismatch_in_a_world_both_sides_die_with_a_disconnect_and_no_ack() -> None:
    w = World(configs={"b": {"hash_seed": "b-seed"}})
    w.start()
    job = w.load("a", "r1", [8])
    w.stabilize()
    for node in ("a", "b"):
        dead = only(w.hosts[node].deaths)
        assert dead.mismatch is not None and dead.mismatch.field == "hash_seed"
        assert wire_types(w.sent[node]) == ["connect", "disconnect"]
    # The queued load never left a: it fails, and its destination is free at once.
    assert w.result("a", job) == LoadResult(job, "r1", False, True)


def test_handshake_deadline_kills_the_session() -> None:
    w = World()
    w.start()
    job = w.load("a", "r1", [8])
    assert w.advance()
    assert w.advance()
    assert not w.advance()
    for node in ("a", "b"):
        assert w.sessions[node].state == "ended"
        assert only(w.hosts[node].deaths).reason == "handshake timed out"
    res = w.hosts["a"].load_results[job]
    # The fetch never left the queue, so its destination is free at once.
    assert not res.success and res.released
    assert not any(isinstance(m, Fetch) for m in w.sent["a"])


def test_handshake_timer_is_disarmed_once_ready() -> None:
    w = World()
    w.handshake()
    assert all(t[0] != "handshake" for n in ("a", "b") for t in w.timers[n])
    assert not w.advance()
    assert w.sessions["a"].ready and w.sessions["b"].ready


def test_connect_ack_before_connect_kills_the_session() -> None:
    d = Driver()
    d(HostStart())
    out = d.recv(ConnectAck(PEER_ID))
    assert "connect_ack before connect" in only(of_type(out, SessionDead)).reason
    assert d.s.state == "ended"


def test_duplicate_connect_after_ready_kills_the_session() -> None:
    d = ready_driver()
    job_out = d(HostFetch(1, "r1", (key(1),), (4,)))
    assert sent(job_out)
    out = d.recv(peer_connect())
    assert "connect after the handshake" in only(of_type(out, SessionDead)).reason
    assert d.s.state == "ended"
    assert only(of_type(out, LoadResult)) == LoadResult(1, "r1", False, False)


def test_duplicate_connect_while_registering_kills_the_session() -> None:
    d = Driver()
    d(HostStart())
    d.recv(peer_connect())
    assert d.s.state == "registering"
    out = d.recv(peer_connect())
    assert of_type(out, SessionDead)
    assert d.s.state == "ended"
    # The registration result that comes back afterwards is ignored.
    assert of_type(d(RegistrationFinished(True)), FrameIgnored)
    assert d.s.state == "ended"


def test_duplicate_connect_ack_is_harmless() -> None:
    d = ready_driver()
    before = snapshot(d.s)
    assert d.recv(ConnectAck(PEER_ID)) == []
    assert snapshot(d.s) == before
    out = d(HostFetch(1, "r1", (key(1),), (4,)))
    assert sent(out) == [Fetch("r1", (key(1),), (4,), 0)]


def test_duplicate_connect_ack_while_registering_is_harmless() -> None:
    d = Driver()
    d(HostStart())
    d.recv(peer_connect())
    d.recv(ConnectAck(PEER_ID))
    assert d.s.state == "registering_acked"
    assert d.recv(ConnectAck(PEER_ID)) == []
    assert d.s.state == "registering_acked"
    out = d(RegistrationFinished(True))
    assert d.s.ready
    assert sent(out) == [ConnectAck(LOCAL_ID)]


def test_registration_failure_kills_the_session_without_ack() -> None:
    w = World()
    w.start()
    w.deliver("a")
    w.register("b", ok=False)
    b = w.sessions["b"]
    assert b.state == "ended"
    assert "registration failed" in only(w.hosts["b"].deaths).reason
    assert w.types("b") == ["connect", "disconnect"]


def awaiting_ack_driver() -> Driver:
    """A session that acked its peer and still awaits the peer's ack."""
    d = Driver()
    d(HostStart())
    d.recv(peer_connect())
    d(RegistrationFinished(True))
    assert d.s.state == "awaiting_ack"
    return d


def test_a_request_while_awaiting_the_ack_stands_for_the_lost_ack() -> None:
    """The peer sends requests only once ready, after its connect_ack: a request that
    arrives first means the ack was lost. It completes the handshake (timer disarmed, our
    queue flushed in order before the request's own reply), and is then served."""
    d = Driver()
    d(HostStart())
    d.recv(peer_connect())
    d(HostFetch(1, "r9", (key(9),), (5,)))  # queued: the peer has not acked us
    d(RegistrationFinished(True))
    assert d.s.state == "awaiting_ack"
    out = d.recv(Fetch("r1", (key(1),), (3,), 0))
    assert d.s.ready
    assert TimerId("handshake") not in d.timers
    assert wire_types(sent(out)) == ["fetch"]  # our queued fetch, flushed
    assert of_type(out, FetchArrived) == [FetchArrived("r1", 0, (key(1),))]
    out = d(HostSupply(10, "r1", (key(1),), (7,)))
    write = only(of_type(out, StartWrite))
    assert (write.local_indexes, write.remote_indexes) == ((7,), (3,))
    out = d(WriteFinished(write.xfer, True))
    assert sent(out) == [TransferDone("r1", True, 0)]  # straight out: we are ready
    assert of_type(out, StoreResult) == [StoreResult(10, True)]
    assert d.recv(ConnectAck(PEER_ID)) == []  # the ack, if it still comes, is a duplicate
    assert d.s.ready


@pytest.mark.parametrize("frame", [Lookup("r1", (key(1),), 0), AbortFetch("r1", 0)],
                         ids=["lookup", "abort_fetch"])
def test_every_request_kind_stands_for_the_lost_ack(frame: Lookup | AbortFetch) -> None:
    d = awaiting_ack_driver()
    d.recv(frame)
    assert d.s.ready


def test_a_rejected_request_while_awaiting_the_ack_completes_nothing() -> None:
    """Only an accepted request stands for the ack: a malformed one changes nothing."""
    d = awaiting_ack_driver()
    before = snapshot(d.s)
    out = d.recv(Fetch("r1", (key(1), key(1)), (3, 4), 0))  # duplicate keys
    assert len(out) == 1 and isinstance(out[0], ProtocolViolation)
    assert snapshot(d.s) == before and d.s.state == "awaiting_ack"


def test_response_frame_before_ready_is_a_violation() -> None:
    d = awaiting_ack_driver()
    before = snapshot(d.s)
    out = d.recv(TransferDone("r1", True, 0))
    assert len(out) == 1 and isinstance(out[0], ProtocolViolation)
    assert snapshot(d.s) == before


def test_peer_disconnect_kills_the_session_and_reports_work() -> None:
    d = ready_driver()
    d(HostFetch(1, "r1", (key(1),), (4,)))
    out = d.recv(Disconnect())
    assert only(of_type(out, SessionDead)).reason == "peer disconnected"
    assert of_type(out, LoadResult) == [LoadResult(1, "r1", False, False)]
    assert sent(out) == []
    assert d.s.state == "ended"
