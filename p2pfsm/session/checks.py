"""Checks of host-call arguments that need only our config (raise LocalProtocolError).

The session and its parts call these before any machine fires, so a refused host call
changes nothing. Their arguments are typed ``object`` where the host's value is still
unchecked: a compiled build (mypyc) would otherwise refuse a wrong type with a TypeError
at the call, before the check could raise its LocalProtocolError.
"""

from __future__ import annotations

from collections.abc import Sequence

from p2pfsm.errors import LocalProtocolError
from p2pfsm.protocol.validate import bytes_within, ints_within
from p2pfsm.session.config import SessionConfig


def check_request_id(config: SessionConfig, kv_request_id: object, what: str) -> None:
    """A request id our peer's decoder accepts (else the frame would be dropped there)."""
    limit = config.limits.max_str_len
    if type(kv_request_id) is not str or not kv_request_id:
        raise LocalProtocolError(f"{what}: kv_request_id must be a non-empty str, "
                                 f"got {kv_request_id!r}")
    if len(kv_request_id.encode("utf-8", "surrogatepass")) > limit:
        raise LocalProtocolError(f"{what}: kv_request_id longer than {limit} bytes")


def check_keys(config: SessionConfig, keys: Sequence[object], indexes: Sequence[object],
               what: str, kv_request_id: object) -> None:
    """Keys and our block indexes of a host call: as many of each, distinct non-empty
    keys within the limits, indexes inside our region; and its request id."""
    check_request_id(config, kv_request_id, what)
    if len(keys) != len(indexes):
        raise LocalProtocolError(f"{what}: {len(keys)} keys but {len(indexes)} indexes")
    max_key = config.limits.max_key_bytes
    if not bytes_within(keys, 1, max_key):  # the loop only names the culprit
        for i, key in enumerate(keys):
            if type(key) is not bytes or not key or len(key) > max_key:
                raise LocalProtocolError(
                    f"{what}: keys[{i}] must be non-empty bytes of at most {max_key}")
    if len(set(keys)) != len(keys):
        raise LocalProtocolError(f"{what}: duplicate keys")
    if len(keys) > config.limits.max_list_items:
        raise LocalProtocolError(
            f"{what}: {len(keys)} keys, more than {config.limits.max_list_items}")
    blocks = config.num_blocks
    if not ints_within(indexes, 0, blocks - 1):
        for i, idx in enumerate(indexes):
            if type(idx) is not int or not 0 <= idx < blocks:
                raise LocalProtocolError(
                    f"{what}: index[{i}]={idx!r} outside our {blocks} blocks")
