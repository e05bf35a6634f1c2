"""Host helpers: vLLM-style chained block keys, and a producer's pinned-block index.

The keys are checked against an independent statement of vLLM's rule (SHA-256 of the
pickled ``(parent, tokens, extra_keys)``, the root the SHA-256 of the pickled seed, the
group index appended big-endian); tests/interop checks them against vLLM itself.
"""

from __future__ import annotations

import hashlib
import pickle

import pytest

import p2pfsm
from p2pfsm.blocks import BlockHasher, PinnedBlocks
from p2pfsm.errors import ConfigError


def _h(value: object) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=5)).digest()


def test_keys_chain_from_the_seed_and_carry_the_group() -> None:
    hasher = BlockHasher(4, "seed-x", group=2)
    tokens = list(range(10))  # two full blocks and a partial one
    root = _h("seed-x")
    first = _h((root, (0, 1, 2, 3), None))
    second = _h((first, (4, 5, 6, 7), None))
    assert hasher.block_hashes(tokens) == [first, second]
    assert hasher.keys(tokens) == [first + b"\0\0\0\2", second + b"\0\0\0\2"]
    assert hasher.block_hashes(tokens[4:8], parent=first) == [second]
    assert BlockHasher(4, "other").keys(tokens) != BlockHasher(4, "seed-x").keys(tokens)
    salted = hasher.block_hashes(tokens, extra_keys=[("salt",)])
    assert salted[0] == _h((root, (0, 1, 2, 3), ("salt",))) and salted[1] != second


@pytest.mark.parametrize("kwargs", [{"block_size": 0}, {"block_size": 4, "hash_seed": ""},
                                    {"block_size": 4, "group": -1}])
def test_a_hasher_refuses_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        BlockHasher(**kwargs)  # type: ignore[arg-type]


def test_pinned_blocks_are_not_evicted_or_rekeyed() -> None:
    index = PinnedBlocks()
    index.add(b"a", 0)
    index.add(b"b", 1)
    assert index.pin([b"a", b"zz", b"a"]) == {b"a": 0}
    assert index.pinned(0) and not index.pinned(1)
    with pytest.raises(ConfigError, match="pinned"):
        index.evict(b"a")
    with pytest.raises(ConfigError, match="pinned"):
        index.add(b"c", 0)
    with pytest.raises(ConfigError, match="pinned"):
        index.add(b"a", 5)
    with pytest.raises(ConfigError, match="not pinned 2"):
        index.unpin([0, 0])
    assert index.get(b"a") == 0 and index.pinned(0)  # the refused calls changed nothing
    index.unpin([0])
    assert index.evict(b"a") == 0 and b"a" not in index and len(index) == 1
    index.add(b"b", 7)  # a key moves: its old block is free
    assert index.get(b"b") == 7 and index.evict(b"b") == 7 and len(index) == 0


def test_the_host_api_is_at_the_top_level() -> None:
    from p2pfsm.executor.nixl.memory import HostRegion
    from p2pfsm.executor.node import Node, NodeConfig

    assert p2pfsm.Node is Node and p2pfsm.NodeConfig is NodeConfig
    assert p2pfsm.HostRegion is HostRegion and p2pfsm.BlockHasher is BlockHasher
    assert all(hasattr(p2pfsm, name) for name in p2pfsm.__all__)
    with pytest.raises(AttributeError):
        _ = p2pfsm.NoSuchThing  # type: ignore[attr-defined]


def test_a_nodes_public_namespace_holds_host_calls_only() -> None:
    from p2pfsm.executor.node import Node
    from p2pfsm.executor.runtime.effects import handler_names

    public = {name for name in dir(Node) if not name.startswith("_")}
    assert not public & {*handler_names(), "apply"}, public & {*handler_names(), "apply"}
    assert {"connect", "disconnect", "redial_now", "fetch", "lookup", "supply", "finish",
            "decline", "resolve_lookup", "serve", "step", "close"} <= public
