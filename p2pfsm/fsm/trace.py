"""The one tracing hook: every fired transition as (machine, instance, trigger, source, dest)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One fired transition."""

    machine: str
    instance: str
    trigger: str
    source: str
    dest: str


@dataclass(slots=True)
class Tracer:
    """Collects :class:`TraceRecord` in firing order; attach one per session (or share)."""

    records: list[TraceRecord] = field(default_factory=list)

    def record(self, machine: str, instance: str, trigger: str, source: str, dest: str) -> None:
        self.records.append(TraceRecord(machine, instance, trigger, source, dest))

    def edges(self) -> set[tuple[str, str, str, str]]:
        """The distinct (machine, source, trigger, dest) edges seen."""
        return {(r.machine, r.source, r.trigger, r.dest) for r in self.records}


class TraceCursor:
    """A tracer's records handed out call by call: :meth:`take` returns those recorded
    since the last take (or skip), :meth:`skip` passes over them (a call that raised).
    What a call hook uses to tell each ``Session.handle`` call's machine steps."""

    __slots__ = ("_mark", "_tracer")

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self._mark = len(tracer.records)

    def take(self) -> list[TraceRecord]:
        records = self._tracer.records[self._mark:]
        self._mark += len(records)
        return records

    def skip(self) -> None:
        self._mark = len(self._tracer.records)
