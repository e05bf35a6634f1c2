"""Datadriven transcripts: a scenario as text, replayed over two real sessions.

A transcript (``tests/scenarios/testdata/*.txt``) is a list of blocks::

    # a comment (kept as it is on rewrite)
    fetch a r1 12,13
    ----
    a <- host fetch job=1 r1 [k12 k13] -> [8 9]
      step client_round r1/0: new -host_fetch-> loading
      send fetch r1/0 [k12 k13] -> [8 9]
      armed load r1/0 at 30

Each block is one directive line, ``----`` and the expected output, ended by a blank
line. :func:`replay` runs the directives in order over a :class:`Transcript` world (the
scenario :class:`~helpers.world.World`: sessions ``a`` and ``b`` over FIFO channels,
virtual clock, simulated hosts and data plane) and renders what each directive caused:
for every input a session handled, ``<node> <- <input>``, then indented the machine
steps it took (``step``), then its outputs in order, then the timers it ``armed`` (or
moved) and ``disarmed`` (the session owns them; they are not outputs). What happened outside the
sessions (a write landing, a frame lost or duplicated on the wire) is a line ``* ...``;
a directive that caused nothing renders ``ok``. The rendering holds no object ids and
no wall clock; where order means nothing (the ``state`` directive's maps) it is sorted.

Directives (nodes are ``a`` and ``b``; keys are demo block numbers: ``12,13`` is
``[k12 k13]``; ``a`` holds blocks 0-7 and ``b`` 8-15 unless ``world`` says otherwise):

    world [manual-answers] [parts=<node>] [held-<node>=<lo>-<hi>] [hash-seed-<node>=<s>]
          [timeouts=<name>:<s>,...]
                            a fresh world (must come first if given)
    start [<node>]          HostStart on both (or one) sessions
    handshake               start both and run the handshake; prints the states only
    deliver <src> [all]     deliver the oldest frame (or every frame) <src> sent
    drop <src> | duplicate <src>
                            lose / duplicate the oldest frame on <src>'s channel
    register <node> [fail]  the data plane finishes registering <node>'s peer
    fetch <node> <req> <keys> | supply <node> <req> <keys> | lookup <node> <req> <keys>
    answer <node> <token> [hits=<keys>] [pending=<keys>]   (with manual-answers)
    finish <node> <req> | decline <node> <req> <round> | close <node>
    land <src> <xfer> | complete <src> <xfer> [fail] | writes <src>  (land + complete all)
    timer <node> <kind>     fire <node>'s earliest armed timer of <kind>
    advance <seconds>       fire every timer due within that time, in deadline order
    cut | link-down <node>  the connection breaks / <node> learns its peer is gone
    state                   both sessions' states, open instances, timers and channels

``P2PFSM_REWRITE=1`` (or ``pytest --rewrite``) rewrites every expected block with
what the code now renders.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.world import World
from p2pfsm.demo_blocks import demo_key
from p2pfsm.errors import LocalProtocolError, RemoteProtocolError
from p2pfsm.fsm import Tracer
from p2pfsm.protocol import (
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    Lookup,
    LookupResp,
    Message,
    TransferDone,
    decode,
)
from p2pfsm.session import (
    DEFAULT_HASH_SEED,
    CancelWrite,
    FetchArrived,
    FrameIgnored,
    FrameReceived,
    HostAnswerLookup,
    HostClose,
    HostDecline,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    Input,
    LoadResult,
    LookupClosed,
    LookupRequest,
    LookupResult,
    Output,
    ProtocolViolation,
    RegistrationFinished,
    RoundEnded,
    SendFrame,
    SessionDead,
    StartRegistration,
    StartWrite,
    StoreResult,
    Timeouts,
    TimerFired,
    TimerId,
    TransportLost,
    WriteFinished,
)
from p2pfsm.sim.host import SafetyViolation

SEPARATOR = "----"
REWRITE_ENV = "P2PFSM_REWRITE"
NUM_BLOCKS = 32
_KEY_NAMES = {demo_key(i): f"k{i}" for i in range(NUM_BLOCKS)}


# ----------------------------------------------------------------- rendering
def _num(x: float) -> str:
    return f"{x:g}"


def _key(k: bytes) -> str:
    return _KEY_NAMES.get(k) or k[:6].hex()


def _keys(ks: Iterable[bytes]) -> str:
    return "[" + " ".join(_key(k) for k in ks) + "]"


def _ints(xs: Iterable[int]) -> str:
    return "[" + " ".join(str(x) for x in xs) + "]"


def _hits(keys: Iterable[bytes], hits: Iterable[bool]) -> str:
    pairs = (f"{_key(k)}={'hit' if h else 'miss'}" for k, h in zip(keys, hits, strict=True))
    return "[" + " ".join(pairs) + "]"


def _timer(t: TimerId) -> str:
    return " ".join([t.kind, "/".join(str(k) for k in t.key)]).rstrip()


def _ok(ok: bool) -> str:
    return "ok" if ok else "failed"


def frame(m: Message) -> str:
    """One control message, compactly."""
    if isinstance(m, Connect):
        extra = "" if m.hash_seed == DEFAULT_HASH_SEED else f" hash_seed={m.hash_seed}"
        extra += "" if m.incarnation is None else f" incarnation={m.incarnation}"
        return f"connect {m.peer_id} {m.num_blocks}x{m.block_len}{extra}"
    if isinstance(m, ConnectAck):
        return f"connect_ack {m.peer_id}"
    if isinstance(m, Disconnect):
        return "disconnect"
    if isinstance(m, Fetch):
        if m.is_terminal:
            return f"fetch {m.kv_request_id}/{m.round_seq} (terminal)"
        return (f"fetch {m.kv_request_id}/{m.round_seq} {_keys(m.keys)} -> "
                f"{_ints(m.block_indexes)}")
    if isinstance(m, Lookup):
        return f"lookup {m.kv_request_id}/{m.round_seq} {_keys(m.keys)}"
    if isinstance(m, LookupResp):
        return f"lookup_resp {m.kv_request_id} {_hits(m.keys, m.hits)}"
    if isinstance(m, TransferDone):
        return f"transfer_done {m.kv_request_id}/{m.round_seq} {_ok(m.success)}"
    if isinstance(m, AbortFetch):
        return f"abort_fetch {m.kv_request_id}/{m.round_seq}"
    assert isinstance(m, AbortAck)
    return f"abort_ack {m.kv_request_id}/{m.round_seq}"


def _why(reason: object) -> str:
    return "" if reason is None else f" {reason}"


def render_input(ev: Input) -> str:
    """What a session was handed."""
    if isinstance(ev, FrameReceived):
        try:
            return f"recv {frame(decode(ev.frame))}"
        except RemoteProtocolError:
            return f"recv <{len(ev.frame)} bytes, undecodable>"
    if isinstance(ev, TimerFired):
        return f"timer {_timer(ev.timer)}"
    if isinstance(ev, RegistrationFinished):
        return "registered" if ev.ok else f"registration failed: {ev.reason}"
    if isinstance(ev, WriteFinished):
        return f"write #{ev.xfer} finished {_ok(ev.ok)}"
    if isinstance(ev, TransportLost):
        return f"transport lost: {ev.reason}"
    if isinstance(ev, HostStart):
        return "host start"
    if isinstance(ev, HostFetch):
        return (f"host fetch job={ev.job_id} {ev.kv_request_id} {_keys(ev.keys)} -> "
                f"{_ints(ev.dest_indexes)}")
    if isinstance(ev, HostLookup):
        return f"host lookup {ev.kv_request_id} {_keys(ev.keys)}"
    if isinstance(ev, HostSupply):
        return (f"host supply job={ev.job_id} {ev.kv_request_id} {_keys(ev.keys)} from "
                f"{_ints(ev.local_indexes)}")
    if isinstance(ev, HostAnswerLookup):
        hits = " ".join(f"{_key(k)}@{b}" for k, b in sorted(ev.hits.items(),
                                                          key=lambda kv: _key(kv[0])))
        pending = sorted(ev.pending, key=_key)
        return (f"host answer token={ev.token} hits=[{hits}] job={ev.job_id}"
                + (f" pending={_keys(pending)}" if pending else ""))
    if isinstance(ev, HostFinish):
        return f"host finish {ev.kv_request_id}"
    if isinstance(ev, HostDecline):
        return f"host decline {ev.kv_request_id}/{ev.round_seq}"
    assert isinstance(ev, HostClose)
    return "host close"


def render_output(o: Output) -> str:
    """What a session asked its executor (or its host) to do."""
    if isinstance(o, SendFrame):
        return f"send {frame(o.message)}"
    if isinstance(o, StartRegistration):
        return f"start registration of {o.connect.peer_id}"
    if isinstance(o, StartWrite):
        return f"start write #{o.xfer} {_ints(o.local_indexes)} -> {_ints(o.remote_indexes)}"
    if isinstance(o, CancelWrite):
        return f"cancel write #{o.xfer}"
    if isinstance(o, LoadResult):
        kept = "released" if o.released else "kept"
        return (f"result load job={o.job_id} {o.kv_request_id} {_ok(o.success)}"
                f"{_why(o.reason)} {kept}")
    if isinstance(o, StoreResult):
        return f"result store job={o.job_id} {_ok(o.success)}{_why(o.reason)}"
    if isinstance(o, LookupResult):
        whole = "answered" if o.answered else f"partial{_why(o.reason)}"
        return f"result lookup {o.kv_request_id} {_hits(o.keys, o.hits)} {whole}"
    if isinstance(o, LookupRequest):
        return f"ask lookup token={o.token} {o.kv_request_id}/{o.round_seq} {_keys(o.keys)}"
    if isinstance(o, LookupClosed):
        return f"lookup closed token={o.token}"
    if isinstance(o, FetchArrived):
        return (f"fetch arrived {o.kv_request_id}/{o.round_seq} {_keys(o.keys)} "
                f"supplied={_keys(o.supplied)}")
    if isinstance(o, RoundEnded):
        return (f"round ended {o.kv_request_id}/{o.round_seq} "
                + ("served" if o.served else o.why))
    if isinstance(o, ProtocolViolation):
        return f"protocol violation: {o.error}"
    if isinstance(o, FrameIgnored):
        return f"ignored {o.message_type or 'frame'}: {o.reason}"
    assert isinstance(o, SessionDead)
    mismatch = "" if o.mismatch is None else f" (mismatch: {o.mismatch.field})"
    return f"session dead: {o.reason}{mismatch}"


def _timer_changes(before: Mapping[TimerId, float], after: Mapping[TimerId, float],
                   fired: TimerId | None) -> list[str]:
    """The session's timers a call armed (or moved) and disarmed, in ``str`` order (the
    timer that fired is not listed as disarmed: its input line says so)."""
    lines = [f"  disarmed {_timer(t)}" for t in sorted(before.keys() - after.keys(), key=str)
             if t != fired]
    lines += [f"  armed {_timer(t)} at {_num(d)}"
              for t, d in sorted(after.items(), key=lambda item: str(item[0]))
              if before.get(t) != d]
    return lines


# --------------------------------------------------------------------- world
class Transcript(World):
    """A scenario world whose every session step is written down as text."""

    def __init__(self, **kwargs: Any) -> None:
        self.lines: list[str] = []
        super().__init__(tracer=Tracer(), num_blocks=NUM_BLOCKS, **kwargs)
        self._labels = {s.config.local_id: "" for s in self.sessions.values()}

    def feed(self, node: str, event: Input) -> list[Output]:
        assert self.tracer is not None
        mark = len(self.tracer.records)
        at = f" @{_num(self.now)}" if isinstance(event, TimerFired) else ""
        self.lines.append(f"{node} <- {render_input(event)}{at}")
        armed = dict(self.sessions[node].view.timers)
        try:
            outputs = super().feed(node, event)
        finally:
            for r in self.tracer.records[mark:]:
                label = self._labels.get(r.instance, r.instance)
                where = f"{r.machine} {label}".rstrip()
                self.lines.append(f"  step {where}: {r.source} -{r.trigger}-> {r.dest}")
        self.lines += [f"  {render_output(o)}" for o in outputs]
        fired = event.timer if isinstance(event, TimerFired) else None
        self.lines += _timer_changes(armed, self.sessions[node].view.timers, fired)
        return outputs

    # world events (no session input): written as "* ..."
    def land(self, src: str, xfer: int) -> None:
        w = self.writes[(src, xfer)]
        if not w.landed:
            self.lines.append(f"* write {src}#{xfer} lands in {self.other(src)}'s blocks "
                              f"{_ints(w.remote_indexes)}")
        super().land(src, xfer)

    def drop(self, src: str, index: int = 0) -> None:
        m = frame(decode(self.channels[(src, self.other(src))][index]))
        self.lines.append(f"* lost on the wire {src}->{self.other(src)}: {m}")
        super().drop(src, index)

    def duplicate(self, src: str, index: int = 0) -> None:
        m = frame(decode(self.channels[(src, self.other(src))][index]))
        self.lines.append(f"* duplicated on the wire {src}->{self.other(src)}: {m}")
        super().duplicate(src, index)

    def lose_queued_frames(self) -> None:
        for (src, dst), chan in sorted(self.channels.items()):
            self.lines += [f"* lost on the wire {src}->{dst}: {frame(decode(f))}" for f in chan]
        super().lose_queued_frames()

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines

    def state(self) -> list[str]:
        lines = []
        for n in self.NODES:
            s = self.sessions[n]
            opened = ", ".join(f"{k}={v}" for k, v in sorted(s.open_counts().items()) if v)
            lines.append(f"{n}: {s.state}" + (f" ({opened})" if opened else ""))
            timers = sorted((d, _timer(t)) for t, d in self.timers[n].items())
            if timers:
                lines.append("  timers: " + ", ".join(f"{t} at {_num(d)}" for d, t in timers))
        for (src, dst), chan in sorted(self.channels.items()):
            if chan:
                wire = ", ".join(frame(decode(f)) for f in chan)
                lines.append(f"wire {src}->{dst}: {wire}")
        lines.append(f"clock {_num(self.now)}")
        return lines


# ---------------------------------------------------------------- directives
class TranscriptError(Exception):
    """A directive the interpreter cannot run (bad name or arguments)."""


@dataclass
class Directive:
    """One parsed directive line: ``name pos... key=value...``."""

    line: int
    text: str
    name: str
    args: list[str]
    kwargs: dict[str, str]

    def arg(self, i: int) -> str:
        if i >= len(self.args):
            raise TranscriptError(f"line {self.line}: {self.name}: argument {i + 1} missing")
        return self.args[i]

    def node(self, i: int = 0) -> str:
        n = self.arg(i)
        if n not in World.NODES:
            raise TranscriptError(f"line {self.line}: unknown node {n!r} (a or b)")
        return n

    def keys(self, text: str) -> list[int]:
        try:
            return [int(x) for x in text.split(",") if x]
        except ValueError:
            raise TranscriptError(f"line {self.line}: keys are block numbers: {text!r}") from None


def _parse_directive(line: int, text: str) -> Directive:
    words = text.split()
    args = [w for w in words[1:] if "=" not in w]
    kwargs = dict(w.split("=", 1) for w in words[1:] if "=" in w)
    return Directive(line, text, words[0], args, kwargs)


def _world(d: Directive) -> Transcript:
    opts: dict[str, Any] = {"auto_answer": "manual-answers" not in d.args}
    held = {n: range(0, 8) if n == "a" else range(8, 16) for n in World.NODES}
    for n in World.NODES:
        if f"held-{n}" in d.kwargs:
            lo, hi = d.kwargs[f"held-{n}"].split("-")
            held[n] = range(int(lo), int(hi) + 1)
    opts["held"] = held
    configs: dict[str, dict[str, object]] = {n: {} for n in World.NODES}
    if "parts" in d.kwargs:
        configs[d.kwargs["parts"]]["answer_lookups_in_parts"] = True
    for n in World.NODES:
        if f"hash-seed-{n}" in d.kwargs:
            configs[n]["hash_seed"] = d.kwargs[f"hash-seed-{n}"]
    opts["configs"] = configs
    if "timeouts" in d.kwargs:
        values = dict(kv.split(":") for kv in d.kwargs["timeouts"].split(","))
        opts["timeouts"] = Timeouts(**{k: float(v) for k, v in values.items()})
    return Transcript(**opts)


def _advance(w: Transcript, seconds: float) -> None:
    until = w.now + seconds
    for _ in range(1_000):
        due = w.next_deadline()
        if due is None or due[0] > until:
            break
        w.fire_timer(due[1], due[2])
    w.now = max(w.now, until)


def _deliver(w: Transcript, d: Directive) -> None:
    src = d.node()
    if "all" in d.args[1:]:
        w.deliver_all(src)
    elif not w.channels[(src, w.other(src))]:
        raise TranscriptError(f"line {d.line}: nothing queued from {src}")
    else:
        w.deliver(src)


def _xfer(w: Transcript, d: Directive) -> tuple[str, int]:
    src, xfer = d.node(), int(d.arg(1))
    if (src, xfer) not in w.writes:
        raise TranscriptError(f"line {d.line}: {src} has no write #{xfer} in flight "
                              f"(in flight: {w.xfers(src)})")
    return src, xfer


def _answer(w: Transcript, d: Directive) -> None:
    node = d.node()
    token = int(d.arg(1))
    if token not in {r.token for r in w.held[node]}:
        raise TranscriptError(f"line {d.line}: {node} holds no lookup token {token} "
                              f"(held: {[r.token for r in w.held[node]]})")
    w.answer(node, token, d.keys(d.kwargs.get("hits", "")), d.keys(d.kwargs.get("pending", "")))


_ACTIONS: dict[str, Callable[[Transcript, Directive], object]] = {
    "start": lambda w, d: [w.feed(n, HostStart()) for n in (d.args or World.NODES)],
    "deliver": _deliver,
    "drop": lambda w, d: w.drop(d.node()),
    "duplicate": lambda w, d: w.duplicate(d.node()),
    "register": lambda w, d: w.register(d.node(), "fail" not in d.args),
    "fetch": lambda w, d: w.fetch(d.node(), d.arg(1), d.keys(d.arg(2))),
    "supply": lambda w, d: w.supply(d.node(), d.arg(1), d.keys(d.arg(2))),
    "lookup": lambda w, d: w.lookup(d.node(), d.arg(1), d.keys(d.arg(2))),
    "answer": _answer,
    "finish": lambda w, d: w.finish(d.node(), d.arg(1)),
    "decline": lambda w, d: w.decline(d.node(), d.arg(1), int(d.arg(2))),
    "close": lambda w, d: w.close(d.node()),
    "land": lambda w, d: w.land(*_xfer(w, d)),
    "complete": lambda w, d: w.complete(*_xfer(w, d), fail="fail" in d.args),
    "writes": lambda w, d: w.finish_writes(d.node()),
    "timer": lambda w, d: w.fire_next(d.node(), d.arg(1)),
    "advance": lambda w, d: _advance(w, float(d.arg(0).removesuffix("s"))),
    "cut": lambda w, d: w.cut(),
    "link-down": lambda w, d: w.link_down(d.node()),
}


def run_directive(w: Transcript | None, d: Directive) -> tuple[Transcript, list[str]]:
    """Run one directive; the world (a new one for ``world``) and its rendering."""
    if d.name == "world":
        if w is not None:
            raise TranscriptError(f"line {d.line}: 'world' must be the first directive")
        return _world(d), ["ok"]
    w = w or Transcript()
    if d.name == "state":
        return w, w.state()
    if d.name == "handshake":
        w.handshake()
        w.take()
        return w, [f"{n}: {w.sessions[n].state}" for n in World.NODES]
    action = _ACTIONS.get(d.name)
    if action is None:
        raise TranscriptError(f"line {d.line}: unknown directive {d.name!r} "
                              f"(known: {', '.join(sorted([*_ACTIONS, 'world', 'state']))})")
    try:
        action(w, d)
    except (LocalProtocolError, SafetyViolation) as exc:
        w.lines.append(f"error: {type(exc).__name__}: {exc}")
    return w, w.take() or ["ok"]


# ------------------------------------------------------------------ the files
@dataclass
class Block:
    """A directive and where its expected output sits in the file."""

    directive: Directive
    start: int
    """Index of the first expected line (just after ``----``)."""
    end: int
    """Index just past the last expected line."""
    expected: list[str] = field(default_factory=list)


def parse(text: str) -> tuple[list[str], list[Block]]:
    """The file's lines and its blocks (comments and blank lines between are kept)."""
    lines = text.split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            i += 1
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != SEPARATOR:
            raise TranscriptError(f"line {i + 1}: expected '{SEPARATOR}' after {line!r}")
        start = end = i + 2
        while end < len(lines) and lines[end].strip():
            end += 1
        blocks.append(Block(_parse_directive(i + 1, line), start, end, lines[start:end]))
        i = end
    return lines, blocks


def replay(text: str) -> str:
    """The transcript with every expected block replaced by what the code renders."""
    lines, blocks = parse(text)
    world: Transcript | None = None
    out: list[str] = []
    done = 0
    for b in blocks:
        world, rendered = run_directive(world, b.directive)
        out += lines[done:b.start] + rendered
        done = b.end
    return "\n".join(out + lines[done:])


def rewriting() -> bool:
    return os.environ.get(REWRITE_ENV, "") not in ("", "0")


def check(path: Path, *, rewrite: bool = False) -> None:
    """Replay ``path``; a difference fails with a unified diff (or, with ``rewrite``,
    is written back to the file)."""
    text = path.read_text()
    actual = replay(text)
    if actual == text:
        return
    if rewrite:
        path.write_text(actual)
        return
    diff = difflib.unified_diff(text.splitlines(), actual.splitlines(),
                                f"{path.name} (expected)", f"{path.name} (actual)", lineterm="")
    raise AssertionError(
        f"{path.name}: the sessions no longer do what the transcript says "
        f"(rerun with {REWRITE_ENV}=1 or --rewrite to accept, and read the diff):\n"
        + "\n".join(diff))
