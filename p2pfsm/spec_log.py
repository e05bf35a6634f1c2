"""A node's trace log: each ``Session.handle`` call that is a spec action, one JSON line.

The node knows nothing of the spec: it calls a :class:`CallHook` around each
``Session.handle`` call. :class:`CallLog` is the hook behind ``NodeConfig.trace``: it
names the call with :func:`p2pfsm.spec_calls.call_action` (the mapping trace validation
uses for simulated runs) and writes it; :func:`p2pfsm.tools.verify.traces.merge_logs` merges
two nodes' logs into one trace for TLC.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import IO, Protocol

from p2pfsm.fsm import Tracer, TraceRecord
from p2pfsm.session import HostAnswerLookup, HostFetch, HostSupply, Input, Output
from p2pfsm.spec_calls import call_action, steps_of

_ROUND_MACHINES = ("client_round", "server_round", "client_lookup", "server_lookup")


class CallHook(Protocol):
    """Told of every ``Session.handle`` call a node makes."""

    tracer: Tracer
    """Attached to every session of the node; the hook reads and clears its records."""

    def record(self, peer_id: str, state_before: str, event: Input, started_ns: int,
               outputs: Sequence[Output]) -> None:
        """A call returned; ``tracer.records`` holds what it fired."""

    def discard(self) -> None:
        """A call raised (it changed nothing); forget what it recorded."""

    def close(self) -> None:
        """The node is closing."""


def _job_of(event: Input) -> int | None:
    if isinstance(event, HostFetch | HostSupply | HostAnswerLookup):
        return event.job_id
    return None


def _request_round(records: list[TraceRecord]) -> tuple[str | None, int | None]:
    """The request and round of the first round machine a call moved."""
    for r in records:
        if r.machine in _ROUND_MACHINES:
            rid, _, rnd = r.instance.rpartition("/")
            return (rid or None), (int(rnd) if rnd.isdigit() else None)
    return None, None


class CallLog:
    """The trace log: one JSON line per ``Session.handle`` call that is a spec action.

    Each line is ``{"t", "wall", "node", "peer", "action", "steps", "request", "round",
    "job"}``: ``time.monotonic_ns()`` when the call started (the merge key), the
    wall-clock time (``time.time_ns()``), our id, the session's peer, the action
    (:func:`~p2pfsm.spec_calls.call_action`), the (machine, trigger, source, dest) steps
    the call fired, and the kv_request_id / round_seq / job id it concerned (null when
    none). Calls the spec takes no step for are left out (a stale timer, a registration
    result or transport loss after the session ended, a close of a closed session, an
    answer to an ended lookup: each fires no machine). The file is line-buffered, so a
    killed node leaves every finished line.
    """

    def __init__(self, path: str, local_id: str) -> None:
        self.tracer = Tracer()
        self.local_id = local_id
        self._file: IO[str] = open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115

    def record(self, peer_id: str, state_before: str, event: Input, started_ns: int,
               outputs: Sequence[Output]) -> None:
        records = list(self.tracer.records)
        self.tracer.records.clear()
        action = call_action(state_before, event, records)
        if action is None:
            return
        request, rnd = _request_round(records)
        self._file.write(json.dumps({
            "t": started_ns, "wall": time.time_ns(), "node": self.local_id, "peer": peer_id,
            "action": action, "steps": sorted(steps_of(records)),
            "request": request, "round": rnd, "job": _job_of(event),
        }) + "\n")

    def discard(self) -> None:
        self.tracer.records.clear()

    def close(self) -> None:
        self._file.close()
