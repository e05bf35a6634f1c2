"""NodeConfig checks every field when it is built: a bad value is a ConfigError naming it."""

from __future__ import annotations

from typing import Any

import pytest

from p2pfsm.errors import ConfigError
from p2pfsm.executor.node.config import MAX_REGION_BYTES, NodeConfig, fingerprint
from p2pfsm.session import Timeouts

GOOD: dict[str, Any] = {"bind": "tcp://127.0.0.1:0", "num_blocks": 16, "block_len": 4096}


def make(**kw: Any) -> NodeConfig:
    return NodeConfig(**{**GOOD, **kw})


def test_defaults_are_valid_and_fingerprint_is_vllms() -> None:
    cfg = make(model_config={"model": "m", "dtype": "bf16"})
    assert cfg.device is None and cfg.memory is None and cfg.max_peers == 128
    assert cfg.max_new_peers_per_s == 500
    assert cfg.config_fingerprint == fingerprint({"dtype": "bf16", "model": "m"})
    assert len(cfg.config_fingerprint) == 16
    assert make(fingerprint="abc").config_fingerprint == "abc"
    # Peers that come back: a session the host opened is opened again by default.
    assert cfg.reconnect_backoff_s == (0.1, 1.0) and cfg.reconnect_max_attempts is None
    assert make(reconnect_backoff_s=None).reconnect_backoff_s is None  # the off switch


@pytest.mark.parametrize(("field", "value"), [
    ("bind", "udp://127.0.0.1:5555"),
    ("bind", "127.0.0.1"),
    ("bind", 5555),
    ("num_blocks", 0),
    ("num_blocks", True),
    ("num_blocks", 1 << 31),
    ("block_len", -1),
    ("block_len", 4096.0),
    ("hash_seed", ""),
    ("hash_seed", None),
    ("model_config", ["not", "a", "mapping"]),
    ("model_config", {"x": object()}),
    ("fingerprint", 123),
    ("timeouts", {"load": 1}),
    ("device", "gpu"),
    ("device", "cuda:x"),
    ("heartbeat_ivl_ms", -1),
    ("heartbeat_timeout_ms", "10"),
    ("connect_timeout_ms", 0),
    ("advertise_host", ""),
    ("advertise_host", "10.0.0.1:80"),
    ("advertise_host", 7),
    ("max_peers", 0),
    ("max_lookups_per_request", 0),
    ("max_lookups_per_request", True),
    ("max_new_peers_per_s", 0),
    ("max_new_peers_per_s", True),
    ("max_new_peers_per_s", 10.0),
    ("max_new_peers_per_s", None),
    ("max_new_peers_per_s", 1_000_001),
    ("history", 0),
    ("trace", ""),
    ("reconnect_backoff_s", (0.0, 5.0)),
    ("reconnect_backoff_s", (5.0, 1.0)),
    ("reconnect_backoff_s", [0.1, 5.0]),
    ("reconnect_backoff_s", 0.1),
    ("reconnect_max_attempts", 0),
    ("reconnect_max_attempts", True),
])
def test_a_bad_field_is_named_at_construction(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        make(**{field: value})


def test_bind_takes_host_port_with_or_without_tcp() -> None:
    from p2pfsm.executor.zmq.peer_ids import peer_address

    assert make(bind="127.0.0.1:5555").bind == "tcp://127.0.0.1:5555"
    assert make(bind="tcp://127.0.0.1:5555").bind == "tcp://127.0.0.1:5555"
    assert peer_address("tcp://10.0.0.1:80") == peer_address("10.0.0.1:80") == "10.0.0.1:80"


def test_a_region_too_large_to_exist_is_refused_before_any_allocation() -> None:
    with pytest.raises(ConfigError, match="num_blocks \\* block_len"):
        make(num_blocks=1 << 30, block_len=MAX_REGION_BYTES >> 29)


def test_timeouts_are_checked_by_their_own_type() -> None:
    with pytest.raises(ConfigError, match=r"timeouts\.load"):
        Timeouts(load=0)
    assert make(timeouts=Timeouts(load=1)).timeouts.load == 1


def test_the_profile_gives_the_deadlines_left_out_and_an_unknown_one_is_refused() -> None:
    v34 = NodeConfig("tcp://127.0.0.1:0", 4, 4096, profile="vllm-0.34")
    assert (v34.timeouts.abort_ack, v34.timeouts.load_probed, v34.timeouts.hold) == (5.0, 10.0,
                                                                                    30.0)
    assert NodeConfig("tcp://127.0.0.1:0", 4, 4096).timeouts == Timeouts()
    mine = Timeouts(load=3.0)
    assert NodeConfig("tcp://127.0.0.1:0", 4, 4096, profile="vllm-0.34",
                      timeouts=mine).timeouts is mine
    with pytest.raises(ConfigError, match="unknown profile 'x'"):
        NodeConfig("tcp://127.0.0.1:0", 4, 4096, profile="x")


def test_a_peer_may_run_another_profile_with_its_deadlines() -> None:
    cfg = NodeConfig("tcp://127.0.0.1:0", 4, 4096, peer_profiles={"10.0.0.2:5000": "vllm-0.34"})
    assert cfg.session_profile("10.0.0.9:5000") == ("native", Timeouts())
    name, t = cfg.session_profile("10.0.0.2:5000")
    assert (name, t.abort_ack, t.hold) == ("vllm-0.34", 5.0, 30.0)
    mine = Timeouts(load=3.0)
    own = NodeConfig("tcp://127.0.0.1:0", 4, 4096, timeouts=mine,
                     peer_profiles={"10.0.0.2:5000": "vllm-0.34"})
    assert own.session_profile("10.0.0.2:5000") == ("vllm-0.34", mine)
    with pytest.raises(ConfigError, match="unknown profile 'old'"):
        NodeConfig("tcp://127.0.0.1:0", 4, 4096, peer_profiles={"x:1": "old"})
