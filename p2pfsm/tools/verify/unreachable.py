"""Transitions ``models/`` declares that no profile's gate config takes, and why.

:data:`KNOWN_UNREACHABLE`: the session code can never take them (under the profiles of
``models/profiles/``). :data:`BEYOND_GATE`:
the code can take them, but only in behaviours larger than the gate config's bounds
(tests/scenarios/test_scenario_draining.py, test_scenario_close.py,
test_scenario_one_sided.py, test_declared_answers.py and test_scenario_never_sent.py
drive each against the code). The
conformance tests exclude both from the models <-> spec comparison, require the gate's
spec never to take them (so a stale entry fails), and skip them in the spec -> code
replay. Each entry is also explained next to its transition in the model file.
"""

from __future__ import annotations

Edge = tuple[str, str, str]
"""(source, trigger, dest)."""

_ABORT_BEFORE_READY = (
    "an abort before the handshake completed under a profile that reports a failed load at "
    "its abort's sending or ends the session on a missing abort_ack: vllm-0.34, the one "
    "profile that does, retires a fetch still queued then (unsent_fetch = retire_locally), "
    "so none of its rounds is aborted before ready")

KNOWN_UNREACHABLE: dict[str, dict[Edge, str]] = {
    "client_round": {
        ("reported", "session_lost_unsent", "released"): _ABORT_BEFORE_READY,
    },
    "session": {
        (state, "abort_ack_expired", "ended"): _ABORT_BEFORE_READY
        for state in ("connecting", "registering", "registering_acked", "awaiting_ack")
    },
    "server_round": {
        ("new", "session_lost", "draining_silent"):
            "`new` is never observed between events: every caller of ServerPart._round_for "
            "fires the round's first trigger (host_supply, lookup_pin, recv_fetch) at once",
    },
}

_RESTART_BEFORE_READY = (
    "a restart of the peer before the handshake completed: gate scenario 10 restarts a "
    "peer of a ready session, and the scenarios that start before the handshake (1 and 12) "
    "allow no restart (tests/scenarios/test_scenario_restart.py drives it)")

_FINISH_BEFORE_READY = (
    "a host finish of a request whose lookup round no fetch took, before the handshake "
    "completed: the gate's scenarios that start before the handshake (1 and 12) finish no "
    "request (and 1 makes no lookup) (tests/scenarios/test_declared_answers.py drives it)")

BEYOND_GATE: dict[str, dict[Edge, str]] = {
    "client_lookup": {
        ("expired", "session_lost_unsent", "cancelled"):
            "a lookup's deadline before the handshake completed, then the session's end "
            "before it: of the gate's scenarios that start before the handshake, 1 makes "
            "no lookup and 12 arms no lookup timer; under a profile that ends the session "
            "on the deadline the lookup is still probing (tests/scenarios/"
            "test_scenario_never_sent.py drives it)",
    },
    "server_round": {
        ("draining_silent", "recv_terminal_fetch", "draining_silent"):
            "a second terminal fetch while the first one's round still drains needs two "
            "lookups and two host finishes of one request with a write in flight",
        ("draining_silent", "session_lost", "draining_silent"):
            "a round drains silently with a write in flight only when the consumer's "
            "abort was lost (a terminal fetch otherwise meets a round that was aborted); "
            "dying then is a second fault, and the gate allows one",
    },
    "session": {
        ("registering", "recv_connect", "dead"): _RESTART_BEFORE_READY,
        ("registering_acked", "recv_connect", "dead"): _RESTART_BEFORE_READY,
        ("awaiting_ack", "recv_connect", "dead"): _RESTART_BEFORE_READY,
        ("ready", "recv_connect", "ended"):
            "a second connect without an incarnation on a ready session is a vLLM 0.33.0 "
            "peer's; every spec peer sends one, so there it is a reconnect "
            "(tests/scenarios/test_scenario_handshake.py drives it)",
        ("awaiting_ack", "recv_bad_fetch", "awaiting_ack"):
            "a fetch reaches us before the peer's connect_ack only when that ack was lost "
            "(it precedes the fetch on the wire), and a malformed fetch is a second fault "
            "(tests/scenarios/test_scenario_malformed.py drives it)",
        ("connecting", "finish_lookup_round", "connecting"): _FINISH_BEFORE_READY,
        ("registering", "finish_lookup_round", "registering"): _FINISH_BEFORE_READY,
        ("registering_acked", "finish_lookup_round", "registering_acked"): _FINISH_BEFORE_READY,
        ("awaiting_ack", "finish_lookup_round", "awaiting_ack"): _FINISH_BEFORE_READY,
        ("dead", "recv_disconnect", "ended"):
            "a disconnect reaches a dead session only when a one-sided loss is followed "
            "by the peer's own close (or another death that sends one): two faults, and "
            "the gate allows one (tests/scenarios/test_scenario_one_sided.py drives it)",
    },
}


def excluded(machine: str) -> dict[Edge, str]:
    """Every edge of ``machine`` the gate's spec is not expected to take, with why."""
    return {**KNOWN_UNREACHABLE.get(machine, {}), **BEYOND_GATE.get(machine, {})}
