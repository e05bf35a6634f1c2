"""Behaviour profiles a target is held to (``p2pfsm conform --profile``), and the cases
whose expected outcome differs by profile.

The wire is the same in every profile; a profile names whose behaviour the target is
meant to have (p2pfsm's own, or a vLLM release's, :mod:`p2pfsm.vllm.releases`). The
properties hold whatever the profile (no destination released while a write may land,
every job exactly one result, no round reused while a frame of it may be on the wire),
so a case's verdict does not change with it; what changes is what the suite expects of
the release, which the report marks next to the verdict.
"""

from __future__ import annotations

from typing import Final

PROFILES: Final = ("native", "vllm-0.33", "vllm-0.34")
"""Every profile, p2pfsm's own first."""

DIFFERS: Final[dict[str, dict[str, str]]] = {
    "consumer.abort-quiescence": {
        "native": "pass: the load is reported only on our abort_ack",
        "vllm-0.33": "fail: the load is given up one abort-ack timeout after the abort "
                     "and its blocks fetched into again before our ack",
        "vllm-0.34": "fail: the load is reported failed when abort_fetch goes out (its "
                     "blocks' release deferred to our abort_ack), and a missing ack ends "
                     "the session after 5 s, which releases them before our ack",
    },
    "consumer.stray-abort-ack": {
        "native": "pass: the frame is rejected and changes nothing; the round is served",
        "vllm-0.33": "pass: the load fails and the session goes on",
        "vllm-0.34": "fail: every later poll raises, the load never gets a result",
    },
    "consumer.round-isolation": {
        "native": "pass: the next fetch of the request uses a new round_seq",
        "vllm-0.33": "fail: round_seq restarts at 0 once the request's state is pruned",
        "vllm-0.34": "fail: round_seq restarts at 0 once the request's state is pruned",
    },
}
"""Case id -> profile -> the outcome expected of that profile, and why."""


def expected(case_id: str, profile: str) -> str:
    """What ``profile`` is expected to give in ``case_id`` where that differs by profile;
    "" where it does not."""
    return DIFFERS.get(case_id, {}).get(profile, "")
