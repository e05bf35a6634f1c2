"""A two-peer transfer in the simulated world: PD fetch, demand, lookup->fetch, abort.

Used by ``p2pfsm demo`` when no real data plane is wanted, and by the tests. Every
load's bytes are verified by the simulated host.
"""

from __future__ import annotations

from p2pfsm.errors import ConfigError
from p2pfsm.fsm import Tracer
from p2pfsm.session import Timeouts
from p2pfsm.sim.world import SimWorld


def run_demo(seed: int = 1, blocks: int = 16) -> dict[str, object]:
    """Run the flows; return a summary with ``ok``, counts and human ``lines``."""
    if not 1 <= blocks <= 64:
        raise ConfigError(f"--blocks: expected 1..64, got {blocks}")
    tracer = Tracer()
    held = {"a": range(0, 0), "b": range(0, blocks + 4)}
    world = SimWorld(seed, block_len=4096, num_blocks=4 * blocks + 16, held=held,
                     timeouts=Timeouts(load=3.0, abort_ack=1.0), tracer=tracer)
    world.start()
    world.run()
    lines = [f"handshake: a={world.sessions['a'].state} b={world.sessions['b'].state}"]
    half = blocks // 2
    pd = world.fetch("a", "pd-1", range(blocks))
    world.supply("b", "pd-1", range(half))          # some blocks now...
    world.run(timers=False)
    world.supply("b", "pd-1", range(half, blocks))  # ...the rest on demand
    world.run(timers=False)
    world.lookup("a", "sym-1", [blocks, blocks + 1, 10_000])
    world.run(timers=False)
    sym = world.fetch("a", "sym-1", [blocks, blocks + 1])
    world.run(timers=False)
    world.finish("a", "sym-1")
    world.run(timers=False)
    aborted = world.fetch("a", "abort-1", [10_001])  # never stored: load timeout -> abort
    world.run()
    a = world.hosts["a"]

    def outcome(job: int | None) -> str:
        res = a.load_results.get(job) if job is not None else None
        if res is None:
            return "no result"
        return "ok" if res.success else "failed"

    ok = (outcome(pd) == "ok" and outcome(sym) == "ok" and outcome(aborted) == "failed"
          and a.quiet and world.hosts["b"].quiet)
    moved = (blocks + 2) * 4096
    lines += [
        f"pd fetch of {blocks} blocks (half supplied late): {outcome(pd)}",
        f"lookup 3 keys -> 2 hits -> fetch: {outcome(sym)}",
        f"fetch of a block never stored -> load timeout -> abort -> abort_ack: {outcome(aborted)}",
        f"{moved} bytes verified, {len(tracer.records)} transitions fired, "
        f"virtual time {world.now:.1f} s",
        "result: " + ("OK" if ok else "FAILED"),
    ]
    return {"ok": ok, "bytes": moved, "transitions": len(tracer.records),
            "virtual_seconds": world.now, "lines": lines}
