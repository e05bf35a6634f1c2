"""A counterexample step in the terms of ``models/``: its machine steps, frames, changes.

:func:`~p2pfsm.tools.verify.explain.explain` works these out from TLC's states;
:mod:`p2pfsm.tools.verify.printer` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Change", "Frame", "MachineStep", "Step"]


@dataclass(frozen=True, slots=True)
class MachineStep:
    """One machine instance changed state (or changed its record in the same state)."""

    machine: str
    peer: str
    instance: str
    source: str
    dest: str | None
    triggers: tuple[str, ...] = ()
    note: str = ""

    def text(self) -> str:
        who = f"{self.peer} {self.machine}" + (f" {self.instance}" if self.instance
                                               and self.machine != "session" else "")
        dest = self.dest if self.dest is not None else "(gone)"
        line = f"{who}: {self.source} -> {dest}"
        if self.triggers:
            line += f" ({', '.join(self.triggers)})"
        if self.note:
            line += f"  [{self.note}]"
        return line

    def as_json(self) -> dict[str, object]:
        return {"machine": self.machine, "peer": self.peer, "instance": self.instance,
                "source": self.source, "dest": self.dest, "triggers": list(self.triggers),
                "note": self.note}


_HANDSHAKE = frozenset({"connect", "connect_ack", "disconnect"})


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame ``<<type, req, seq, keys, dst, ok, hits, g>>`` from ``sender`` to ``receiver``."""

    type: str
    req: str
    seq: int
    keys: tuple[str, ...]
    job: int
    ok: bool
    hits: tuple[str, ...]
    allowed: bool
    sender: str
    receiver: str

    @classmethod
    def of(cls, raw: object, sender: str, receiver: str) -> Frame | None:
        if not (isinstance(raw, tuple) and len(raw) == 8):
            return None
        t, req, seq, keys, dst, ok, hits, g = raw
        if not (isinstance(t, str) and isinstance(req, str) and isinstance(seq, int)
                and isinstance(dst, int) and isinstance(keys, frozenset)
                and isinstance(hits, frozenset)):
            return None
        return cls(t, req, seq, tuple(sorted(map(str, keys))), dst, ok is True,
                   tuple(sorted(map(str, hits))), g is True, sender, receiver)

    def core(self) -> tuple[object, ...]:
        """The frame without its ghost ``g`` (a flushed frame gets a new one)."""
        return (self.type, self.req, self.seq, self.keys, self.job, self.ok, self.hits,
                self.sender)

    def text(self) -> str:
        parts = [self.type]
        if self.type not in _HANDSHAKE:
            parts.append(self.req if self.seq < 0 else f"{self.req}/{self.seq}")
            if self.type in ("fetch", "lookup", "lookup_resp"):
                parts.append(f"keys=[{', '.join(self.keys)}]")
            if self.type == "fetch" and not self.keys:
                parts.append("(terminal)")
            if self.type == "lookup_resp":
                parts.append(f"hits=[{', '.join(self.hits)}]")
            if self.type == "transfer_done":
                parts.append(f"ok={'TRUE' if self.ok else 'FALSE'}")
            if self.job:
                parts.append(f"job={self.job}")
        parts.append(f"{self.sender} -> {self.receiver}")
        if not self.allowed:
            parts.append("(on the wire before ready)")
        return " ".join(parts)

    def as_json(self) -> dict[str, object]:
        return {"type": self.type, "req": self.req, "seq": self.seq, "keys": list(self.keys),
                "job": self.job, "ok": self.ok, "hits": list(self.hits), "g": self.allowed,
                "from": self.sender, "to": self.receiver, "text": self.text()}


@dataclass(frozen=True, slots=True)
class Change:
    """One changed part of a variable: ``path`` (``sr[b][<<"r1", 0>>].supply``) before/after."""

    var: str
    path: str
    before: str
    after: str


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the behaviour, explained.

    Attributes:
        kind: "initial", "step", "stutter" (the lasso of a liveness counterexample
            stutters for ever) or "back" (it loops back to an earlier state).
        machine, trigger: the (machine, trigger) the action starts; None for an
            environment action (or one no model names).
        changed: every variable that changed, as (before, after) TLA+ text.
        parts: the same changes narrowed to the parts that changed.
        shown: the parts the text prints: those not already told by a machine step
            (``sess``, ``.st``) or a frame (``chan``, ``queue``).
    """

    index: int
    action: str
    kind: str
    machine: str | None
    trigger: str | None
    machine_steps: tuple[MachineStep, ...] = ()
    frames_sent: tuple[Frame, ...] = ()
    frames_delivered: tuple[Frame, ...] = ()
    frames_lost: tuple[Frame, ...] = ()
    frames_queued: tuple[Frame, ...] = ()
    changed: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    parts: tuple[Change, ...] = ()
    shown: tuple[Change, ...] = ()
    state: dict[str, str] = field(default_factory=dict)
