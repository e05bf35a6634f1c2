"""Counters of fuzzed inputs actually executed, printed in the pytest terminal summary.

Every fuzz test bumps these as it runs an input (not when it draws one), so the
summary line tells how much fuzzing a run really did. ``examples(n)`` gives each
test's example budget: ``n`` in CI, 10x under ``HYPOTHESIS_PROFILE=long``, or
``P2PFSM_FUZZ_EXAMPLES`` when set (it overrides every test's budget).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long"
_OVERRIDE = os.environ.get("P2PFSM_FUZZ_EXAMPLES")


@dataclass
class Counts:
    frames_decoded: int = 0
    """Frames passed to ``decode`` directly."""
    decode_rejected: int = 0
    session_frames: int = 0
    """FrameReceived inputs handled by a session."""
    session_events: int = 0
    """Other session inputs: host calls, timers, write results, registrations."""
    rejected_frames: int = 0
    """Frames answered with one ProtocolViolation or FrameIgnored; each was checked to
    leave the session's whole digest unchanged."""
    answered_rejections: int = 0
    """Of those, malformed fetches that named their round and got transfer_done(false)
    for it (recv_bad_fetch): the reply is their only other effect."""
    rejected_host_calls: int = 0
    """Host calls that raised LocalProtocolError; each was checked to change nothing."""
    crashes: int = 0
    """Exceptions outside the documented families (each also fails its test)."""
    changed_by_rejection: int = 0
    """Rejected inputs that changed the session (each also fails its test)."""
    max_decode_s: float = 0.0
    max_peak_bytes: int = 0

    @property
    def session_inputs(self) -> int:
        return self.session_frames + self.session_events


COUNTS = Counts()


def examples(ci: int) -> int:
    """The example budget of a test whose CI budget is ``ci``."""
    if _OVERRIDE:
        return int(_OVERRIDE)
    return ci * 10 if LONG else ci


def fuzz_settings(ci: int) -> settings:
    """Settings for one fuzz test: derandomized in CI, random in long runs, no database."""
    return settings(
        max_examples=examples(ci),
        derandomize=not LONG and not _OVERRIDE,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much, HealthCheck.large_base_example],
    )
