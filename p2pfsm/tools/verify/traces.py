"""Trace validation: runs of the real sessions, explained by the TLA+ spec (``TraceP2P.tla``).

A :class:`TracingWorld` is a :class:`~p2pfsm.sim.world.SimWorld` that logs every
``Session.handle`` call as a :class:`TraceEvent`: the spec action the call is
(:func:`p2pfsm.spec_calls.call_action`, the mapping a Node's trace log uses too), the
peer, and the machine steps the :class:`~p2pfsm.fsm.Tracer` recorded during that call.
:func:`drive_trace` runs one with a workload inside the spec's trace bounds (one request,
one key, at most one fault) whose every choice comes from a chooser:
:func:`random_trace` feeds it a seeded ``random.Random``, :func:`hypothesis_traces`
hypothesis draws. :func:`merge_logs` turns the trace logs of two real nodes
(``NodeConfig.trace``) into one trace. :func:`validate` writes every trace into a
generated ``TraceData.tla`` and runs TLC once: each trace some behaviour explains is
accepted.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from p2pfsm.fsm import DEFAULT_PROFILE, TraceCursor, Tracer
from p2pfsm.session import Input, Output, PeerGone
from p2pfsm.session.machine import UNSTARTED_STATES
from p2pfsm.sim.world import SimWorld
from p2pfsm.spec_calls import Step, call_action, steps_of
from p2pfsm.tools.verify import tlc
from p2pfsm.tools.verify.configs import spec_dir

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One Session.handle call: the spec action, the peer, the machine steps it took."""

    action: str
    peer: str
    steps: frozenset[Step]


class TracingWorld(SimWorld):
    """A SimWorld that logs each Session.handle call as a :class:`TraceEvent` (as its
    driver's call hook)."""

    def __init__(self, seed: int = 0, **kwargs: object) -> None:
        self.trace: list[TraceEvent] = []
        tracer = Tracer()
        self._records = TraceCursor(tracer)  # each call's records
        super().__init__(seed, tracer=tracer, hook=self, **kwargs)  # type: ignore[arg-type]

    def record(self, peer_id: str, state_before: str, event: Input, started_ns: int,
               outputs: Sequence[Output]) -> None:
        records = self._records.take()
        action = call_action(state_before, event, records)
        if action is not None:
            self.trace.append(TraceEvent(action, peer_id, steps_of(records)))

    def discard(self) -> None:
        self._records.skip()


class Chooser(Protocol):
    """Picks one of the options (a workload's every choice goes through one)."""

    def __call__(self, options: Sequence[_T], /) -> _T: ...


def random_trace(seed: int, steps: int = 40, profile: str = DEFAULT_PROFILE) -> list[TraceEvent]:
    """A seeded random run of two sessions within TraceP2P's bounds (see drive_trace)."""
    return drive_trace(random.Random(seed).choice, seed, steps, profile)


def drive_trace(choose: Chooser, seed: int = 0, steps: int = 40,
                profile: str = DEFAULT_PROFILE) -> list[TraceEvent]:
    """A run of two sessions within TraceP2P's bounds, every choice made by ``choose``.

    One request ``r1`` and one key (block 0, held by both nodes); each node fetches,
    looks up, supplies and finishes at most twice; at most one fault (a lost frame, a
    cut, a failed write or a close); frames are delivered in order. Both sessions run
    ``profile``; a session that is over and holds destinations may be told that the
    peer's writes are over (PeerGone).
    """
    w = TracingWorld(seed, held={"a": (0,), "b": (0,)}, num_blocks=8,
                     configs={n: {"profile": profile} for n in ("a", "b")})
    w.start()
    budget = {(n, op): 2 for n in w.NODES for op in ("fetch", "lookup", "supply", "finish")}
    fault = choose([None, None, "drop", "cut", "wfail", "close"])
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
            if w.sessions[n].state not in UNSTARTED_STATES:
                moves += [(op, (n,)) for (m, op), left in budget.items() if m == n and left]
            # The peer's writes are over: what a bounded hold assumes of its clock (the
            # spec's WritesOver), and what the data plane proves (PeerGone).
            peer = w.other(n)
            over = (not w.sessions[peer].alive
                    and not any(src == peer for src, _x in w.writes))
            for timer in w.timers[n]:
                if timer[0] != "handshake" and (timer[0] != "hold" or over):
                    moves.append(("timer", (n, repr(timer))))
            if w.sessions[n].view.held and over:
                moves.append(("gone", (n,)))
        if fault in ("cut", "close"):
            moves.append((fault, (choose(w.NODES),)))
        if not moves:
            break
        kind, args = choose(moves)
        if kind in ("drop", "cut", "fail", "close"):
            fault = None
        _apply(w, kind, args, budget)
    return w.trace


def hypothesis_traces(examples: int = 25, steps: int = 40) -> list[list[TraceEvent]]:
    """The distinct traces of ``examples`` derandomized hypothesis runs of drive_trace.

    Needs hypothesis (the ``test`` extra).
    """
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    found: dict[tuple[TraceEvent, ...], None] = {}

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data: st.DataObject) -> None:
        def choose(options: Sequence[_T]) -> _T:
            return data.draw(st.sampled_from(options))

        found.setdefault(tuple(drive_trace(choose, 0, steps)), None)

    run()
    return [list(trace) for trace in found]


LOG_FIELDS = frozenset({"t", "node", "peer", "action", "steps"})
"""The fields every line of a trace log has."""


def load_log(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of one node's trace log (``NodeConfig.trace``).

    Raises:
        ValueError: a line is not a JSON object with :data:`LOG_FIELDS` (a log cut off
            mid-line or garbled), naming the file and line.
    """
    lines: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg}): the log is "
                                 "truncated or garbled") from exc
            if not isinstance(line, dict) or not line.keys() >= LOG_FIELDS:
                raise ValueError(f"{path}:{number}: a trace line needs the fields "
                                 f"{sorted(LOG_FIELDS)}")
            lines.append(line)
    return lines


def merge_logs(client: Path, server: Path) -> list[TraceEvent]:
    """One trace of a real run: the client's calls as peer ``a``, the server's calls for
    that client as ``b``, ordered by the monotonic time each call started.

    CLOCK_MONOTONIC is one clock for all processes of a host, and a frame's receive
    call starts after the call that sent it, so the order is a causal one.

    Raises:
        ValueError: the client log is not one node's calls with one peer.
    """
    mine = load_log(client)
    nodes = {(line["node"], line["peer"]) for line in mine}
    if len(nodes) != 1:
        raise ValueError(f"{client}: expected one node with one peer, got {sorted(nodes)}")
    ((client_id, _server_id),) = nodes
    theirs = [line for line in load_log(server) if line["peer"] == client_id]
    tagged = [(line["t"], "a", line) for line in mine] + [(line["t"], "b", line)
                                                          for line in theirs]
    tagged.sort(key=lambda x: (x[0], x[1]))
    return [TraceEvent(line["action"], peer,
                       frozenset((m, trig, src, dst) for m, trig, src, dst in line["steps"]))
            for _, peer, line in tagged]


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
    elif kind == "gone":
        w.feed(args[0], PeerGone("data_plane"))
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
            f"\\* Generated by p2pfsm.tools.verify.traces: {len(traces)} recorded traces.\n"
            f"TraceLog == <<\n{body}\n>>\n====\n")


TRACE_CFG = """\\* Generated by p2pfsm.tools.verify.traces: validate every trace of TraceData.
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
    BugSilentLoss = FALSE
    BugNoImplicitAck = FALSE
    BugReleaseEarly = FALSE
    Profile = "{profile}"
    TrackFired = TRUE
    TrackAct = TRUE
INVARIANT FiredDeclared
"""
"""The trace run's config (``{profile}``: the sessions' profile, the spec's Profile)."""

_SPEC_FILES = ("P2P.tla", "Channel.tla", "MCP2P.tla", "TraceP2P.tla", "MachineTables.tla")
# In a dot node label (escaped): ...\n/\\ t = 3\n... ; also as the label's first line.
_T_LABEL = re.compile(r'(?:\[label="|\\n)/\\\\ t = (\d+)')
_L_LABEL = re.compile(r'(?:\[label="|\\n)/\\\\ l = (\d+)')


@dataclass(frozen=True, slots=True)
class TraceValidation:
    """Which traces some behaviour of the spec explains."""

    accepted: frozenset[int]
    rejected: frozenset[int]
    result: tlc.TlcResult
    explained: dict[int, int]
    """Trace number -> how many of its first calls some behaviour explains."""

    @property
    def complete(self) -> bool:
        """TraceComplete of TraceP2P.tla: every line of every trace was consumed."""
        return not self.rejected

    def incomplete(self, traces: Sequence[Sequence[TraceEvent]]) -> list[str]:
        """Per rejected trace: how far it was consumed and the first line left over."""
        return [f"trace {i}: {self.explained[i]}/{len(traces[i - 1])} lines consumed; "
                f"no behaviour takes line {self.explained[i] + 1}: "
                f"{traces[i - 1][self.explained[i]]}" for i in sorted(self.rejected)]


def validate(traces: Sequence[Sequence[TraceEvent]], *, workers: int | None = None,
             timeout: float | None = 600.0, source: Path | None = None,
             profile: str = DEFAULT_PROFILE) -> TraceValidation:
    """Check every trace in one TLC run (traces are numbered from 1).

    TLC explores TraceP2P and dumps the reachable graph; trace i is accepted when every
    line of it is consumed: some reachable state has ``t = i`` and
    ``l = Len(TraceLog[i])`` (``Consumed(i)``; TraceComplete holds when that is so for
    every trace). A trace with a garbled or a missing line is rejected, and
    :attr:`TraceValidation.explained` says how far it got. Every run also checks the
    invariant ``FiredDeclared``: each machine step is a row of the generated
    ``MachineTables.tla`` (``source``: the spec directory, default ``tla/``).

    Raises:
        tlc.TlcNotFound: java or the jar is missing.
        RuntimeError: TLC failed.
    """
    source = source or spec_dir()
    with tempfile.TemporaryDirectory(prefix="p2pfsm-trace-") as tmp:
        work = Path(tmp)
        for name in _SPEC_FILES:
            shutil.copy(source / name, work / name)
        (work / "TraceData.tla").write_text(to_tla(traces))
        (work / "TraceP2P.cfg").write_text(TRACE_CFG.replace("{profile}", profile))
        dot = work / "trace.dot"
        result = tlc.run(work, "TraceP2P", "TraceP2P.cfg", workers=workers, timeout=timeout,
                         dump_dot=dot)
        if not result.ok or result.dump is None:
            raise RuntimeError(f"trace validation failed to run: {result.outcome} "
                               f"{result.violated} {result.errors}")
        explained = dict.fromkeys(range(1, len(traces) + 1), 0)
        with dot.open(encoding="utf-8") as fh:
            for line in fh:
                t = _T_LABEL.search(line)
                n = _L_LABEL.search(line)
                if t is not None and n is not None:
                    explained[int(t[1])] = max(explained[int(t[1])], int(n[1]))
    accepted = frozenset(i for i, n in explained.items() if n == len(traces[i - 1]))
    return TraceValidation(accepted, frozenset(explained) - accepted, result, explained)
