"""The compiled layers on their own: per-call CPU of the codec and the behaviour digest.

``python -m p2pfsm.bench.native_ab [--repeat N]`` prints, for the build this process runs
(``p2pfsm.BUILD``), the thread-CPU microseconds per call of ``decode`` and ``encode`` of a
4-key fetch frame and of a ``transfer_done`` frame (the frames of one fetch) and of
``CompiledMachine.fire`` (one guard, one action, one ``fsm_data`` attribute), the median
of N samples. Run it once per tree, alternating, to compare the pure and the compiled
build (``docs/explanation/performance.md``, "Compiled build"); the digest's calls per CPU second
come from ``tests.helpers.run_digest`` the same way.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from p2pfsm.fsm import MachineSpec

__all__ = ["main"]


def _per_call_us(fn: Callable[[], object], number: int, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.thread_time()
        for _ in range(number):
            fn()
        samples.append((time.thread_time() - t0) / number * 1e6)
    return statistics.median(samples)


class _Toy:
    """A two-state machine instance: ``go`` (guarded, one action) and ``back``."""

    fsm_data = ("count",)

    def __init__(self, spec: MachineSpec) -> None:
        self.fsm_state = spec.initial
        self.count = 0

    @property
    def fsm_label(self) -> str:
        return "toy"

    @property
    def fsm_tracer(self) -> None:
        return None

    def allowed(self, _event: object) -> bool:
        return True

    def bump(self, _event: object) -> None:
        self.count += 1


def _toy_fire() -> Callable[[], object]:
    from p2pfsm.fsm import CompiledMachine, MachineSpec, TransitionSpec

    spec = MachineSpec("toy", "", {"idle": "", "busy": ""}, "idle", frozenset(), (
        TransitionSpec("go", ("idle",), "busy", ("allowed",), (), ("bump",), ""),
        TransitionSpec("back", ("busy",), "idle", (), (), (), "")))
    machine, obj = CompiledMachine(spec, _Toy), _Toy(spec)

    def go_and_back() -> None:
        machine.fire(obj, "go")
        machine.fire(obj, "back")

    return go_and_back


def main(argv: Sequence[str] | None = None) -> int:
    import p2pfsm
    from p2pfsm.protocol import Fetch, TransferDone, decode, encode

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=20_000)
    args = ap.parse_args(argv)
    fetch = Fetch("req-0001", tuple(bytes([i]) * 32 for i in range(4)), (0, 1, 2, 3), 7)
    done = TransferDone("req-0001", True, 7)
    fetch_frame, done_frame = encode(fetch), encode(done)
    rows = {
        "decode fetch (4 keys)": lambda: decode(fetch_frame),
        "encode fetch (4 keys)": lambda: encode(fetch),
        "decode transfer_done": lambda: decode(done_frame),
        "encode transfer_done": lambda: encode(done),
        "fire go + back": _toy_fire(),
    }
    cells = [f"{name} {_per_call_us(fn, args.number, args.repeat):.2f} us"
             for name, fn in rows.items()]
    print(f"{p2pfsm.BUILD}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
