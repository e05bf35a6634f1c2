"""A frame in one line, in the protocol's words (for verdicts and reports)."""

from __future__ import annotations

from p2pfsm.protocol import Connect, Message


def describe(msg: Message) -> str:
    """A frame in one line, in the protocol's words."""
    kind = msg.TYPE
    if isinstance(msg, Connect):
        return (f"connect(peer_id={msg.peer_id!r}, block_len={msg.block_len}, "
                f"hash_seed={msg.hash_seed!r}, fingerprint={msg.config_fingerprint!r})")
    parts = []
    for name in ("kv_request_id", "round_seq", "success"):
        if hasattr(msg, name):
            parts.append(f"{name}={getattr(msg, name)!r}")
    keys = getattr(msg, "keys", None)
    if keys is not None:
        parts.append(f"{len(keys)} key(s)")
    hits = getattr(msg, "hits", None)
    if hits is not None:
        parts.append("hits=" + "".join("T" if h else "F" for h in hits))
    return f"{kind}({', '.join(parts)})"
