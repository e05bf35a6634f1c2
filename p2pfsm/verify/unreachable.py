"""Transitions ``models/`` declares that the session code can never take.

The conformance tests exclude them from the models <-> spec comparison, require the
spec never to take them, and skip them in the spec -> code replay; each entry says
why it is unreachable (reported to the owner of ``models/``).
"""

from __future__ import annotations

Edge = tuple[str, str, str]
"""(source, trigger, dest)."""

KNOWN_UNREACHABLE: dict[str, dict[Edge, str]] = {
    "server_round": {
        ("new", "recv_fetch", "done"):
            "is_unservable needs lookup_supplied, which only lookup_pin sets, and "
            "lookup_pin leaves `new` for `supplied`: a round in `new` is never unservable",
        ("new", "session_lost", "draining"):
            "`new` is never observed between events: every caller of Session._round_for "
            "fires the round's first trigger (host_supply, lookup_pin, recv_fetch) at once",
    },
}
