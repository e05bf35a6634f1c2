"""Spec -> code: paths of TLC's reachable graph replayed against the real sessions.

For a machine transition the spec takes, :func:`path_to` finds the shortest behaviour
of the dumped graph (``-dump dot,actionlabels``) whose last step takes it, and
:func:`replay` makes two real :class:`~p2pfsm.session.Session` objects (in a
:class:`ReplayWorld`, a SimWorld whose every nondeterministic choice is explicit)
follow that behaviour step by step. At each step it tries the concrete inputs that
can be the step's action (which frame to deliver, which keys to fetch, which armed
timer to fire, how the host answers a lookup, ...) and keeps one whose
``Session.handle`` call is that action and takes exactly the machine steps the spec
records in ``fired``, and after which the abstraction of the sessions equals the
spec's state (session states, each round's state, the frames on each channel). It
backtracks over ambiguous choices; a path no choice follows is a spec -> code gap.
A path is replayed with the producer answering each lookup in one frame and, if that
fails, with ``answer_lookups_in_parts`` (where the scenario lets the spec's producer
split its answers, "split"; a path that coalesces answers has no code counterpart).

Timers: the sessions run on per-peer virtual clocks with every role timeout 1 s and
the tombstone horizon far away, so a timer fires only when the path fires it and
tombstones end only at ``NetworkFrameLifetime`` (the peer's clock jumps past them).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import product

import msgpack

from p2pfsm.demo_blocks import demo_key
from p2pfsm.errors import LocalProtocolError, MalformedFrame
from p2pfsm.fsm import DEFAULT_PROFILE, input_table
from p2pfsm.protocol import Disconnect, Fetch, decode, fetch_round
from p2pfsm.session import (
    HostAnswerLookup,
    HostStart,
    Input,
    LookupRequest,
    Output,
    PeerGone,
    SendFrame,
    Timeouts,
    TimerFired,
    TimerId,
    TransportLost,
)
from p2pfsm.session.config import resolve_profile
from p2pfsm.session.machine import OPEN_STATES, STALE_ANSWER_INTERVAL_S
from p2pfsm.sim.host import SafetyViolation
from p2pfsm.spec_calls import FRAME_ACTIONS, STALE_STATES, TIMER_ACTIONS, action_name
from p2pfsm.tools.verify.graph import StateGraph, Step
from p2pfsm.tools.verify.names import ENVIRONMENT_ACTIONS
from p2pfsm.tools.verify.tla_values import Fn, parse_value
from p2pfsm.tools.verify.traces import TraceEvent, TracingWorld

Op = tuple[object, ...]
"""A concrete input: ``(kind, *args)``, applied by :func:`apply`."""

SPEC_KEYS = {"k1": 0, "k2": 1}
"""The spec's abstract keys -> demo key numbers (both peers hold both)."""
KEY_SETS: tuple[tuple[int, ...], ...] = ((0,), (1,), (0, 1))
REPLAY_TIMEOUTS = Timeouts(handshake=1.0, load=1.0, abort_ack=1.0, store=1.0, lookup=1.0,
                           lookup_pending=1.0, demand=1.0, tombstone=1e6)
_KEY_NUMBER = {demo_key(i): i for i in range(len(SPEC_KEYS))}
_REQ = "r1"
_INPUTS = input_table()
_HANDSHAKE = frozenset(t for t, (machine, _) in FRAME_ACTIONS.items() if machine == "session")
_TIMER_KIND = {action_name(*mt): kind for kind, mt in TIMER_ACTIONS.items()}
_HOST_OP = {action_name(r.machine, r.trigger): r.name for r in _INPUTS.of_kind("host").values()}
"""Host-call action -> the replay op making it (the input's name in models/inputs.toml)."""
_KEYED = frozenset({"fetch", "lookup", "supply"})
"""Host ops that take a key set."""
_DECLINE_ROUNDS = 3
"""Round numbers a replayed decline may name (the configs' MaxRounds is at most 3)."""
_RESULT_OP = {action_name(r.machine, t): (r.name, ok)
              for r in (*_INPUTS.of_kind("result").values(), *_INPUTS.of_kind("transport").values())
              for t, ok in ((r.trigger, True),
                            *((v.trigger, v.expect) for v in r.variants if v.field == "ok"))}
"""Data-plane and transport action -> (op, ok)."""
_RECEIVE = frozenset(
    {action_name(r.machine, t) for r in _INPUTS.of_kind("frame").values() for t in r.triggers}
    | {action_name("session", _INPUTS.stale), action_name("session", "recv_bad_fetch"),
       "NetworkDiscard"})
_SILENT = ENVIRONMENT_ACTIONS - {"NetworkDiscard"}
"""Environment actions no Session.handle call stands for."""
_UNREPLAYABLE = frozenset({"NetworkRestart"})
"""Environment actions a path to replay never takes: the replay world has two sessions
and no process that could restart (the restart is checked by the spec's invariants and
by tests/scenarios/test_scenario_restart.py)."""


def replay_timeouts(profile: str) -> Timeouts:
    """The replay's deadlines under ``profile``: every one 1 s, and a bounded hold only
    where the profile has one (the spec's PB.hold)."""
    has_hold = resolve_profile(profile).timeouts.get("hold") is not None
    return dataclasses.replace(REPLAY_TIMEOUTS, hold=1.0 if has_hold else None)


class ReplayWorld(TracingWorld):
    """A TracingWorld driven one explicit choice at a time.

    Both peers hold keys 0 and 1; lookups are answered only by :func:`apply`
    (``answer``), in parts if the path says so; a cut stops delivery until each
    session is told (``lost``); each peer has its own clock.
    """

    def __init__(self, *, compatible: bool = True, parts: bool = False,
                 profile: str = DEFAULT_PROFILE) -> None:
        # Each session carries an incarnation, as a Node's does (the spec's peers are
        # p2pfsm nodes: a second connect on a ready session is the peer reconnecting).
        configs: dict[str, dict[str, object]] = {"a": {"incarnation": 1, "profile": profile},
                                                 "b": {"incarnation": 2, "profile": profile}}
        if not compatible:
            configs["b"]["hash_seed"] = "another-seed"
        if parts:
            configs["b"]["answer_lookups_in_parts"] = True
        super().__init__(0, held={"a": (0, 1), "b": (0, 1)}, num_blocks=8,
                         timeouts=replay_timeouts(profile), configs=configs)
        self.clock = {n: 0.0 for n in self.NODES}
        self.is_cut = False
        self.unanswered: dict[tuple[str, int], frozenset[int]] = {}

    def feed(self, node: str, event: Input) -> list[Output]:
        self.now = self.clock[node]
        return super().feed(node, event)

    def send_frame(self, peer: str, out: SendFrame) -> None:
        if self.is_cut:
            return  # the connection is gone: the frame never leaves
        super().send_frame(peer, out)

    def _answer_lookup(self, node: str, req: LookupRequest) -> None:
        self.unanswered[(node, req.token)] = frozenset(_KEY_NUMBER[k] for k in req.keys)

    def fire_timer(self, node: str, timer: TimerId) -> None:
        deadline = self.timers[node][timer]
        self.clock[node] = max(self.clock[node], deadline)
        self.feed(node, TimerFired(timer))


def apply(w: ReplayWorld, op: Op) -> None:
    """Carry out one concrete input."""
    kind, args = op[0], op[1:]
    node = str(args[0]) if args else ""
    if kind == "start":
        w.feed(node, HostStart())
    elif kind == "close":
        w.close(node)
    elif kind == "fetch":
        w.fetch(node, _REQ, args[1])  # type: ignore[arg-type]
    elif kind == "lookup":
        w.lookup(node, _REQ, args[1])  # type: ignore[arg-type]
    elif kind == "supply":
        w.supply(node, _REQ, args[1])  # type: ignore[arg-type]
    elif kind == "finish":
        w.finish(node, _REQ)
    elif kind == "decline":
        w.decline(node, _REQ, int(args[1]))  # type: ignore[call-overload]
    elif kind == "answer":
        _answer(w, node, int(args[1]), frozenset(args[2]), frozenset(args[3]))  # type: ignore[call-overload]
    elif kind == "deliver":
        receiver = w.other(node)
        if (w.sessions[receiver].state in STALE_STATES
                and not any(isinstance(decode(f), Disconnect)
                            for f in w.channels[(receiver, node)])):
            # The spec's dead session answers unless a disconnect of its own is still on
            # the wire (its rate limit, having no clock): the code's passes likewise.
            w.clock[receiver] += STALE_ANSWER_INTERVAL_S
        w.deliver(node)
    elif kind == "registration":
        w.register(node, bool(args[1]))
    elif kind == "write":
        xfer, ok = int(args[1]), bool(args[2])  # type: ignore[call-overload]
        if ok:
            w.land(node, xfer)
        w.complete(node, xfer, fail=not ok)
    elif kind == "lost":
        w.feed(node, TransportLost("replayed cut"))
    elif kind == "peer_gone":
        w.feed(node, PeerGone("data_plane"))
    elif kind == "timer":
        w.fire_timer(node, args[1])  # type: ignore[arg-type]
    elif kind == "halfcut":
        pass  # only the transport's view changes; the session hears of it at ("lost", p)
    elif kind == "cut":
        w.is_cut = True
        w.lose_queued_frames()
    elif kind == "drop":
        w.drop(node)
    elif kind == "dup":  # the spec appends a copy of the head frame
        chan = w.channels[(node, w.other(node))]
        chan.append(chan[0])
        w.sent_at[(node, w.other(node))].append(w.sent_at[(node, w.other(node))][0])
    elif kind == "corrupt":  # the spec's bad_fetch: keys and indexes of unequal length
        chan = w.channels[(node, w.other(node))]
        wire = msgpack.unpackb(chan[0], raw=False)
        chan[0] = msgpack.packb({**wire, "block_indexes": [*wire["block_indexes"], 0]},
                                use_bin_type=True)
    elif kind == "lifetime":
        w.clock[node] += 2 * REPLAY_TIMEOUTS.tombstone
    else:
        raise ValueError(f"unknown replay input {op!r}")


def _answer(w: ReplayWorld, node: str, token: int, hits: frozenset[int],
            miss: frozenset[int]) -> None:
    pending = w.unanswered[(node, token)] - hits - miss
    w.unanswered[(node, token)] = pending
    job = None
    if hits:
        job = w.new_job()
        w.hosts[node].store_jobs[job] = tuple(sorted(hits))
    w.feed(node, HostAnswerLookup(token, {demo_key(k): k for k in sorted(hits)}, job,
                                  frozenset(demo_key(k) for k in pending)))


def candidates(w: ReplayWorld, action: str) -> Iterator[Op]:
    """Every concrete input that could be ``action`` now."""
    for p in w.NODES:
        chan = w.channels[(p, w.other(p))]
        host = _HOST_OP.get(action)
        if host in _KEYED:
            for keys in KEY_SETS:
                yield (host, p, keys)
        elif host == "answer":
            for (node, token), pending in sorted(w.unanswered.items()):
                if node != p or token in w.hosts[p].lookups_closed:
                    continue
                waiting = sorted(pending)
                for fate in product(("hit", "miss", "pending"), repeat=len(waiting)):
                    hits = tuple(k for k, f in zip(waiting, fate, strict=True) if f == "hit")
                    miss = tuple(k for k, f in zip(waiting, fate, strict=True) if f == "miss")
                    if hits or miss:
                        yield ("answer", p, token, hits, miss)
        elif host == "decline":
            for seq in range(_DECLINE_ROUNDS):  # a round that cannot take it raises
                yield (host, p, seq)
        elif host is not None:
            yield (host, p)
        elif action in _RECEIVE:
            if chan:
                yield ("deliver", p)
        elif action in _RESULT_OP:
            op, ok = _RESULT_OP[action]
            if op == "registration" and p in w.registrations:
                yield (op, p, ok)
            elif op == "write":
                for src, xfer in sorted(w.writes):
                    if src == p:
                        yield (op, p, xfer, ok)
            elif op in ("lost", "peer_gone"):
                yield (op, p)
        elif action in _TIMER_KIND:
            for timer in sorted(w.timers[p], key=repr):
                if timer.kind == _TIMER_KIND[action]:
                    yield ("timer", p, timer)
        elif action == "NetworkHalfCut":
            yield ("halfcut", p)
        elif action == "NetworkDrop":
            if chan:
                yield ("drop", p)
        elif action == "NetworkDuplicate":
            if chan:
                yield ("dup", p)
        elif action == "NetworkFrameLifetime":
            yield ("lifetime", p)
        elif action == "NetworkCorrupt" and chan and _is_keyed_fetch(chan[0]):
            yield ("corrupt", p)
    if action == "NetworkCut":
        yield ("cut",)


def _is_keyed_fetch(frame: bytes) -> bool:
    try:
        msg = decode(frame)
    except MalformedFrame:
        return False
    return isinstance(msg, Fetch) and not msg.is_terminal


# ------------------------------------------------------------------ abstraction

Abstract = tuple[tuple[str, ...], tuple[tuple[object, ...], ...]]


def _per_peer(text: str) -> tuple[object, object]:
    """The values of peers a and b in a spec variable ``[a |-> .., b |-> ..]``."""
    value = parse_value(text)
    if not isinstance(value, Fn) or set(value) != {"a", "b"}:
        raise ValueError(f"not a per-peer value: {text[:80]}")
    return value["a"], value["b"]


def _spec_frames(channel: object) -> tuple[tuple[object, ...], ...]:
    """A spec channel (a sequence of ``<<kind, sender, round_seq, keys, ...>>``) as
    :func:`_code_frame` sees frames."""
    assert isinstance(channel, tuple), channel
    return tuple(_spec_frame(*_frame_fields(frame)) for frame in channel)


def _frame_fields(frame: object) -> tuple[str, int, frozenset[object]]:
    assert isinstance(frame, tuple) and len(frame) >= 4, frame
    kind, _sender, seq, keys = frame[:4]
    assert isinstance(kind, str) and isinstance(seq, int) and isinstance(keys, frozenset)
    return kind, seq, keys


def _spec_rounds(rounds: object) -> tuple[tuple[int, str], ...]:
    """A spec round table (``<<req, seq>> :> [st |-> .., ...]``; ``<<>>`` when empty) as
    sorted (round_seq, state) pairs."""
    if rounds == ():
        return ()
    assert isinstance(rounds, Fn), rounds
    pairs: list[tuple[int, str]] = []
    for key, record in rounds.items():
        assert isinstance(key, tuple) and isinstance(record, Fn), (key, record)
        seq, state = key[1], record["st"]
        assert isinstance(seq, int) and isinstance(state, str)
        pairs.append((seq, state))
    return tuple(sorted(pairs))


def _spec_frame(kind: str, seq: int, keys: frozenset[object]) -> tuple[object, ...]:
    if kind in _HANDSHAKE:
        return (kind,)
    key_ids = tuple(sorted(SPEC_KEYS[str(k)] for k in keys))
    if kind in ("fetch", "lookup", "lookup_resp"):
        return (kind, key_ids) if kind != "fetch" else (kind, seq, key_ids)
    return (kind, seq)


def _code_frame(frame: bytes) -> tuple[object, ...]:
    try:
        msg = decode(frame)
    except MalformedFrame:
        named = fetch_round(frame)
        if named is None:
            raise
        return ("bad_fetch", named.round_seq)
    kind = msg.TYPE
    if kind in _HANDSHAKE:
        return (kind,)
    keys = tuple(sorted(_KEY_NUMBER[k] for k in getattr(msg, "keys", ())))
    seq = getattr(msg, "round_seq", None)
    if kind in ("lookup", "lookup_resp"):
        return (kind, keys)
    if kind == "fetch":
        return (kind, seq, keys)
    return (kind, seq)


def spec_abstract(state: dict[str, str]) -> Abstract:
    """What a replay compares in a spec state."""
    sess = tuple(str(s) for s in _per_peer(state["sess"]))
    parts: list[tuple[object, ...]] = []
    for channel in _per_peer(state["chan"]):
        parts.append(_spec_frames(channel))
    for var in ("cr", "sr"):
        for rounds in _per_peer(state[var]):
            parts.append(_spec_rounds(rounds))
    return sess, tuple(parts)


def code_abstract(w: ReplayWorld) -> Abstract:
    """The same view of two running sessions (round_seq None is the spec's -1)."""
    sess = tuple(w.sessions[p].state for p in w.NODES)
    parts: list[tuple[object, ...]] = []
    for p in w.NODES:
        parts.append(tuple(_code_frame(f) for f in w.channels[(p, w.other(p))]))
    for p in w.NODES:
        view = w.sessions[p].view
        loads = {**view.loads.get(_REQ, {}),
                 **{seq: r for (req, seq), r in view.held.items() if req == _REQ}}
        parts.append(tuple(sorted((seq, r.fsm_state) for seq, r in loads.items())))
    for p in w.NODES:
        rounds = w.sessions[p].view.rounds.get(_REQ, {})
        parts.append(tuple(sorted((-1 if seq is None else seq, r.fsm_state)
                                  for seq, r in rounds.items())))
    return sess, tuple(parts)


# ------------------------------------------------------------------ paths
@dataclass(frozen=True, slots=True)
class SpecPath:
    """A behaviour of the graph: its initial node and each (action, node) step."""

    initial: str
    steps: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class PathIndex:
    """Shortest paths from the initial states, and each step's shallowest witness."""

    graph: StateGraph
    parent: dict[str, tuple[str, str] | None] = field(default_factory=dict)
    witness: dict[Step, str] = field(default_factory=dict)

    @classmethod
    def build(cls, graph: StateGraph) -> PathIndex:
        index = cls(graph)
        out: dict[str, list[tuple[str, str]]] = {}
        for src, dst, action, _steps in graph.steps():
            if action not in _UNREPLAYABLE:
                out.setdefault(src, []).append((dst, action))
        todo = deque(graph.initial)
        for node in graph.initial:
            index.parent[node] = None
        while todo:
            node = todo.popleft()
            for step in sorted(graph.fired.get(node, ())):
                index.witness.setdefault(step, node)
            for dst, action in out.get(node, ()):
                if dst not in index.parent:
                    index.parent[dst] = (node, action)
                    todo.append(dst)
        return index

    def path_to(self, step: Step) -> SpecPath:
        """The shortest behaviour whose last action takes ``step``.

        Raises:
            KeyError: the spec never takes it.
        """
        node = self.witness[step]
        steps: list[tuple[str, str]] = []
        while (link := self.parent[node]) is not None:
            steps.append((link[1], node))
            node = link[0]
        return SpecPath(node, tuple(reversed(steps)))


# ------------------------------------------------------------------ replay
@dataclass(frozen=True, slots=True)
class ReplayResult:
    """A replayed path: the inputs chosen and the sessions' trace, or why it failed."""

    ok: bool
    inputs: tuple[Op, ...]
    trace: tuple[TraceEvent, ...]
    failure: str = ""

    @property
    def taken(self) -> frozenset[Step]:
        """Every (machine, trigger, source, dest) the sessions took."""
        return frozenset(s for e in self.trace for s in e.steps)


def initial_world(state: dict[str, str], *, parts: bool = False,
                  profile: str = DEFAULT_PROFILE) -> ReplayWorld:
    """A ReplayWorld in the spec's initial state (handshake done when it says ready);
    ``parts``: the producer answers lookups in parts; ``profile``: the sessions' (the
    spec config's Profile)."""
    w = ReplayWorld(compatible=state["compat"] == "TRUE", parts=parts, profile=profile)
    if all(s in OPEN_STATES for s in _per_peer(state["sess"])):
        w.start()
        w.stabilize()
        w.trace.clear()
    return w


def replay(graph: StateGraph, path: SpecPath, *, max_tries: int = 5_000,
           profile: str = DEFAULT_PROFILE) -> ReplayResult:
    """Make two real sessions of ``profile`` follow ``path``: with the producer answering
    in one frame, else in parts (the module docstring)."""
    first = _replay(graph, path, max_tries=max_tries, parts=False, profile=profile)
    if first.ok:
        return first
    second = _replay(graph, path, max_tries=max_tries, parts=True, profile=profile)
    if second.ok:
        return second
    return ReplayResult(False, (), (), f"{first.failure}; answering lookups in parts: "
                                       f"{second.failure}")


def _replay(graph: StateGraph, path: SpecPath, *, max_tries: int,
            parts: bool, profile: str) -> ReplayResult:
    """One replay of ``path`` (``parts``: the producer answers lookups in parts).

    Worlds are rebuilt from the inputs chosen so far (sessions are cheap to re-run and
    re-running keeps the replay deterministic), so a failed choice leaves no trace.
    """
    init = graph.state(path.initial)

    def rebuild(inputs: tuple[Op, ...]) -> ReplayWorld:
        w = initial_world(init, parts=parts, profile=profile)
        for op in inputs:
            apply(w, op)
        return w

    start = rebuild(())
    if code_abstract(start) != spec_abstract(init):
        return ReplayResult(False, (), (), "the initial state differs: "
                            f"{code_abstract(start)} != {spec_abstract(init)}")
    deepest: list[tuple[int, str]] = [(-1, "")]
    tries = [0]

    def follow(i: int, inputs: tuple[Op, ...]) -> ReplayResult | None:
        if i == len(path.steps):
            return ReplayResult(True, inputs, tuple(rebuild(inputs).trace))
        action, node = path.steps[i]
        want_steps = graph.fired.get(node, frozenset())
        want = spec_abstract(graph.state(node))
        expected = [] if action in _SILENT else [(action, want_steps)]
        seen: list[str] = []
        for op in list(candidates(rebuild(inputs), action)):
            tries[0] += 1
            if tries[0] > max_tries:
                return None
            w = rebuild(inputs)
            before = len(w.trace)
            try:
                apply(w, op)
            except (SafetyViolation, LocalProtocolError) as exc:
                seen.append(f"{op}: {type(exc).__name__} {exc}")
                continue
            got = [(e.action, e.steps) for e in w.trace[before:]]
            if got != expected:
                seen.append(f"{op}: took {[(a, sorted(s)) for a, s in got]}")
                continue
            have = code_abstract(w)
            if have != want:
                seen.append(f"{op}: state {have} but the spec has {want}")
                continue
            done = follow(i + 1, (*inputs, op))
            if done is not None:
                return done
        if i > deepest[0][0]:
            deepest[0] = (i, f"step {i + 1}/{len(path.steps)} {action} "
                             f"(spec steps {sorted(want_steps)}): no input follows it; "
                             f"tried {seen or 'nothing (no candidate input)'}")
        return None

    result = follow(0, ())
    if result is not None:
        return result
    why = deepest[0][1] if tries[0] <= max_tries else f"gave up after {max_tries} inputs"
    return ReplayResult(False, (), (), why)


def describe(path: SpecPath) -> str:
    """``Action -> Action -> ...`` for messages."""
    return " -> ".join(a for a, _n in path.steps) or "(initial state)"


def replay_all(index: PathIndex, steps: Iterable[Step], *,
               profile: str = DEFAULT_PROFILE) -> dict[Step, ReplayResult]:
    """Replay the shortest path to each step (a failure for a step the spec never takes)
    with sessions of ``profile``."""
    never = ReplayResult(False, (), (), "the spec never takes this transition")
    return {step: replay(index.graph, index.path_to(step), profile=profile)
            if step in index.witness else never for step in steps}
