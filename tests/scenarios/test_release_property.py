"""Held destinations over many seeded runs, under each behaviour profile: a release
notice never frees a block a write may still land in (the world raises SafetyViolation
when a write lands in a block its host reuses), no job gets two notices or one whose
result said ``released=True``, and once every write has ended and the data plane's
proof reaches the sessions that are over, every ``released=False`` result has its one
notice."""

from __future__ import annotations

import random

import pytest

from p2pfsm.errors import LocalProtocolError
from p2pfsm.session import PeerGone, Timeouts
from p2pfsm.sim.world import SimWorld

SEEDS = 120
STEPS = 40


def _proof(w: SimWorld) -> None:
    """The data plane's proof, where it holds: the peer's session is over and none of
    its writes is in flight (what PeerGone stands for)."""
    for node in w.NODES:
        peer = w.other(node)
        if (not w.sessions[node].alive and not w.sessions[peer].alive
                and not any(src == peer for src, _x in w.writes)):
            w.feed(node, PeerGone("data_plane"))


def _run(seed: int, profile: str) -> SimWorld:
    rng = random.Random(seed)
    # No bounded hold: a clock proves nothing about a write still in flight here.
    t = Timeouts(load=1.0, load_probed=0.5, abort_ack=0.5, lookup=1.0)
    w = SimWorld(seed, timeouts=t, cancelled_writes_land=True,
                 configs={n: {"profile": profile} for n in ("a", "b")})
    w.start()
    for _ in range(STEPS):
        roll, req = rng.random(), f"r{rng.randrange(2)}"
        try:
            if roll < 0.25:
                w.fetch("a", req, rng.sample(range(8, 16), rng.randrange(1, 3)))
            elif roll < 0.4:
                w.supply("b", req, rng.sample(range(8, 16), rng.randrange(1, 3)))
            elif roll < 0.47:
                w.finish("a", req)
            elif roll < 0.5:
                w.cut()
            elif roll < 0.52:
                w.close(rng.choice("ab"))
            elif roll < 0.62:
                w.advance()
            elif roll < 0.66:
                _proof(w)
            else:
                steps = w.enabled()
                if steps:
                    rng.choice(steps)[1]()
        except LocalProtocolError:
            pass  # a refused host call changes nothing
    w.run(2000)
    for node in w.NODES:
        w.close(node)
    w.run(2000)
    _proof(w)
    return w


@pytest.mark.parametrize("profile", ["native", "vllm-0.33", "vllm-0.34"])
def test_every_held_destination_is_released_once_and_never_early(profile: str) -> None:
    held = released = 0
    for seed in range(SEEDS):
        w = _run(seed, profile)  # a SafetyViolation fails the test here
        host = w.hosts["a"]
        owed = {j for j, r in host.load_results.items() if not r.released}
        assert set(host.released_later) == owed, (seed, owed, host.released_later)
        held += len(owed)
        released += len(host.released_later)
        assert all(not s.held_destinations for s in w.sessions.values()), seed
    assert held == released
    assert held >= 5, f"only {held} held destinations in {SEEDS} runs: the test is idle"
