"""What a tier manager sees of a session, recorded: every control frame it sent and
received (:class:`RecordingConnection`), and its public interface over time
(:class:`Trace`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from vllm.v1.kv_offload.tiering.p2p.control.base import ControlConnection
from vllm.v1.kv_offload.tiering.p2p.session import P2PSession

MAX_FRAMES = 10_000
"""Frames recorded per connection; a peer that sends more (a flood) is counted only."""


def summarize(msg: Any) -> dict[str, Any]:
    """One control frame, as the test wants to see it (no NIXL blob, no key bytes)."""
    if not isinstance(msg, dict):
        return {"type": repr(msg)}
    out: dict[str, Any] = {"type": msg.get("type")}
    for name in ("kv_request_id", "round_seq", "success", "hits", "block_len",
                 "config_fingerprint", "hash_seed"):
        if name in msg:
            out[name] = msg[name]
    keys = msg.get("keys")
    if isinstance(keys, list):
        out["nkeys"] = len(keys)
    return out


class RecordingConnection(ControlConnection):  # type: ignore[misc]
    """Wraps vLLM's ZmqConnection and records every frame the session receives or sends."""

    def __init__(self, inner: ControlConnection) -> None:
        super().__init__(inner.peer_id)
        self.inner = inner
        self.frames: list[dict[str, Any]] = []
        self.dropped = 0  # frames past MAX_FRAMES, not recorded
        self.fetches: dict[str, list[bytes]] = {}
        self.lookups: set[str] = set()
        self.t0 = time.monotonic()

    def _note(self, way: str, msg: Any) -> None:
        if len(self.frames) >= MAX_FRAMES:  # a flooding peer: the harness stays bounded
            self.dropped += 1
            return
        entry = summarize(msg)
        entry["dir"] = way
        entry["t_ms"] = round((time.monotonic() - self.t0) * 1000, 1)
        self.frames.append(entry)

    @property
    def alive(self) -> bool:
        return bool(self.inner.alive)

    def send(self, msg: dict[str, Any]) -> None:
        self._note("out", msg)
        self.inner.send(msg)

    def recv(self) -> Sequence[dict[str, Any]]:
        msgs: Sequence[dict[str, Any]] = self.inner.recv()
        for msg in msgs:
            self._note("in", msg)
            if isinstance(msg, dict) and isinstance(msg.get("kv_request_id"), str):
                rid = msg["kv_request_id"]
                keys = msg.get("keys")
                if (msg.get("type") == "fetch" and isinstance(keys, list)
                        and all(isinstance(k, bytes) for k in keys)):  # a hostile peer's
                    self.fetches[rid] = list(keys)  # malformed keys are the session's to refuse
                elif msg.get("type") == "lookup":
                    self.lookups.add(rid)
        return msgs

    def mark_dead(self) -> None:
        self.inner.mark_dead()

    def close(self) -> None:
        self.inner.close()


class Trace:
    """What a tier manager sees of one session, in order, timing left out: each poll's
    loads / stores / new fetch ids, each change of ``ready`` / ``alive`` / ``connected``
    (with ``death_reason`` once ``alive`` fell), lookup answers, and ``close()``'s result.
    Job ids are numbered per session in order of first appearance (a server's job
    counter is shared by its sessions) and request ids are kept as given."""

    def __init__(self) -> None:
        self.loads: list[list[Any]] = []
        self.stores: list[list[Any]] = []
        self.new_fetch_ids: list[str] = []
        self.transitions: list[list[Any]] = []
        self.lookups: list[list[Any]] = []
        self.close: dict[str, Any] | None = None
        self.state: dict[str, Any] = {}
        self.jobs: dict[int, int] = {}

    def job(self, job_id: int) -> int:
        return self.jobs.setdefault(job_id, len(self.jobs) + 1)

    def observe(self, session: P2PSession) -> None:
        for name in ("connected", "ready", "alive"):
            value = bool(getattr(session, name))
            if self.state.get(name) != value:
                self.state[name] = value
                self.transitions.append([name, value])
                if name == "alive" and not value:
                    self.transitions.append(["death_reason", session.death_reason])

    def polled(self, session: P2PSession, result: Any) -> None:
        if len(self.loads) + len(self.stores) + len(self.new_fetch_ids) >= MAX_FRAMES:
            self.observe(session)  # a flooding peer: its results are not recorded
            return
        self.loads += [[self.job(r.job_id), bool(r.success)] for r in result.loads]
        self.stores += [[self.job(r.job_id), bool(r.success)] for r in result.stores]
        self.new_fetch_ids += list(result.new_fetch_ids)
        self.observe(session)

    def closed(self, result: Any) -> None:
        self.close = {"failed_jobs": sorted(self.job(j) for j in result.failed_jobs),
                      "failed_req_ids": sorted(result.failed_req_ids),
                      "failed_stores": sorted(self.job(j) for j in result.failed_stores),
                      "failed_serves": len(result.failed_serves)}

    def report(self) -> dict[str, Any]:
        return {"loads": self.loads, "stores": self.stores,
                "new_fetch_ids": self.new_fetch_ids, "transitions": self.transitions,
                "lookups": self.lookups, "close": self.close}
