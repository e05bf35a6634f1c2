"""A digest of what sessions do over many seeded simulated runs, to show a refactor
changes no behaviour.

    PYTHONPATH=. .venv/bin/python -m tests.helpers.run_digest 600

Each seed drives two sessions in :class:`~p2pfsm.sim.world.SimWorld` through a random
mix of host calls (fetch, supply, lookup, finish, close), cuts, clock jumps and network
steps, then lets the world run out. Every ``Session.handle`` call contributes its node,
the time, the input, the outputs, the machine steps the tracer recorded and the spec
action it is named as; the printed SHA-256 over all seeds (and the call count) must be
the same before and after a change that claims to keep behaviour.
"""

from __future__ import annotations

import argparse
import hashlib
import random
from collections.abc import Sequence
from typing import Any

from p2pfsm.errors import LocalProtocolError
from p2pfsm.fsm import TraceCursor, Tracer
from p2pfsm.session import Input, Output
from p2pfsm.sim.world import SimWorld
from p2pfsm.spec_calls import call_action

_TIMER_OUTPUTS = ("ArmTimer", "DisarmTimer")
"""Outputs that ``--timers-as-state`` leaves out (it hashes the armed timers instead)."""

STEPS_PER_RUN = 40
"""Random actions per seed before the world runs out."""


class _Recording(SimWorld):
    """A SimWorld that hashes every session call (as its driver's call hook)."""

    def __init__(self, seed: int, digest: Any, timers_as_state: bool = False) -> None:
        self.digest = digest
        self.calls = 0
        self.timers_as_state = timers_as_state
        tracer = Tracer()
        self._records = TraceCursor(tracer)  # each call's records
        super().__init__(seed, tracer=tracer, check_destinations=False,
                         cancelled_writes_land=True, hook=self)

    def record(self, peer_id: str, state_before: str, event: Input, started_ns: int,
               outputs: Sequence[Output]) -> None:
        records = self._records.take()
        self.calls += 1
        shown: object = list(outputs)
        if self.timers_as_state:
            timers = self.sessions[peer_id].view.timers
            shown = ([o for o in outputs if type(o).__name__ not in _TIMER_OUTPUTS],
                     sorted(timers.items(), key=repr))
        self.digest.update(repr((peer_id, self.now, event, shown, records,
                                 call_action(state_before, event, records))).encode())

    def discard(self) -> None:
        self._records.skip()


def _drive(world: _Recording, rng: random.Random) -> None:
    """A random mix of host calls, faults, time and network steps."""
    world.start()
    for _ in range(STEPS_PER_RUN):
        roll = rng.random()
        req = f"r{rng.randrange(3)}"
        try:
            if roll < 0.2:
                world.fetch("a", req, rng.sample(range(8, 16), rng.randrange(1, 3)))
            elif roll < 0.35:
                world.supply("b", req, rng.sample(range(8, 16), rng.randrange(1, 3)))
            elif roll < 0.45:
                world.lookup("a", req, rng.sample(range(8, 16), 2))
            elif roll < 0.5:
                world.finish(rng.choice("ab"), req)
            elif roll < 0.52:
                world.cut()
            elif roll < 0.6:
                world.advance()
            elif roll < 0.62:
                world.close(rng.choice("ab"))
            else:
                steps = world.enabled()
                if steps:
                    rng.choice(steps)[1]()
        except LocalProtocolError as exc:  # a refused host call is part of the story
            world.digest.update(repr(exc).encode())
        except AssertionError as exc:  # a safety check fired: recorded, the run ends
            world.digest.update(repr(exc).encode())
            return
    try:
        world.run(2000)
    except AssertionError as exc:
        world.digest.update(repr(exc).encode())


def run_digest(seeds: int, timers_as_state: bool = False) -> tuple[str, int]:
    """(hex digest, session calls) over seeds 0..seeds-1.

    With ``timers_as_state`` each call hashes the session's armed timers after it
    instead of the timer outputs: the same digest for a session that announces its
    timers as outputs and one that is asked for its deadline."""
    total = hashlib.sha256()
    calls = 0
    for seed in range(seeds):
        world = _Recording(seed, hashlib.sha256(), timers_as_state)
        _drive(world, random.Random(seed))
        total.update(world.digest.digest())
        calls += world.calls
    return total.hexdigest(), calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seeds", type=int, nargs="?", default=600)
    parser.add_argument("--timers-as-state", action="store_true",
                        help="hash each session's armed timers, not its timer outputs")
    args = parser.parse_args()
    digest, calls = run_digest(args.seeds, args.timers_as_state)
    print(f"{digest} {calls} calls over {args.seeds} seeds")


if __name__ == "__main__":
    main()
