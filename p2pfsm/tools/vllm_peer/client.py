"""The harness's client role: one session to a server (:class:`Link`), one flow over it
(:func:`run_client`: a PD fetch, or a symmetric lookup then fetch), every byte verified
against the demo block model, one ``result`` line."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey

from p2pfsm.demo_blocks import demo_block, demo_key
from p2pfsm.tools.vllm_peer.common import (
    STOP,
    bind_transport,
    emit,
    make_data,
    make_region,
    new_session,
    parse_blocks,
    session_kind,
    wait_for_frames,
)
from p2pfsm.tools.vllm_peer.patches import set_client_timeouts
from p2pfsm.tools.vllm_peer.recording import RecordingConnection, Trace


class Link:
    """One client session to one server: its transports, region and public-interface
    trace; every ``poll()`` goes through :meth:`pump`."""

    def __init__(self, args: argparse.Namespace, nblocks: int) -> None:
        self.args = args
        self.config = json.loads(args.config_json) if args.config_json else None
        self.region = make_region(max(nblocks, 1), args.block_len)
        self.transport, self.local_id = bind_transport()
        self.data = make_data(self.region, self.config)
        self.rec = RecordingConnection(self.transport.connect(args.connect))
        self.session = new_session(args.connect, self.local_id, self.data, args.block_len,
                                   args.hash_seed, self.rec)
        self.kind = session_kind()
        self.trace = Trace()
        self.trace.observe(self.session)
        self.loads: list[Any] = []
        self.closed = False

    def pump(self) -> None:
        self.transport.poll()
        result = self.session.poll()
        self.loads.extend(result.loads)
        self.trace.polled(self.session, result)

    def landed(self, dest: list[int], blocks: list[int]) -> list[int]:
        bl = self.args.block_len
        return [b for d, b in zip(dest, blocks, strict=True)
                if self.region[d].tobytes() == demo_block(b, bl)]

    def close(self, report: dict[str, Any]) -> None:
        """Close as vLLM's manager does (its reaper, or its shutdown); fill ``report``."""
        if self.closed:
            return
        self.closed = True
        alive = self.session.alive  # read before close(): close() drops the connection
        report["session_alive"] = alive
        report["death_reason"] = None if alive else self.session.death_reason
        self.trace.closed(self.session.close())
        report["frames"] = self.rec.frames
        report["trace"] = self.trace.report()
        self.transport.close()
        self.data.close()


def run_client(args: argparse.Namespace, name: str | None = None) -> int:
    """One session to ``--connect``: the flow ``--mode`` / ``--keys``; one result line."""
    set_client_timeouts(args.load_timeout, args.abort_ack_timeout)
    blocks = parse_blocks(args.keys)
    link = Link(args, len(blocks))
    report: dict[str, Any] = {"mode": args.mode, "keys": len(blocks), "peer_id": link.local_id,
                              "sessions": link.kind, "fingerprint": link.data.config_fingerprint,
                              "request_id": args.request_id}
    if name is not None:
        report["name"] = name
    try:
        run_client_flow(args, link, blocks, report)
    finally:
        link.close(report)
    emit("result", **report)
    return 0 if report.get("success") and report.get("verified") else 1


def wait_ready(links: Sequence[Link], seconds: float) -> None:
    end = time.monotonic() + seconds
    while (not all(k.session.ready or not k.session.alive for k in links)
           and time.monotonic() < end and not STOP):
        for k in links:
            k.pump()
        wait_for_frames(links[0].transport)


def run_client_flow(args: argparse.Namespace, link: Link, blocks: list[int],
                    report: dict[str, Any]) -> None:
    wait_ready([link], args.handshake_timeout)
    report["ready"] = link.session.ready
    if not link.session.ready:
        report.update(success=False, verified=False, error="handshake did not complete")
        return
    attempts: list[dict[str, Any]] = []
    for job in range(1, args.repeat + 1):
        link.region[:] = 0  # each attempt's bytes are verified on their own
        attempt = one_attempt(args, link, blocks, job)
        attempts.append(attempt)
        if "error" in attempt:
            break
    report.update(attempts[-1])
    report["attempts"] = attempts
    report["success"] = all(a["success"] for a in attempts) and len(attempts) == args.repeat
    report["verified"] = all(a["verified"] for a in attempts) and report["success"]
    report["late_loads"] = [(r.job_id, r.success) for r in link.loads
                            if r.job_id not in {a.get("job") for a in attempts}]
    # The flow is over but the session is still open: a p2pfsm server under test can
    # look at its own state now, before our disconnect ends it.
    emit("done", success=report["success"])
    end = time.monotonic() + args.hold_open
    while time.monotonic() < end and link.session.alive and not STOP:
        link.pump()
        wait_for_frames(link.transport)


def one_attempt(args: argparse.Namespace, link: Link, blocks: list[int],
                job: int) -> dict[str, Any]:
    """One lookup (sym) and fetch of ``blocks`` under ``--request-id``; its report."""
    kv = args.request_id
    session = link.session
    keys = [OffloadKey(demo_key(b)) for b in blocks]
    out: dict[str, Any] = {"job": job}
    t0 = time.monotonic()
    chosen = list(blocks)
    if args.mode == "sym":
        for key in keys:
            session.register_lookup(kv, key)
        answers: list[bool | None] = [None] * len(keys)
        end = time.monotonic() + args.lookup_timeout
        while any(a is None for a in answers) and session.alive and time.monotonic() < end:
            session.flush_pending_lookups()
            link.pump()
            answers = [session.register_lookup(kv, key) for key in keys]
            if any(a is None for a in answers):
                wait_for_frames(link.transport)  # no tick once the answer is in
        link.trace.lookups.append(answers)
        out["lookup_seconds"] = round(time.monotonic() - t0, 4)
        if any(a is None for a in answers):
            return {**out, "success": False, "verified": False,
                    "error": "lookup was not answered"}
        chosen = [b for b, hit in zip(blocks, answers, strict=True) if hit]
        out["hits"] = len(chosen)
    dest = list(range(len(chosen)))
    success = True
    if chosen:
        session.request_blocks(job, kv, [OffloadKey(demo_key(b)) for b in chosen], dest)
        link.trace.observe(session)
        limit = args.load_timeout + args.abort_ack_timeout + 5
        end = time.monotonic() + limit
        result = None
        while result is None and session.alive and time.monotonic() < end and not STOP:
            link.pump()
            result = next((r for r in link.loads if r.job_id == job), None)
            if result is None:
                wait_for_frames(link.transport)  # no tick once the load is in
        if result is None:
            return {**out, "success": False, "verified": False,
                    "error": f"no load result in {limit} s"}
        success = bool(result.success)
        # vLLM 0.34.0 reports an aborted load failed at once and frees its blocks only
        # once this event is set, as its tiering manager does: so does the harness,
        # before a next attempt reuses them.
        release = getattr(result, "deferred_release", None)
        while (release is not None and not release.is_set() and session.alive
               and time.monotonic() < end and not STOP):
            link.pump()
            wait_for_frames(link.transport)
        if release is not None:
            out["released"] = release.is_set()
    out["seconds"] = round(time.monotonic() - t0, 4)
    if args.mode == "sym":
        session.finish_request(kv)
        link.trace.observe(session)
    # Let the last frames (a terminal fetch, the peer's late replies) go out and in.
    end = time.monotonic() + args.linger
    while time.monotonic() < end and session.alive:
        link.pump()
        wait_for_frames(link.transport)
    good = link.landed(dest, chosen)
    out.update(success=success, verified=success and len(good) == len(chosen), landed=good,
               chosen=chosen, bytes=len(chosen) * args.block_len if success else 0)
    return out
