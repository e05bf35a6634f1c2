"""What one peer can make the server keep, spend or log, bounded: per-request memory
(tombstones), dial-backs, loaded NIXL agents, the cost of a connect, a line of the log.

Each scenario is the attack as a hostile peer runs it against the real ``serve``
process, with a legitimate peer fetching byte-exact in between, and the server's fds
and RSS read from /proc.
"""

from __future__ import annotations

import pytest

from .conftest import Hostile, legit_fetch

TERMINAL_ROUNDS = 3
TERMINAL_FETCHES = 6000
ID_LEN = 4000


def _terminal_fetch(rid: str) -> dict[str, object]:
    return {"type": "fetch", "kv_request_id": rid, "keys": [], "block_indexes": [],
            "round_seq": 0}


def test_terminal_fetches_leave_no_memory_behind_their_session(hostile: Hostile) -> None:
    """Three sessions one after the other, each 6,000 terminal fetches with 4,000-byte
    request ids (a peer-finished tombstone each, ~24 MB of ids), then a real fetch
    checked byte for byte, then a disconnect. A session keeps at most
    ``max_tombstones`` of them and an ended session none, so RSS after the third
    session is within one session's volume of RSS after the first (without the bounds
    each ended session kept all of its ids for the node's ``history``)."""
    volume = TERMINAL_FETCHES * ID_LEN
    after = []
    for r in range(TERMINAL_ROUNDS):
        peer, plane = hostile.ready()
        for i in range(TERMINAL_FETCHES):
            peer.send(_terminal_fetch(f"{r}-{i:06d}-".ljust(ID_LEN, "x")))
        # Frames of one connection are handled in order: once this fetch is served,
        # every terminal fetch before it was.
        peer.fetch_ok(plane, f"check-{r}", range(4), timeout=60.0)
        peer.send({"type": "disconnect"})
        legit_fetch(hostile.addr, host="127.0.0.2")
        after.append(hostile.server.rss())
    growth = after[-1] - after[0]
    assert growth < volume, ([a >> 20 for a in after], volume >> 20)
    hostile.react(f"RSS after each session {[a >> 20 for a in after]} MiB "
                  f"({TERMINAL_FETCHES} terminal fetches each)")
    hostile.verify()


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
