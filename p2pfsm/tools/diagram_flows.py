"""Sequence diagrams of the protocol's flows, recorded from the simulated world.

Each flow of :data:`FLOWS` is a short, deterministic script of host calls on a
:class:`~p2pfsm.sim.world.SimWorld` (frames delivered in order, timers fired by the
simulated clock). A :class:`RecordingWorld` notes every host call, every frame a
session sends, every machine step the sessions take (the :class:`~p2pfsm.fsm.Tracer`
records of that ``Session.handle`` call) and every result reported to a host;
:func:`to_sequence` draws them as a mermaid ``sequenceDiagram``. Nothing is drawn by
hand: change a machine in ``models/`` or the session code and the diagrams change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from p2pfsm.fsm import TraceCursor, Tracer
from p2pfsm.session import Input, Output
from p2pfsm.session.inputs import FrameReceived, TimerFired
from p2pfsm.session.outputs import SendFrame
from p2pfsm.sim.world import SimWorld

HOSTS = {"a": "host_a", "b": "host_b"}
"""Participant of each node's host and executor (the node's session is the node name)."""


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _frame(message: object) -> str:
    """``fetch r1/0 keys=1`` from a protocol message."""
    kind = _snake(type(message).__name__)
    parts = [kind]
    req = getattr(message, "kv_request_id", None)
    seq = getattr(message, "round_seq", None)
    if req is not None:
        parts.append(f"{req}/{seq}" if seq is not None else str(req))
    keys = getattr(message, "keys", None)
    if keys is not None:
        parts.append(f"keys={len(keys)}")
    if (ok := getattr(message, "success", None)) is not None:
        parts.append(f"success={ok}")
    if (hits := getattr(message, "hits", None)) is not None:
        parts.append(f"hits={sum(hits)}")
    return " ".join(parts)


@dataclass(slots=True)
class Event:
    """One line of a sequence diagram."""

    kind: str  # "call", "frame", "step", "out"
    node: str
    text: str


@dataclass(slots=True)
class _Log:
    events: list[Event] = field(default_factory=list)


class RecordingWorld(SimWorld):
    """A SimWorld that records host calls, frames, machine steps and host results."""

    def __init__(self) -> None:
        tracer = Tracer()
        self._records = TraceCursor(tracer)  # each call's records
        self.events: list[Event] = []
        super().__init__(0, tracer=tracer, held={"a": (), "b": (0, 1)}, num_blocks=8,
                         hook=self)

    def record(self, peer_id: str, state_before: str, event: Input, started_ns: int,
               outputs: Sequence[Output]) -> None:
        """The driver's call hook: the call, its machine steps, its frames and results."""
        if not isinstance(event, FrameReceived):
            self.events.append(Event("call", peer_id, _input(event)))
        for r in self._records.take():
            if r.source != r.dest:
                self.events.append(Event("step", peer_id, f"{r.machine}: {r.source} → {r.dest}"))
        for out in outputs:
            if isinstance(out, SendFrame):
                self.events.append(Event("frame", peer_id, _frame(out.message)))
            elif (text := _output(out)) is not None:
                self.events.append(Event("out", peer_id, text))

    def discard(self) -> None:
        self._records.skip()


def _input(event: Input) -> str:
    name = _snake(type(event).__name__)
    if isinstance(event, TimerFired):
        return f"timer {event.timer[0]} fires"
    req = getattr(event, "kv_request_id", None)
    return f"{name} {req}" if req is not None else name


_REPORTED = ("LoadResult", "StoreResult", "LookupResult", "SessionDead", "LookupRequest",
             "StartWrite", "StartRegistration", "FetchArrived")


def _output(out: Output) -> str | None:
    name = type(out).__name__
    if name not in _REPORTED:
        return None
    text = _snake(name)
    for attr in ("success", "ok", "hits", "reason"):
        value = getattr(out, attr, None)
        if value is not None and not isinstance(value, (tuple, list, dict)):
            return f"{text} {attr}={value}"
    return text


def _handshake(w: RecordingWorld) -> None:
    w.start()
    w.stabilize()


def _ready(w: RecordingWorld) -> None:
    w.start()
    w.stabilize()
    w.events.clear()


def _pd(w: RecordingWorld) -> None:
    _ready(w)
    w.supply("b", "r1", [0])
    w.fetch("a", "r1", [0])
    w.stabilize()


def _demand(w: RecordingWorld) -> None:
    _ready(w)
    w.fetch("a", "r1", [0])
    w.stabilize()
    w.supply("b", "r1", [0])
    w.stabilize()


def _lookup_fetch(w: RecordingWorld) -> None:
    _ready(w)
    w.lookup("a", "r1", [0, 1])
    w.stabilize()
    w.fetch("a", "r1", [0, 1])
    w.stabilize()


def _abort(w: RecordingWorld) -> None:
    _ready(w)
    w.fetch("a", "r1", [0])
    w.stabilize()
    for _ in range(MAX_ABORT_TIMERS):  # the simulated clock: next deadline first
        if not w.advance():
            break
        w.stabilize()
        if any(e.kind == "frame" and e.text.startswith("abort_ack") for e in w.events):
            break


def _finish(w: RecordingWorld) -> None:
    _ready(w)
    w.fetch("a", "r1", [0])
    w.stabilize()
    w.finish("a", "r1")
    w.stabilize()
    w.finish("b", "r1")
    w.close("a")
    w.stabilize()


FLOWS: dict[str, tuple[str, Callable[[RecordingWorld], None]]] = {
    "handshake": ("Both hosts start their sessions: connect, registration, connect_ack.",
                  _handshake),
    "pd": ("Prefill-decode: the producer supplies first, then the consumer fetches.", _pd),
    "demand": ("The fetch arrives before the supply: the producer waits for its host.",
               _demand),
    "lookup_fetch": ("A lookup pins the hits, the fetch of the same request is served from "
                     "the pins.", _lookup_fetch),
    "abort": ("Nobody supplies: the consumer's load deadline aborts the round, the "
              "producer acknowledges once no write can land.", _abort),
    "finish": ("The consumer's host finishes the request while it loads (the round "
               "aborts), the producer's host finishes too, then one host closes its "
               "session.", _finish),
}
"""Flow name -> (what it shows, the script that drives the world)."""

MAX_ABORT_TIMERS = 20


def record(name: str) -> list[Event]:
    """Run flow ``name`` on a fresh world; its events in order."""
    world = RecordingWorld()
    FLOWS[name][1](world)
    return world.events


def to_sequence(name: str, events: list[Event]) -> str:
    """A mermaid sequence diagram: hosts, sessions, frames, machine steps as notes."""
    lines = [f"%% flow {name}: {FLOWS[name][0]} (generated by p2pfsm diagrams from a "
             "p2pfsm.sim run)", "sequenceDiagram",
             "    participant host_a as host a", "    participant a as session a",
             "    participant b as session b", "    participant host_b as host b"]
    steps: list[str] = []
    owner = ""

    def flush() -> None:
        if steps:
            lines.append(f"    Note over {owner}: " + "<br/>".join(steps))
            steps.clear()

    for e in events:
        e = Event(e.kind, e.node, e.text.replace(";", ",").replace("#", " "))  # mermaid syntax
        if e.kind == "step":
            if owner != e.node:
                flush()
            owner = e.node
            steps.append(e.text)
            continue
        flush()
        if e.kind == "call" and e.text.startswith("timer "):
            lines.append(f"    {e.node}->>{e.node}: {e.text}")
        elif e.kind == "call":
            lines.append(f"    {HOSTS[e.node]}->>{e.node}: {e.text}")
        elif e.kind == "frame":
            lines.append(f"    {e.node}->>{'b' if e.node == 'a' else 'a'}: {e.text}")
        else:
            lines.append(f"    {e.node}-->>{HOSTS[e.node]}: {e.text}")
    flush()
    return "\n".join(lines) + "\n"
