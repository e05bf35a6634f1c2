"""Trace validation: runs of the real sessions, explained by the TLA+ spec (``TraceP2P.tla``).

A :class:`TracingWorld` is a :class:`~p2pfsm.executor.sim.SimWorld` that logs every
``Session.handle`` call as a :class:`TraceEvent`: the spec action the input is (derived
as :mod:`p2pfsm.verify.names` derives every action name), the peer, and the machine
steps the :class:`~p2pfsm.fsm.Tracer` recorded during that call. :func:`random_trace`
drives one with a seeded random workload inside the spec's trace bounds (one request,
one key, at most one fault). :func:`validate` writes every trace into a generated
``TraceData.tla`` and runs TLC once: each trace some behaviour explains is accepted.
"""

from __future__ import annotations

import random
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from p2pfsm.executor.sim import SimWorld
from p2pfsm.fsm import Tracer
from p2pfsm.protocol import Fetch, decode
from p2pfsm.session import (
    FrameReceived,
    HostAnswerLookup,
    HostClose,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    Input,
    Output,
    RegistrationFinished,
    TimerFired,
    TransportLost,
    WriteFinished,
)
from p2pfsm.verify import tlc
from p2pfsm.verify.configs import spec_dir
from p2pfsm.verify.names import action_name

Step = tuple[str, str, str, str]

_LIVE = frozenset({"connecting", "registering", "registering_acked", "awaiting_ack", "ready"})
_FRAME_ACTIONS = {
    "connect": ("session", "recv_connect"),
    "connect_ack": ("session", "recv_connect_ack"),
    "disconnect": ("session", "recv_disconnect"),
    "lookup": ("server_lookup", "recv_lookup"),
    "abort_fetch": ("server_round", "recv_abort_fetch"),
    "transfer_done": ("client_round", "recv_transfer_done"),
    "abort_ack": ("client_round", "recv_abort_ack"),
    "lookup_resp": ("client_lookup", "recv_lookup_resp"),
}
_TIMER_ACTIONS = {
    "handshake": ("session", "timer_handshake"),
    "load": ("client_round", "timer_load"),
    "abort_ack": ("client_round", "timer_abort_ack"),
    "lookup": ("client_lookup", "timer_lookup"),
    "store": ("server_round", "timer_store"),
    "demand": ("server_round", "timer_demand"),
    "lookup_pending": ("server_lookup", "timer_lookup_pending"),
}
_HOST_ACTIONS: dict[type, tuple[str, str]] = {
    HostStart: ("session", "host_start"),
    HostClose: ("session", "host_close"),
    HostFetch: ("client_round", "host_fetch"),
    HostLookup: ("client_lookup", "host_lookup"),
    HostSupply: ("server_round", "host_supply"),
    HostAnswerLookup: ("server_lookup", "host_answer"),
    HostFinish: ("client_round", "host_finish"),
}


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One Session.handle call: the spec action, the peer, the machine steps it took."""

    action: str
    peer: str
    steps: frozenset[Step]


def action_of(state: str, event: Input) -> str | None:
    """The spec action an input is, given the session state before it (None: no action)."""
    if isinstance(event, FrameReceived):
        if state not in _LIVE:
            return "NetworkDiscard"
        msg = decode(event.frame)
        if isinstance(msg, Fetch):
            trigger = "recv_terminal_fetch" if msg.is_terminal else "recv_fetch"
            return action_name("server_round", trigger)
        return action_name(*_FRAME_ACTIONS[msg.TYPE])
    if isinstance(event, TimerFired):
        return action_name(*_TIMER_ACTIONS[str(event.timer[0])])
    if isinstance(event, WriteFinished):
        return action_name("server_round", "write_done" if event.ok else "write_failed")
    if isinstance(event, RegistrationFinished):
        if state not in ("registering", "registering_acked"):
            return None  # the session ended meanwhile: the result is ignored
        return action_name("session", "registration_done" if event.ok
                           else "registration_failed")
    if isinstance(event, TransportLost):
        return action_name("session", "transport_lost") if state in _LIVE else None
    if isinstance(event, HostClose) and state == "closed":
        return None
    machine_trigger = _HOST_ACTIONS.get(type(event))
    return None if machine_trigger is None else action_name(*machine_trigger)


class TracingWorld(SimWorld):
    """A SimWorld that logs each Session.handle call as a :class:`TraceEvent`."""

    def __init__(self, seed: int = 0, **kwargs: object) -> None:
        self.trace: list[TraceEvent] = []
        tracer = Tracer()
        super().__init__(seed, tracer=tracer, **kwargs)  # type: ignore[arg-type]
        self._tracer = tracer

    def feed(self, node: str, event: Input) -> list[Output]:
        before = len(self._tracer.records)
        state = self.sessions[node].state
        outputs = super().feed(node, event)
        records = self._tracer.records[before:]
        # A timer that fires nothing was stale (disarmed or re-armed): no spec step.
        stale = isinstance(event, TimerFired) and not records
        action = None if stale else action_of(state, event)
        if isinstance(event, HostAnswerLookup) and not records:
            action = None  # the lookup had ended: the host's pins go back, no machine moves
        if action is not None:
            steps = frozenset((r.machine, r.trigger, r.source, r.dest) for r in records)
            self.trace.append(TraceEvent(action, node, steps))
        return outputs


def random_trace(seed: int, steps: int = 40) -> list[TraceEvent]:
    """A seeded random run of two sessions within TraceP2P's bounds.

    One request ``r1`` and one key (block 0, held by both nodes); each node fetches,
    looks up, supplies and finishes at most twice; at most one fault (a lost frame, a
    cut, a failed write or a close); frames are delivered in order.
    """
    rng = random.Random(seed)
    w = TracingWorld(seed, held={"a": (0,), "b": (0,)}, num_blocks=8)
    w.start()
    budget = {(n, op): 2 for n in w.NODES for op in ("fetch", "lookup", "supply", "finish")}
    fault = rng.choice([None, None, "drop", "cut", "wfail", "close"])
    for _ in range(steps):
        moves: list[tuple[str, tuple[str, ...]]] = []
        for (src, _dst), chan in w.channels.items():
            if chan:
                moves += [("deliver", (src,))] * 4
                if fault == "drop":
                    moves.append(("drop", (src,)))
        moves += [("register", (n,)) for n in sorted(w.registrations)] * 3
        for (src, xfer) in sorted(w.writes):
            moves += [("complete", (src, str(xfer)))] * 2
            if fault == "wfail":
                moves.append(("fail", (src, str(xfer))))
        for n in w.NODES:
            if w.sessions[n].state != "idle":
                moves += [(op, (n,)) for (m, op), left in budget.items() if m == n and left]
            for timer in w.timers[n]:
                if timer[0] != "handshake":
                    moves.append(("timer", (n, repr(timer))))
        if fault in ("cut", "close"):
            moves.append((fault, (rng.choice(w.NODES),)))
        if not moves:
            break
        kind, args = rng.choice(moves)
        if kind in ("drop", "cut", "fail", "close"):
            fault = None
        _apply(w, kind, args, budget)
    return w.trace


def _apply(w: TracingWorld, kind: str, args: tuple[str, ...],
           budget: dict[tuple[str, str], int]) -> None:
    if kind == "deliver":
        w.deliver(args[0])
    elif kind == "drop":
        w.drop(args[0])
    elif kind == "register":
        w.register(args[0])
    elif kind in ("complete", "fail"):
        src, xfer = args[0], int(args[1])
        if kind == "complete":
            w.land(src, xfer)
        w.complete(src, xfer, fail=kind == "fail")
    elif kind == "timer":
        node = args[0]
        timer = next(t for t in w.timers[node] if repr(t) == args[1])
        w.fire_timer(node, timer)
    elif kind == "cut":
        w.cut()
    elif kind == "close":
        w.close(args[0])
    else:
        node = args[0]
        budget[(node, kind)] -= 1
        if kind == "fetch":
            w.fetch(node, "r1", [0])
        elif kind == "lookup":
            w.lookup(node, "r1", [0])
        elif kind == "supply":
            w.supply(node, "r1", [0])
        else:
            w.finish(node, "r1")


def _tla_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_tla(traces: Sequence[Sequence[TraceEvent]], module: str = "TraceData") -> str:
    """A TLA+ module defining ``TraceLog`` (a sequence of traces of events)."""
    def event(e: TraceEvent) -> str:
        steps = ", ".join(
            "<<" + ", ".join(_tla_string(x) for x in step) + ">>" for step in sorted(e.steps))
        return f"<<{_tla_string(e.action)}, {_tla_string(e.peer)}, {{{steps}}}>>"

    body = ",\n".join(
        "    << " + ",\n       ".join(event(e) for e in trace) + " >>" if trace else "    <<>>"
        for trace in traces
    )
    return (f"---- MODULE {module} ----\n"
            f"\\* Generated by p2pfsm.verify.traces: {len(traces)} recorded traces.\n"
            f"TraceLog == <<\n{body}\n>>\n====\n")


TRACE_CFG = """\\* Generated by p2pfsm.verify.traces: validate every trace of TraceData.
INIT TraceInit
NEXT TraceNext
CONSTANTS
    Peers = {"a", "b"}
    Reqs = {"r1"}
    MaxRounds = 4
    MaxAborts = 8
    MaxFaults = 1
    LoadPeers = {"a", "b"}
    SupplyPeers = {"a", "b"}
    DupTypes = {}
    Scenarios <- TraceScenarios
    BugP1 = FALSE
    BugP3 = FALSE
    BugP4 = FALSE
    BugP5 = FALSE
    TrackFired = TRUE
    TrackAct = TRUE
"""

_SPEC_FILES = ("P2P.tla", "Channel.tla", "MCP2P.tla", "TraceP2P.tla")
# In a dot node label (escaped): ...\n/\\ t = 3\n... ; also as the label's first line.
_T_LABEL = re.compile(r'(?:\[label="|\\n)/\\\\ t = (\d+)')
_L_LABEL = re.compile(r'(?:\[label="|\\n)/\\\\ l = (\d+)')


@dataclass(frozen=True, slots=True)
class TraceValidation:
    """Which traces some behaviour of the spec explains."""

    accepted: frozenset[int]
    rejected: frozenset[int]
    result: tlc.TlcResult


def validate(traces: Sequence[Sequence[TraceEvent]], *, workers: int | None = None,
             timeout: float | None = 600.0) -> TraceValidation:
    """Check every trace in one TLC run (traces are numbered from 1).

    TLC explores TraceP2P and dumps the reachable graph; trace t is explained when a
    reachable state has ``t = i`` and ``l = Len(TraceLog[i])`` (the states the witness
    invariant ``NotExplained`` would report, read without printing their traces).

    Raises:
        tlc.TlcNotFound: java or the jar is missing.
        RuntimeError: TLC failed.
    """
    source = spec_dir()
    with tempfile.TemporaryDirectory(prefix="p2pfsm-trace-") as tmp:
        work = Path(tmp)
        for name in _SPEC_FILES:
            shutil.copy(source / name, work / name)
        (work / "TraceData.tla").write_text(to_tla(traces))
        (work / "TraceP2P.cfg").write_text(TRACE_CFG)
        dot = work / "trace.dot"
        result = tlc.run(work, "TraceP2P", "TraceP2P.cfg", workers=workers, timeout=timeout,
                         dump_dot=dot)
        if not result.ok or result.dump is None:
            raise RuntimeError(f"trace validation failed to run: {result.outcome} "
                               f"{result.violated} {result.errors}")
        reached: set[int] = set()
        with dot.open(encoding="utf-8") as fh:
            for line in fh:
                t = _T_LABEL.search(line)
                n = _L_LABEL.search(line)
                if t is not None and n is not None and int(n[1]) == len(traces[int(t[1]) - 1]):
                    reached.add(int(t[1]))
    accepted = frozenset(reached)
    return TraceValidation(accepted, frozenset(range(1, len(traces) + 1)) - accepted, result)
