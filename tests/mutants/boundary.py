"""What a mutant may know: only the inputs a Session took and the outputs it gave.

:class:`Boundary` follows one session's load jobs (from HostFetch inputs and the fetch
frames that carry their destination indexes), its store jobs (HostSupply and lookup
answers) and its writes (StartWrite), so a mutant can say "the job of round r" or "the
pins write x reads" without reading any attribute of the session.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from p2pfsm.protocol import Fetch
from p2pfsm.session import (
    HostAnswerLookup,
    HostFetch,
    HostSupply,
    Input,
    LoadResult,
    Output,
    SendFrame,
    StartWrite,
    StoreResult,
)


@dataclass(slots=True)
class LoadJob:
    """A load job seen at the boundary; ``round_seq`` is set once its fetch is sent."""

    job_id: int
    kv_request_id: str
    dest: tuple[int, ...]
    round_seq: int | None = None
    order: int = 0
    done: bool = False


@dataclass(slots=True)
class Boundary:
    """The consumer's loads, the producer's pins and writes, from inputs and outputs."""

    loads: dict[int, LoadJob] = field(default_factory=dict)
    pins: dict[int, frozenset[int]] = field(default_factory=dict)
    writes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    _sent: int = 0

    def before(self, event: Input) -> None:
        if isinstance(event, HostFetch) and event.job_id not in self.loads:
            self.loads[event.job_id] = LoadJob(event.job_id, event.kv_request_id,
                                               tuple(event.dest_indexes))
        elif isinstance(event, HostSupply):
            self.pins.setdefault(event.job_id, frozenset(event.local_indexes))
        elif isinstance(event, HostAnswerLookup) and event.hits and event.job_id is not None:
            self.pins.setdefault(event.job_id, frozenset(event.hits.values()))

    def failed(self, event: Input) -> None:
        """The call raised (host misuse): it changed nothing, forget what ``before`` noted."""
        if isinstance(event, HostFetch):
            job = self.loads.get(event.job_id)
            if job is not None and job.round_seq is None and not job.done:
                del self.loads[event.job_id]

    def after(self, outputs: list[Output]) -> None:
        for out in outputs:
            if isinstance(out, SendFrame) and isinstance(out.message, Fetch):
                msg = out.message
                if msg.keys:
                    job = self.job_for_fetch(msg)
                    if job is not None:
                        self._sent += 1
                        job.round_seq, job.order = msg.round_seq, self._sent
            elif isinstance(out, LoadResult):
                job = self.loads.get(out.job_id)
                if job is not None:
                    job.done = True
            elif isinstance(out, StartWrite):
                self.writes[out.xfer] = tuple(out.local_indexes)
            elif isinstance(out, StoreResult):
                self.pins.pop(out.job_id, None)

    def job_for_fetch(self, msg: Fetch) -> LoadJob | None:
        """The open job a (non-terminal) fetch frame was sent for: its request and blocks."""
        dest = tuple(msg.block_indexes)
        for job in self.loads.values():
            if not job.done and job.kv_request_id == msg.kv_request_id and job.dest == dest:
                return job
        return None

    def open_rounds(self, kv_request_id: str) -> list[LoadJob]:
        """The request's jobs whose fetch went out and that have no result, oldest first."""
        return sorted((j for j in self.loads.values()
                       if j.kv_request_id == kv_request_id and not j.done
                       and j.round_seq is not None), key=lambda j: j.order)

    def job_of_round(self, kv_request_id: str, round_seq: int) -> LoadJob | None:
        return next((j for j in self.open_rounds(kv_request_id) if j.round_seq == round_seq),
                    None)

    def pins_read_by(self, local_indexes: tuple[int, ...]) -> list[int]:
        """The store jobs still pinned that hold one of these source blocks."""
        wanted = set(local_indexes)
        return sorted(job for job, blocks in self.pins.items() if blocks & wanted)
