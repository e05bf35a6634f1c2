"""The behaviour digest with some machine steps left out, for a change that only adds
declared transitions (new tracer records) and claims to change nothing else.

    PYTHONPATH=. .venv/bin/python -m tests.helpers.digest_without 600 \\
        session.recv_unknown_abort session.recv_expired_fetch

Runs :mod:`tests.helpers.run_digest` over the same seeds with a tracer that does not
record the named ``machine.trigger`` steps. Before the change no such step exists, so
this prints the plain digest; after it, the same digest means that inputs, outputs,
every other step and every spec action name are unchanged.
"""

from __future__ import annotations

import argparse

from p2pfsm.fsm import Tracer
from tests.helpers import run_digest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("seeds", type=int)
    parser.add_argument("without", nargs="+", help="machine.trigger steps not recorded")
    args = parser.parse_args()
    left_out = {tuple(name.split(".", 1)) for name in args.without}

    class _Without(Tracer):
        def record(self, machine: str, instance: str, trigger: str, source: str,
                   dest: str) -> None:
            if (machine, trigger) not in left_out:
                Tracer.record(self, machine, instance, trigger, source, dest)

    run_digest.Tracer = _Without  # type: ignore[misc]  # what _Recording constructs
    digest, calls = run_digest.run_digest(args.seeds)
    print(f"{digest} {calls} calls over {args.seeds} seeds, without {sorted(args.without)}")


if __name__ == "__main__":
    main()
