"""The harness's longer client runs: a plan of flows and kills (:func:`run_plan`, for the
interop suite), sessions of both kinds fetching in turn (:func:`run_links`, for the
benchmark matrix), and fetches kept in flight at once (:func:`run_concurrent`)."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey

from p2pfsm.demo_blocks import demo_key
from p2pfsm.tools.vllm_peer.client import Link, one_attempt, run_client, wait_ready
from p2pfsm.tools.vllm_peer.common import STOP, emit, parse_blocks, wait_for_frames
from p2pfsm.tools.vllm_peer.patches import set_client_timeouts


def use_sessions(kind: str) -> None:
    """Make ``new_session`` build vLLM's sessions (``vllm``) or p2pfsm's (``p2pfsm``)."""
    from p2pfsm.vllm import install, uninstall

    if kind == "p2pfsm":
        install()
    elif kind == "vllm":
        uninstall()
    else:
        raise ValueError(f"unknown sessions {kind!r} (vllm or p2pfsm)")


def read_plan(path: str, seconds: float) -> dict[str, Any]:
    """The plan file, once it exists (the test writes it atomically when its servers are
    up); waits at most ``seconds``."""
    end = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() >= end or STOP:
            raise RuntimeError(f"no plan at {path} within {seconds:.0f} s")
        time.sleep(0.05)  # a file to appear: nothing to block on
    with open(path) as f:
        plan: dict[str, Any] = json.load(f)
    return plan


def run_plan(args: argparse.Namespace) -> int:
    """Every step of ``--plan``, one after another: ``flow`` steps are one session and one
    client flow each (the client options as keys), ``kill`` steps are :func:`run_kill`.
    Each flow builds its own session of the kind the step names."""
    plan = read_plan(args.plan, args.max_seconds)
    failures = 0
    for step in plan["steps"]:
        use_sessions(step.get("sessions", "vllm"))
        if step["kind"] == "kill":
            run_kill(args, step)
            continue
        flow = argparse.Namespace(**{**vars(args), **{k.replace("-", "_"): v
                                                      for k, v in step["args"].items()}})
        failures += run_client(flow, name=step["name"]) != 0
    emit("plan_done", failures=failures)
    return 0


def run_kill(args: argparse.Namespace, step: dict[str, Any]) -> None:
    """Sessions that each fetch ``keys`` and stay in flight: once every session has the
    blocks ``landed`` in its region and has sent its ``connect_ack``, one ``in_flight`` line;
    the test then kills a process (this one or a server). Each surviving session is
    polled until it is no longer alive, then closed as vLLM's manager reaps it; one
    ``result`` line each, with the seconds from ``in_flight`` to the death."""
    set_client_timeouts(args.load_timeout, args.abort_ack_timeout)
    blocks = parse_blocks(step["keys"])
    want = parse_blocks(step["landed"])
    links: list[tuple[dict[str, Any], Link]] = []
    for target in step["targets"]:
        use_sessions(target["sessions"])
        one = argparse.Namespace(**{**vars(args), "connect": target["connect"]})
        links.append((target, Link(one, len(blocks))))
    wait_ready([k for _, k in links], args.handshake_timeout)
    dest = list(range(len(blocks)))
    for target, k in links:
        k.session.request_blocks(1, target["request_id"],
                                 [OffloadKey(demo_key(b)) for b in blocks], dest)
        k.trace.observe(k.session)
    def in_flight(k: Link) -> bool:
        # Our connect_ack is out too: vLLM sends it once it registered the peer's data
        # plane, which may come after the peer's first writes landed.
        acked = any(f["dir"] == "out" and f["type"] == "connect_ack" for f in k.rec.frames)
        return acked and k.landed(dest[:len(want)], want) == want

    end = time.monotonic() + step["seconds"]
    while (not all(in_flight(k) for _, k in links)
           and time.monotonic() < end and not STOP):
        for _, k in links:
            k.pump()
        wait_for_frames(links[0][1].transport)
    emit("in_flight", peers=[k.local_id for _, k in links],
         landed=[k.landed(dest[:len(want)], want) for _, k in links])
    t0 = time.monotonic()
    died: dict[int, float] = {}
    end = t0 + step["seconds"]
    while len(died) < len(links) and time.monotonic() < end and not STOP:
        for i, (_, k) in enumerate(links):
            if i in died:
                continue
            k.pump()
            if not k.session.alive:
                died[i] = round(time.monotonic() - t0, 3)
        wait_for_frames(links[0][1].transport)
    for i, (target, k) in enumerate(links):
        report: dict[str, Any] = {"name": target["name"], "sessions": k.kind,
                                  "died_after": died.get(i),
                                  "landed": k.landed(dest[:len(want)], want),
                                  "loads": [(r.job_id, r.success) for r in k.loads]}
        k.close(report)
        emit("result", **report)


def parse_links(text: str) -> list[tuple[str, str]]:
    """``"vllm=H:P,p2pfsm=H:P"`` -> [(sessions, address), ...]; a ValueError if malformed."""
    out: list[tuple[str, str]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, sep, addr = part.partition("=")
        if not sep or kind not in ("vllm", "p2pfsm") or ":" not in addr:
            raise ValueError(f"--links: expected SESSIONS=HOST:PORT with SESSIONS vllm or "
                             f"p2pfsm, got {part!r}")
        out.append((kind, addr))
    if not out:
        raise ValueError("--links: need at least one SESSIONS=HOST:PORT")
    return out


def run_links(args: argparse.Namespace) -> int:
    """One session per ``--links`` entry, all in this process, fetching in turn: attempt
    ``i`` runs one fetch on every link, starting at link ``i mod n``. Sessions of both
    kinds thus share this process, its load and its minute; one ``result`` line per link
    (``name`` is its index). Only pd mode: one fetch, nothing else, per attempt."""
    set_client_timeouts(args.load_timeout, args.abort_ack_timeout)
    blocks = parse_blocks(args.keys)
    links: list[Link] = []
    for kind, addr in parse_links(args.links):
        use_sessions(kind)
        links.append(Link(argparse.Namespace(**{**vars(args), "connect": addr}), len(blocks)))
    wait_ready(links, args.handshake_timeout)
    attempts: list[list[dict[str, Any]]] = [[] for _ in links]
    failed = not all(k.session.ready for k in links)
    for job in range(1, args.repeat + 1):
        if failed:
            break
        for n in range(len(links)):
            i = (job + n) % len(links)
            links[i].region[:] = 0
            attempts[i].append(one_attempt(args, links[i], blocks, job))
            failed = failed or "error" in attempts[i][-1]
    for i, k in enumerate(links):
        report: dict[str, Any] = {"name": str(i), "mode": args.mode, "keys": len(blocks),
                                  "sessions": k.kind, "connect": k.args.connect,
                                  "ready": k.session.ready, "attempts": attempts[i]}
        report["success"] = len(attempts[i]) == args.repeat and all(
            a["success"] for a in attempts[i])
        report["verified"] = report["success"] and all(a["verified"] for a in attempts[i])
        k.close(report)
        emit("result", **report)
    return 0 if all(k.session is not None for k in links) and not failed else 1


def _drive(links: Sequence[Link], want: dict[int, Link], end: float) -> None:
    """Pump ``links`` until every job in ``want`` has its load result (or ``end``)."""
    while want and time.monotonic() < end and not STOP:
        for k in links:
            k.pump()
        for k in links:
            for r in k.loads:
                if r.job_id in want:
                    if not r.success:
                        raise RuntimeError(f"load {r.job_id} failed")
                    del want[r.job_id]
            k.loads.clear()
        if want:
            wait_for_frames(links[0].transport)
    if want:
        raise RuntimeError(f"{len(want)} loads not done in time")


def run_concurrent(args: argparse.Namespace) -> int:
    """``--concurrent C``: ``--repeat`` rounds of C fetches of ``--per-request`` blocks
    issued together on one session, polled until all are done; each round's seconds.
    With ``--links-count P`` and ``--saturate N`` instead: P sessions each keeping
    ``--concurrent`` one-block fetches in flight until N are done; CPU seconds of this
    process over that window. One ``result`` line."""
    set_client_timeouts(args.load_timeout)
    per, width = args.per_request, args.concurrent
    links = [Link(args, width * per) for _ in range(args.links_count)]
    wait_ready(links, args.handshake_timeout)
    if not all(k.session.ready for k in links):
        emit("result", success=False, error="handshake did not complete")
        return 1
    job = 0
    report: dict[str, Any] = {"success": True, "sessions": links[0].kind}
    try:
        if args.saturate:
            def start(k: Link, slot: int) -> int:
                nonlocal job
                job += 1
                k.session.request_blocks(job, f"sat-{job}", [OffloadKey(demo_key(slot))],
                                         [slot])
                return job

            for phase, count in (("warm", max(width * len(links), args.saturate // 10)),
                                 ("run", args.saturate)):
                if phase == "run":  # the parent samples the server's CPU at these lines
                    emit("window", at="start")
                live = {start(k, j): (k, j) for k in links for j in range(width)}
                started, done = len(live), 0
                t0, c0 = time.perf_counter(), time.process_time()
                end = time.monotonic() + args.max_seconds
                while live and time.monotonic() < end and not STOP:
                    for k in links:
                        k.pump()
                    for k in links:
                        for r in k.loads:
                            if not r.success:
                                raise RuntimeError(f"load {r.job_id} failed")
                            kj = live.pop(r.job_id)
                            done += 1
                            if started < count:
                                live[start(*kj)] = kj
                                started += 1
                        k.loads.clear()
                    if live:
                        wait_for_frames(links[0].transport)
                if live:
                    raise RuntimeError(f"{len(live)} loads not done in time")
                if phase == "run":
                    emit("window", at="end")
                    report.update(fetches=done, wall_s=time.perf_counter() - t0,
                                  cpu_s=time.process_time() - c0)
        else:
            link = links[0]
            times = []
            for rnd in range(args.repeat + 2):
                link.region[:] = 0
                t0 = time.perf_counter()
                want = {}
                for i in range(width):
                    job += 1
                    blocks = list(range(i * per, (i + 1) * per))
                    link.session.request_blocks(job, f"conc-{rnd}-{i}",
                                                [OffloadKey(demo_key(b)) for b in blocks],
                                                blocks)
                    want[job] = link
                _drive(links, want, time.monotonic() + args.load_timeout)
                if rnd >= 2:
                    times.append(time.perf_counter() - t0)
                every = list(range(width * per))
                if len(link.landed(every, every)) != width * per:
                    raise RuntimeError("a concurrent fetch delivered a wrong block")
            report["times"] = times
    except RuntimeError as exc:
        report.update(success=False, error=str(exc))
    for k in links:
        k.close({})
    emit("result", **report)
    return 0 if report["success"] else 1
