"""Handshake abuse: every connect field wrong in type, range or value; identities
that lie; duplicate, missing and unfinished handshakes.

A connect that fails validation is no connect: the server opens no session and says
nothing. A well-formed connect the server cannot accept (a mismatch, metadata NIXL
refuses) is answered with a disconnect. Either way the same peer's next, correct
handshake must succeed, and so must a fetch over it.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Hostile
from .wire import DROP, connect_msg, patched

BAD_METADATA = b"\x00" * 32 + b"not nixl metadata" * 8

# name -> (override of the connect map, expected reply: "silent" or "disconnect")
BAD_CONNECTS: dict[str, tuple[dict[str, Any], str]] = {
    "peer_id_int": ({"peer_id": 12345}, "silent"),
    "peer_id_empty": ({"peer_id": ""}, "silent"),
    "peer_id_5000_chars": ({"peer_id": "h" * 5000}, "silent"),
    "peer_id_bin": ({"peer_id": b"127.0.0.1:1"}, "silent"),
    # Not a connect from the identity that sent it: never dialled back, so no reply at all.
    "peer_id_not_the_sender": ({"peer_id": "127.0.0.1:1"}, "silent"),
    "agent_metadata_str": ({"agent_metadata": "meta"}, "silent"),
    "agent_metadata_garbage": ({"agent_metadata": BAD_METADATA}, "disconnect"),
    "agent_metadata_empty": ({"agent_metadata": b""}, "disconnect"),
    "base_addr_negative": ({"base_addr": -1}, "silent"),
    "base_addr_bool": ({"base_addr": True}, "silent"),
    "base_addr_float": ({"base_addr": 4096.0}, "silent"),
    "base_addr_zero": ({"base_addr": 0}, "disconnect"),
    "base_addr_u64_max_overflows": ({"base_addr": 2**64 - 1}, "silent"),
    "num_blocks_zero": ({"num_blocks": 0}, "silent"),
    "num_blocks_negative": ({"num_blocks": -64}, "silent"),
    "num_blocks_2p31_plus_1": ({"num_blocks": 2**31 + 1}, "silent"),
    "num_blocks_2p31_too_many_to_prep": ({"num_blocks": 2**31}, "disconnect"),
    "num_blocks_str": ({"num_blocks": "64"}, "silent"),
    "block_len_mismatch": ({"block_len": 8192}, "disconnect"),
    "block_len_zero": ({"block_len": 0}, "silent"),
    "block_len_str": ({"block_len": "4096"}, "silent"),
    "hash_seed_mismatch": ({"hash_seed": "another-seed"}, "disconnect"),
    "hash_seed_empty": ({"hash_seed": ""}, "silent"),
    "hash_seed_list": ({"hash_seed": ["vllm-none-hash"]}, "silent"),
    "fingerprint_mismatch": ({"config_fingerprint": "deadbeefdeadbeef"}, "disconnect"),
    "fingerprint_int": ({"config_fingerprint": 0}, "silent"),
    "missing_base_addr": ({"base_addr": DROP}, "silent"),
    "missing_agent_metadata": ({"agent_metadata": DROP}, "silent"),
    "extra_unknown_fields_only": ({"zzz": [1, 2, 3], "hash_seed": DROP}, "silent"),
}


@pytest.mark.parametrize("name", sorted(BAD_CONNECTS))
def test_bad_connect_field(hostile: Hostile, name: str) -> None:
    override, expected = BAD_CONNECTS[name]
    plane = hostile.agent()
    peer = hostile.peer()
    peer.send(patched(connect_msg(peer.peer_id, plane.metadata, plane.base_addr), override))
    if expected == "disconnect":
        peer.expect("disconnect", 10.0)
    # Now the right connect: the server's answer must be a connect (and, for "silent",
    # the first thing it ever sent us: the bad one got no reply at all).
    peer.handshake(plane.metadata, plane.base_addr)
    before = [m.get("type") for m in peer.seen]
    if expected == "silent":
        assert before[0] == "connect", before
        assert "disconnect" not in before, before
    peer.fetch_ok(plane, "after-bad-connect", range(2))
    hostile.react(f"{'no reply, no session' if expected == 'silent' else 'disconnect'}; "
                  "then the same peer's handshake + fetch succeed")
    hostile.verify()


def test_connect_with_the_targets_own_metadata(hostile: Hostile) -> None:
    plane = hostile.agent()
    first = hostile.peer()
    theirs = first.handshake(plane.metadata, plane.base_addr)
    mirror = hostile.peer()
    mirror.send(connect_msg(mirror.peer_id, theirs["agent_metadata"], theirs["base_addr"]))
    mirror.expect("disconnect")
    first.fetch_ok(plane, "still-fine", range(2))
    hostile.react("disconnect (metadata describes the server's own agent)")
    hostile.verify()


def test_connect_with_another_live_peers_metadata(hostile: Hostile) -> None:
    plane = hostile.agent()
    victim = hostile.peer()
    victim.handshake(plane.metadata, plane.base_addr)
    thief = hostile.peer()
    thief.send(connect_msg(thief.peer_id, plane.metadata, plane.base_addr))
    thief.expect("disconnect")
    victim.fetch_ok(plane, "victim-unharmed", range(3))
    hostile.react("disconnect (agent already registered as another peer); victim unharmed")
    hostile.verify()


def test_connect_claiming_a_live_peers_id(hostile: Hostile) -> None:
    """peer_id names another, live peer: the identity does not match it."""
    plane = hostile.agent()
    victim = hostile.peer()
    victim.handshake(plane.metadata, plane.base_addr)
    spoof = hostile.peer()
    other = hostile.agent()
    spoof.send(connect_msg(victim.peer_id, other.metadata, other.base_addr))
    # A connect naming another identity than its sender is not dialled back: silence.
    assert spoof.types_within(0.5) == []
    victim.fetch_ok(plane, "victim-unharmed", range(3))
    hostile.react("no reply to the spoofer (not dialled back); the real peer unharmed")
    hostile.verify()


def test_duplicate_connect_after_ready(hostile: Hostile) -> None:
    peer, plane = hostile.ready()
    peer.send(connect_msg(peer.peer_id, plane.metadata, plane.base_addr))
    reply = peer.types_within(0.5)
    # Whatever the server makes of it (a fresh handshake or an end), the peer can
    # always start over and fetch.
    if "disconnect" in reply or "connect" not in reply:
        peer.handshake(plane.metadata, plane.base_addr)
    else:
        peer.send({"type": "connect_ack", "peer_id": peer.peer_id})
        peer.expect("connect_ack")
    peer.fetch_ok(plane, "after-dup-connect", range(2))
    hostile.react(f"replied {reply or 'nothing'}; peer can start over and fetch")
    hostile.verify()


def test_duplicate_connect_during_handshake(hostile: Hostile) -> None:
    plane = hostile.agent()
    peer = hostile.peer()
    msg = connect_msg(peer.peer_id, plane.metadata, plane.base_addr)
    for _ in range(5):
        peer.send(msg)
    reply = peer.types_within(0.5)
    assert reply.count("connect") >= 1, reply
    peer.handshake(plane.metadata, plane.base_addr)
    peer.fetch_ok(plane, "after-5-connects", range(2))
    hostile.react(f"replied {reply}; a clean handshake then works")
    hostile.verify()


def test_connect_ack_without_connect(hostile: Hostile) -> None:
    plane = hostile.agent()
    peer = hostile.peer()
    for _ in range(3):
        peer.send({"type": "connect_ack", "peer_id": peer.peer_id})
    peer.handshake(plane.metadata, plane.base_addr)
    assert peer.seen[0].get("type") == "connect", peer.seen
    peer.fetch_ok(plane, "after-stray-acks", range(2))
    hostile.react("ignored (no session); handshake afterwards fine")
    hostile.verify()


def test_connect_ack_with_wrong_peer_id(hostile: Hostile) -> None:
    """The ack's peer_id names someone else. The routing id is what identifies the
    peer; whatever the server makes of the ack, it must not wedge: a fetch either is
    served (ack taken) or the peer can redo the handshake and then fetch."""
    plane = hostile.agent()
    peer = hostile.peer()
    peer.send(connect_msg(peer.peer_id, plane.metadata, plane.base_addr))
    peer.expect("connect")
    peer.send({"type": "connect_ack", "peer_id": "127.0.0.1:9"})
    reply = peer.types_within(0.3)
    if "connect_ack" in reply:
        peer.fetch_ok(plane, "after-wrong-ack", range(2))
        outcome = "ack taken (its peer_id is not compared; the routing id is)"
    else:
        peer.handshake(plane.metadata, plane.base_addr)
        peer.fetch_ok(plane, "after-wrong-ack", range(2))
        outcome = f"replied {reply or 'nothing'}; a clean handshake then works"
    hostile.react(outcome)
    hostile.verify()


def test_handshake_never_finished(hostile: Hostile) -> None:
    """connect, then never the ack: a legitimate client is served meanwhile."""
    from .conftest import legit_fetch

    hanging = []
    for _ in range(20):
        plane = hostile.agent()
        peer = hostile.peer()
        peer.send(connect_msg(peer.peer_id, plane.metadata, plane.base_addr))
        hanging.append(peer)
    for peer in hanging:
        peer.expect("connect")
    legit_fetch(hostile.addr, range(8))
    assert all("disconnect" not in p.types_within(0.01) for p in hanging)
    hostile.react("20 half-done handshakes held; legit fetch served meanwhile; "
                  "released when they go")
    hostile.verify()


@pytest.mark.slow
def test_handshake_never_finished_times_out(hostile: Hostile) -> None:
    """The server's handshake deadline (30 s, vLLM's) ends the session: disconnect."""
    plane = hostile.agent()
    peer = hostile.peer()
    peer.send(connect_msg(peer.peer_id, plane.metadata, plane.base_addr))
    peer.expect("connect")
    peer.expect("disconnect", 45.0)
    hostile.react("disconnect at the handshake deadline")
    hostile.verify()
