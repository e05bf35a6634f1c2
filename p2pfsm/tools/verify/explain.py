"""A TLC counterexample told in the terms of ``models/``: machine steps, frames, changes.

TLC prints a behaviour as whole states. :func:`explain` reads each state's variables
(TLA+ values, read as machine instances by :mod:`p2pfsm.tools.verify.spec_state`) and, for
every step, works out what a reader of ``models/`` wants to know:

- the action and the (machine, trigger) it starts (:mod:`p2pfsm.tools.verify.names`), or
  that it is an environment action;
- each machine step the action made, from the diff of the per-machine state of
  ``tla/P2P.tla``: ``sess[p]`` (session), ``cr[p][<<req, seq>>].st`` (client_round),
  ``cl[p][req]`` (client_lookup, a list, oldest first), ``sr[p][<<req, seq>>].st``
  (server_round) and ``sl[p][req]`` (server_lookup, "resolving" while listed). An
  instance that appears came from the model's initial state; one that disappears went
  to a terminal state, chosen by what the step shows (a client round whose job got
  "orphan", a served lookup whose lookup_resp went out) and by the model's edges. The
  triggers are a shortest path of the model from source to dest over the action's
  trigger and the ones a call fires along (settle, request_closed, lookup_pin,
  session_lost when the session ended); when the state records ``fired`` (configs with
  ``TrackFired``) only its steps are used. A step no path of the model explains says
  so (:data:`NOT_IN_MODEL`): that is where a must-fail config's bug acts. A round whose
  record changed in the same state is a step too, and the action's own machine staying
  put (a re-sent abort) is found by the self-loop of its trigger. An unbound server
  round taken over by the request's first fetch is one step of the adopting round;
- the frames the step put on a channel, took off it (delivered, or lost to a fault) or
  queued until the session is ready, from the FIFO diff of ``chan[p]`` / ``queue[p]``;
- the variables that changed, before and after, narrowed to the parts that changed
  (``sr[b][<<"r1", 0>>].supply``); a variable that did not change is not listed.

:func:`p2pfsm.tools.verify.printer.render` prints the steps as blocks of lines (nothing is
cut), :func:`p2pfsm.tools.verify.printer.as_json` gives the same steps as plain data for
``p2pfsm check --json``. The steps themselves are :mod:`p2pfsm.tools.verify.steps`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from p2pfsm.fsm import MachineSpec, input_table, machines
from p2pfsm.tools.verify import tlc
from p2pfsm.tools.verify.names import action_map
from p2pfsm.tools.verify.spec_state import (
    Instances,
    align,
    instances,
    lookup_lists,
    lookup_name,
    lookup_state,
    parse_state,
    peers_of,
    value_at,
)
from p2pfsm.tools.verify.steps import Change, Frame, MachineStep, Step
from p2pfsm.tools.verify.tla_values import Fn, is_ident, show

# Bookkeeping of the spec, not protocol state: `fired` is told as machine steps, `act`
# (the last action, for fairness) is the step's action.
HIDDEN = frozenset({"fired", "act"})
_ENDED = machines()["session"].state_set("over")




# ---------------------------------------------------------------------------
# Working out a step


def _paths(spec: MachineSpec, allowed: frozenset[str] | None, source: str, dest: str,
           prefer: str | None, limit: int = 4) -> tuple[str, ...] | None:
    """Triggers of a path source -> dest (at least one edge when source is dest) over the
    model's edges whose trigger is allowed: the shortest that uses ``prefer`` (the
    action's own trigger), else the shortest; None when there is none of ``limit`` edges
    or fewer."""
    edges = sorted((s, t, d) for s, t, d in spec.edges() if allowed is None or t in allowed)
    shortest: tuple[str, ...] | None = None
    frontier: list[tuple[str, tuple[str, ...]]] = [(source, ())]
    seen = {(source, False)}
    for _depth in range(limit):
        following: list[tuple[str, tuple[str, ...]]] = []
        for state, path in frontier:
            for s, t, d in edges:
                if s != state:
                    continue
                new = (*path, t)
                used = prefer is not None and prefer in new
                if d == dest:
                    if used or prefer is None:
                        return new
                    shortest = shortest or new
                if (d, used) not in seen:
                    seen.add((d, used))
                    following.append((d, new))
        frontier = following
    return shortest


@dataclass(slots=True)
class _Context:
    specs: dict[str, MachineSpec]
    trigger: str | None
    allowed: dict[tuple[str, str], frozenset[str]]
    fired: dict[str, frozenset[tuple[str, str, str]]] | None

    def triggers(self, machine: str, peer: str, source: str, dest: str) -> tuple[str, ...]:
        spec = self.specs.get(machine)
        if spec is None:
            return ()
        if self.fired is not None:
            return _fired_path(self.fired.get(machine, frozenset()), source, dest) or ()
        allowed = self.allowed.get((machine, peer), frozenset())
        if source == dest:
            # A record changed in the same state: a settle that ends nothing changes no
            # record, so it alone explains nothing.
            allowed = allowed - {"settle"}
        return _paths(spec, allowed, source, dest, self.trigger) or ()

    def reachable(self, machine: str, peer: str, source: str, dest: str) -> bool:
        return bool(self.triggers(machine, peer, source, dest))


def _fired_path(edges: frozenset[tuple[str, str, str]], source: str, dest: str
                ) -> tuple[str, ...] | None:
    """Triggers of a shortest path source -> dest over the steps ``fired`` records, with
    the self-loops it fired on the states along the way (write_done in serving, then
    settle to done)."""
    loops = {s: sorted(t for s2, t, d in edges if s2 == s and d == s) for s, _t, _d in edges}
    moves = sorted((s, t, d) for s, t, d in edges if s != d)
    frontier: deque[tuple[str, tuple[str, ...]]] = deque([(source, ())])
    seen = {source}
    while frontier:
        state, path = frontier.popleft()
        here = (*path, *loops.get(state, ()))
        if state == dest and here:
            return here
        for s, t, d in moves:
            if s == state and d not in seen:
                seen.add(d)
                frontier.append((d, (*here, t)))
        if dest in seen and dest != source:
            break
    found = [p for st, p in frontier if st == dest]
    return (*found[0], *loops.get(dest, ())) if found else None


def _fired(values: Mapping[str, object]) -> dict[str, frozenset[tuple[str, str, str]]] | None:
    raw = values.get("fired")
    if not isinstance(raw, frozenset) or not raw:
        return None
    out: dict[str, set[tuple[str, str, str]]] = {}
    for entry in raw:
        if isinstance(entry, tuple) and len(entry) == 4 and all(isinstance(x, str) for x in entry):
            m, t, s, d = (str(x) for x in entry)
            out.setdefault(m, set()).add((s, t, d))
    return {m: frozenset(v) for m, v in out.items()}


def _frames(values: Mapping[str, object], var: str, sender: str, receiver: str
            ) -> tuple[object, ...]:
    lst = value_at(values.get(var), sender)
    return lst if isinstance(lst, tuple) else ()


def _fifo_diff(before: tuple[object, ...], after: tuple[object, ...]
               ) -> tuple[tuple[object, ...], tuple[object, ...]]:
    """(taken from the head, added at the tail) of a FIFO, fewest taken first."""
    for k in range(len(before) + 1):
        rest = before[k:]
        if after[:len(rest)] == rest:
            return before[:k], after[len(rest):]
    return before, after


def _as_frames(raw: Iterable[object], sender: str, receiver: str) -> list[Frame]:
    return [f for f in (Frame.of(r, sender, receiver) for r in raw) if f is not None]


ABSENT = "(none)"
"""The before or after of a map entry or sequence element that did not exist."""


def _key_path(path: str, key: object, index_names: frozenset[str]) -> str:
    if isinstance(key, str) and key in index_names:
        return f"{path}[{key}]"
    if is_ident(key):
        return f"{path}.{key}"
    return f"{path}[{show(key)}]"


def _narrow(var: str, path: str, before: object, after: object, index_names: frozenset[str],
            out: list[Change]) -> None:
    """The parts of a variable that changed: into functions and records key by key (an
    added or removed key shows :data:`ABSENT`), into sequences element by element when
    one is the other with elements changed or appended."""
    if before == after:
        return
    empty_b, empty_a = before == (), after == ()
    if (isinstance(before, Fn) or empty_b) and (isinstance(after, Fn) or empty_a) \
            and not (empty_b and empty_a):
        b = before if isinstance(before, Fn) else Fn()
        a = after if isinstance(after, Fn) else Fn()
        for key in [*b, *(k for k in a if k not in b)]:
            sub = _key_path(path, key, index_names)
            if key not in a:
                out.append(Change(var, sub, show(b[key]), ABSENT))
            elif key not in b:
                out.append(Change(var, sub, ABSENT, show(a[key])))
            else:
                _narrow(var, sub, b[key], a[key], index_names, out)
        return
    if isinstance(before, tuple) and isinstance(after, tuple):
        common = min(len(before), len(after))
        if len(before) == len(after) or before[:common] == after[:common]:
            for i in range(max(len(before), len(after))):
                sub = f"{path}[{i + 1}]"
                if i >= len(after):
                    out.append(Change(var, sub, show(before[i]), ABSENT))
                elif i >= len(before):
                    out.append(Change(var, sub, ABSENT, show(after[i])))
                else:
                    _narrow(var, sub, before[i], after[i], index_names, out)
            return
    out.append(Change(var, path, show(before), show(after)))


def _index_names(values: Mapping[str, object]) -> frozenset[str]:
    names = set(peers_of(values))
    for peer in peers_of(values):
        per_req = value_at(values.get("fl"), peer)
        if isinstance(per_req, Fn):
            names.update(str(k) for k in per_req)
    return frozenset(names)


def _told(change: Change) -> bool:
    """A change the machine steps or the frames already tell."""
    if change.var in ("chan", "queue", "sess"):
        return True
    return change.var in ("cr", "sr", "cl") and change.path.endswith(".st")


def _session_ended(before: Mapping[str, object], after: Mapping[str, object], peer: str) -> bool:
    b, a = value_at(before.get("sess"), peer), value_at(after.get("sess"), peer)
    return b not in _ENDED and a in _ENDED


_GATES: dict[str, str] = {t: i.gate for i in input_table().inputs if i.gate
                          for t in i.triggers}
"""Trigger of a frame -> the session gate it passes first (models/inputs.toml)."""


def _allowed(trigger: str | None, ended: bool) -> frozenset[str]:
    """Triggers one call may fire besides its own: settle on every round it touches,
    lookup_pin from a host answer, request_closed and host_finish from a finish,
    session_lost when the session ends, and the session's gate of a frame (a request's
    recv_request completes the handshake when the peer's ack was lost)."""
    out = {"settle"}
    if trigger is not None:
        out.add(trigger)
        if trigger in _GATES:
            out.add(_GATES[trigger])
    if trigger == "host_answer":
        out.add("lookup_pin")
    if trigger in ("host_finish", "recv_terminal_fetch"):
        out.add("request_closed")
    if ended:
        out |= {"session_lost", "request_closed"}
    return frozenset(out)


NOT_IN_MODEL = "no transition of models/ does this"


def _step(ctx: _Context, machine: str, peer: str, name: str, source: str, dest: str | None,
          note: str = "") -> MachineStep:
    """A machine step with the triggers that explain it, or a note that none does."""
    triggers = ctx.triggers(machine, peer, source, dest) if dest is not None else ()
    if not triggers and machine in ctx.specs:
        note = f"{note}; {NOT_IN_MODEL}" if note else NOT_IN_MODEL
    return MachineStep(machine, peer, name, source, dest, triggers, note)


def _adopted(old: Instances, new: Instances, gone: tuple[str, str, str],
             fresh: Sequence[tuple[str, str, str]]) -> tuple[str, str, str] | None:
    """The round that took over an unbound server round (the request's first fetch
    adopts it): same request, a seq, and the unbound round's store jobs."""
    machine, peer, name = gone
    if machine != "server_round" or not name.endswith("/unbound"):
        return None
    jobs = value_at(old[gone][1], "jobs")
    for key in fresh:
        if key[:2] == (machine, peer) and key[2].split("/")[0] == name.split("/")[0]:
            got = value_at(new[key][1], "jobs")
            if isinstance(jobs, frozenset) and jobs and isinstance(got, frozenset) \
                    and jobs <= got:
                return key
    return None


def _machine_steps(before: Mapping[str, object], after: Mapping[str, object],
                   ctx: _Context, sent: Sequence[Frame]) -> list[MachineStep]:
    steps: list[MachineStep] = []
    old, new = instances(before), instances(after)
    fresh = [k for k in sorted(new) if k not in old]
    taken: set[tuple[str, str, str]] = set()
    for key in sorted(old):
        machine, peer, name = key
        s, rec = old[key]
        if key in new:
            d, rec_a = new[key]
            if s != d or rec != rec_a:
                steps.append(_step(ctx, machine, peer, name, s, d))
        elif (heir := _adopted(old, new, key, fresh)) is not None:
            taken.add(heir)
            steps.append(_step(ctx, machine, peer, heir[2], s, new[heir][0],
                               f"adopts {name}"))
        else:
            steps.append(_ended_instance(machine, peer, name, s, rec, before, after, ctx))
    for key in fresh:
        if key not in taken:
            machine, peer, name = key
            spec = ctx.specs.get(machine)
            steps.append(_step(ctx, machine, peer, name, spec.initial if spec else "?",
                               new[key][0]))
    for peer in sorted(set(peers_of(before)) | set(peers_of(after))):
        steps.extend(_lookup_steps(before, after, ctx, peer, sent))
    order = {m: i for i, m in enumerate(MACHINE_ORDER)}
    return sorted(steps, key=lambda m: (order.get(m.machine, 9), m.peer, m.instance))


MACHINE_ORDER = ("session", "client_round", "client_lookup", "server_round", "server_lookup")


def _terminal_dest(machine: str, peer: str, source: str, ctx: _Context,
                   prefer: Sequence[str] = ()) -> str | None:
    spec = ctx.specs.get(machine)
    if spec is None:
        return None
    for dest in prefer:
        if ctx.reachable(machine, peer, source, dest):
            return dest
    found = [d for d in sorted(spec.terminal) if ctx.reachable(machine, peer, source, d)]
    if len(found) > 1 and ctx.trigger is not None:
        mine = [d for d in found if ctx.trigger in ctx.triggers(machine, peer, source, d)]
        found = mine or found
    return found[0] if len(found) == 1 else None


def _ended_instance(machine: str, peer: str, name: str, source: str, rec: object,
                    before: Mapping[str, object], after: Mapping[str, object],
                    ctx: _Context) -> MachineStep:
    note = ""
    dest: str | None
    if machine == "client_round":
        job = value_at(rec, "job")
        results = value_at(after.get("lres"), peer)
        result = (value_at(results[job - 1], "r") if isinstance(results, tuple)
                  and isinstance(job, int) and 0 < job <= len(results) else None)
        if _session_ended(before, after, peer):
            dest = "orphaned" if result == "orphan" else "done"
        elif result == "pending":
            dest, note = None, f"forgotten: job {job} never gets a result"
        else:
            dest = "aborted" if source == "aborting" else "done"
    else:
        dest = _terminal_dest(machine, peer, source, ctx)
    return _step(ctx, machine, peer, name, source, dest, note)


def _lookup_steps(before: Mapping[str, object], after: Mapping[str, object], ctx: _Context,
                  peer: str, sent: Sequence[Frame]) -> list[MachineStep]:
    steps: list[MachineStep] = []
    for var, machine in (("cl", "client_lookup"), ("sl", "server_lookup")):
        spec = ctx.specs.get(machine)
        initial = spec.initial if spec is not None else "new"
        old, new = lookup_lists(before, var, peer), lookup_lists(after, var, peer)
        for req in sorted(set(old) | set(new)):
            b, a = old.get(req, ()), new.get(req, ())
            for i, j in align(b, a):
                rec = b[i] if i is not None else a[j] if j is not None else None
                name = lookup_name(req, rec)

                if i is not None and j is not None:
                    if b[i] == a[j]:
                        continue
                    steps.append(_step(ctx, machine, peer, name, lookup_state(b[i]),
                                       lookup_state(a[j])))
                elif j is not None:
                    steps.append(_step(ctx, machine, peer, name, initial, lookup_state(a[j])))
                elif i is not None:
                    s = lookup_state(b[i])
                    prefer: list[str] = []
                    if machine == "server_lookup":
                        keys = value_at(b[i], "keys")
                        answered = any(
                            f.type == "lookup_resp" and f.req == req and f.sender == peer
                            and isinstance(keys, frozenset)
                            and f.keys == tuple(sorted(map(str, keys))) for f in sent)
                        prefer = ["answered" if answered else "dropped"]
                    elif _session_ended(before, after, peer):
                        prefer = ["cancelled"]
                    dest = _terminal_dest(machine, peer, s, ctx, prefer)
                    steps.append(_step(ctx, machine, peer, name, s, dest))
    return steps


def _stays(before: Mapping[str, object], ctx: _Context, machine: str, trigger: str
           ) -> list[MachineStep]:
    """The action's own machine stayed in its state (a self-loop the diff cannot show):
    the one instance whose state has that self-loop, if it is the only one."""
    spec = ctx.specs.get(machine)
    if spec is None:
        return []
    loops = {s for s, t, d in spec.edges() if t == trigger and s == d}
    found: list[MachineStep] = []
    for (m, peer, name), (st, _rec) in instances(before).items():
        if m == machine and st in loops:
            found.append(MachineStep(m, peer, name, st, st, (trigger,)))
    for peer in peers_of(before):
        for var in ("cl", "sl"):
            for req, lst in lookup_lists(before, var, peer).items():
                for rec in lst:
                    st = lookup_state(rec)
                    if machine == ("client_lookup" if var == "cl" else "server_lookup") \
                            and st in loops:
                        found.append(MachineStep(machine, peer, lookup_name(req, rec), st, st,
                                                 (trigger,)))
    return found if len(found) == 1 else []


def explain(trace: Sequence[tlc.TraceStep],
            specs: dict[str, MachineSpec] | None = None) -> list[Step]:
    """Each state of a TLC counterexample as a :class:`Step` in the models' terms."""
    specs = machines() if specs is None else specs
    actions = action_map(specs)
    out: list[Step] = []
    previous: dict[str, object] = {}
    for raw in trace:
        values = parse_state(raw.state)
        if raw.action.startswith("Back to state") or raw.action == "Stuttering":
            kind = "back" if raw.action.startswith("Back") else "stutter"
            out.append(Step(raw.index, raw.action, kind, None, None, state=dict(raw.state)))
            continue
        pair = actions.get(raw.action)
        machine, trigger = pair if pair is not None else (None, None)
        if not previous:
            out.append(_initial(raw, values, specs))
            previous = values
            continue
        index_names = _index_names(values)
        changed: dict[str, tuple[str | None, str]] = {}
        parts: list[Change] = []
        for name in sorted(set(previous) | set(values)):
            if name in HIDDEN:
                continue
            b, a = previous.get(name), values.get(name)
            if b != a:
                changed[name] = (show(b), show(a))
                _narrow(name, name, b, a, index_names, parts)
        peers = sorted(set(peers_of(previous)) | set(peers_of(values)))
        sent: list[Frame] = []
        taken: list[Frame] = []
        queued: list[Frame] = []
        unsent: list[Frame] = []
        for p in peers:
            q = next((x for x in peers if x != p), p)
            gone, added = _fifo_diff(_frames(previous, "chan", p, q), _frames(values, "chan", p, q))
            taken += _as_frames(gone, p, q)
            sent += _as_frames(added, p, q)
            gone, added = _fifo_diff(_frames(previous, "queue", p, q),
                                     _frames(values, "queue", p, q))
            queued += _as_frames(added, p, q)
            flushed = {f.core() for f in sent}
            unsent += [f for f in _as_frames(gone, p, q) if f.core() not in flushed]
        lost = raw.action in ("NetworkDrop", "NetworkCut")
        ctx = _Context(specs, trigger,
                       {(m, p): _allowed(trigger, _session_ended(previous, values, p))
                        for m in specs for p in peers},
                       _fired(values))
        steps = _machine_steps(previous, values, ctx, sent)
        if machine is not None and trigger is not None and ctx.fired is None \
                and not any(s.machine == machine for s in steps):
            steps += _stays(previous, ctx, machine, trigger)
        out.append(Step(
            raw.index, raw.action, "step", machine, trigger, tuple(steps), tuple(sent),
            () if lost else tuple(taken), tuple(taken if lost else ()) + tuple(unsent),
            tuple(queued), changed, tuple(parts), tuple(c for c in parts if not _told(c)),
            dict(raw.state)))
        previous = values
    return out


def _initial(raw: tlc.TraceStep, values: Mapping[str, object],
             specs: dict[str, MachineSpec]) -> Step:
    steps = [MachineStep(m, p, n, st, st)
             for (m, p, n), (st, _r) in sorted(instances(values).items())]
    peers = peers_of(values)
    sent: list[Frame] = []
    queued: list[Frame] = []
    for p in peers:
        q = next((x for x in peers if x != p), p)
        sent += _as_frames(_frames(values, "chan", p, q), p, q)
        queued += _as_frames(_frames(values, "queue", p, q), p, q)
    changed: dict[str, tuple[str | None, str]] = {
        k: (None, show(v)) for k, v in sorted(values.items()) if k not in HIDDEN}
    parts = tuple(Change(k, k, "", a) for k, (_b, a) in changed.items())
    return Step(raw.index, raw.action, "initial", None, None, tuple(steps), tuple(sent), (),
                (), tuple(queued), changed, parts, parts, dict(raw.state))
