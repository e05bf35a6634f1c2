"""``p2pfsm bench --vs-vllm``: vLLM, the adapter and p2pfsm, client and server.

The vLLM release is the interop venv's: ``.venv-vllm`` (0.33.0) by default,
``.venv-vllm-0.34`` with ``--vllm 0.34.0`` (:func:`use_release`); the results name it.

Every cell is one (server, client) pair of separate processes, each of one of three kinds:

``vllm``
    vLLM's own sessions: ``python -m p2pfsm.tools.vllm_peer server|client`` in the interop venv.
``adapter``
    The same vLLM driver with ``--adapter``: p2pfsm's sessions behind vLLM's interface
    (:mod:`p2pfsm.vllm`), on vLLM's ZeroMQ connection and NIXL transport.
``p2pfsm``
    A p2pfsm node: ``p2pfsm serve``, or the :mod:`p2pfsm.tools.bench.client` loop.

All hold the demo block model and verify every byte. Cells whose client is a vLLM driver
(``vllm`` or ``adapter``) run side by side: per pass and shape one server per server kind,
and one client process holding a session per cell (vLLM's sessions on one engine, the
adapter's on another, as two vLLM engines would) that fetches on each cell in turn, one
fetch at a time (:func:`p2pfsm.tools.vllm_peer.plans.run_links`). Their samples are
paired in time:
machine load that comes and goes hits every cell alike. Cells with a p2pfsm client run one
after another, a fresh server each. Passes start one cell later each. Medians and p10/p90
are over the fetches of all passes; failures and verify failures are counted apart. A
``vllm`` cell and an ``adapter`` cell differ only in the session class, so their ratio is
the adapter's cost.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2pfsm.errors import ConfigError
from p2pfsm.tools.bench.procs import Command, run_to_end
from p2pfsm.tools.bench.report import Progress, parse_shape

__all__ = ["CELLS", "KINDS", "SHAPES", "VENVS", "format_matrix", "parse_cells", "release",
           "run", "use_release", "vllm_python"]

MARK = "P2PINTEROP "
SHAPES: dict[str, tuple[int, int]] = {"256x64KiB": (256, 64 * 1024), "1x4KiB": (1, 4096)}
KINDS = ("vllm", "adapter", "p2pfsm")
LABELS = {"vllm": "vLLM", "adapter": "adapter", "p2pfsm": "p2pfsm"}
CELLS = tuple(f"{s}/{c}" for s in KINDS for c in KINDS)
"""Every SERVER/CLIENT pair, the default of ``--cells``."""
_SESSIONS = {"vllm": "vllm", "adapter": "p2pfsm"}  # what a vLLM driver reports running
_START_S = 300.0
_RUN_S = 600.0

_CORNER = "server"


VENVS = {"0.33.0": ".venv-vllm", "0.34.0": ".venv-vllm-0.34"}
"""Each supported vLLM release's interop venv (``bash .ci/install-vllm.sh RELEASE``)."""
_chosen = ["0.33.0"]  # the release every vLLM process of this run uses


def use_release(version: str) -> None:
    """Run the vLLM side of every cell on ``version`` (one of :data:`VENVS`)."""
    if version not in VENVS:
        raise ConfigError(f"--vllm: expected one of {', '.join(VENVS)}, got {version!r}")
    _chosen[0] = version


def release() -> str:
    """The vLLM release the vLLM processes run."""
    return _chosen[0]


def vllm_python(root: Path | None = None) -> Path | None:
    """The chosen release's interop venv python (at the checkout or cwd), None without
    it."""
    venv = VENVS[_chosen[0]]
    for base in (root, Path.cwd(), Path(__file__).resolve().parents[3]):
        if base is not None and (base / venv / "bin" / "python").exists():
            return base / venv / "bin" / "python"
    return None


def parse_cells(texts: Sequence[str]) -> tuple[str, ...]:
    """``["vllm/adapter", ...]`` -> the same cells, checked; a ConfigError for a bad one."""
    out: list[str] = []
    for text in texts:
        server, sep, client = text.strip().partition("/")
        if not sep or server not in KINDS or client not in KINDS:
            raise ConfigError(f"--cells: expected SERVER/CLIENT with each one of "
                              f"{', '.join(KINDS)}, got {text!r}")
        out.append(f"{server}/{client}")
    if not out:
        raise ConfigError("--cells: need at least one SERVER/CLIENT cell")
    return tuple(dict.fromkeys(out))


def _check_sessions(kind: str, msg: dict[str, Any]) -> None:
    """A vLLM driver says which sessions it runs: an adapter cell must really run ours."""
    if msg.get("sessions") != _SESSIONS[kind]:
        raise ConfigError(f"{kind} peer runs {msg.get('sessions')!r} sessions, expected "
                          f"{_SESSIONS[kind]!r} (the switch did not take)")


def _vllm_argv(kind: str, vpy: Path | None, role: str, *rest: str) -> list[str]:
    """``python -m p2pfsm.tools.vllm_peer ROLE ...``, with ``--adapter`` for an adapter peer."""
    assert vpy is not None
    flag = ["--adapter"] if kind == "adapter" else []
    return [str(vpy), "-m", "p2pfsm.tools.vllm_peer", role, "--max-seconds", str(int(_RUN_S)),
            *flag, *rest]


def _server(kind: str, vpy: Path | None, blocks: int, block_len: int
            ) -> tuple[Command, str]:
    if kind == "p2pfsm":
        argv = [sys.executable, "-m", "p2pfsm.tools.cli", "serve", "--bind", "tcp://127.0.0.1:0",
                "--blocks", str(blocks), "--block-len", str(block_len)]
    else:
        argv = _vllm_argv(kind, vpy, "server", "--blocks", str(blocks),
                          "--block-len", str(block_len))
    proc = Command(argv, f"{kind} server")
    until = time.monotonic() + _START_S
    try:
        while True:
            line = proc.readline(until)
            if kind == "p2pfsm" and line.startswith("serving"):
                return proc, line.rsplit("tcp://", 1)[1].strip()
            if kind != "p2pfsm" and line.startswith(MARK):
                msg = json.loads(line[len(MARK):])
                if msg.get("kind") == "ready":
                    _check_sessions(kind, msg)
                    return proc, str(msg["peer_id"])
    except BaseException:
        proc.stop()
        raise


def _client(addr: str, blocks: int, block_len: int, repeat: int,
            warmup: int) -> dict[str, Any]:
    """A p2pfsm client (:mod:`p2pfsm.tools.bench.client`) against ``addr``: its times."""
    argv = [sys.executable, "-m", "p2pfsm.tools.bench.client", "--connect", addr,
            "--blocks", str(blocks), "--block-len", str(block_len),
            "--repeat", str(repeat), "--warmup", str(warmup)]
    done = run_to_end(argv, _RUN_S)
    if done is None:
        return {"times": [], "failures": repeat, "verify_failures": 0}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            out: dict[str, Any] = json.loads(line)
            return out
    return {"times": [], "failures": repeat, "verify_failures": 0,
            "error": (done.stderr or "")[-300:]}


def _linked(vpy: Path | None, servers: dict[str, str], pairs: Sequence[tuple[str, str]],
            blocks: int, block_len: int, repeat: int, warmup: int
            ) -> dict[tuple[str, str], dict[str, Any]]:
    """One vLLM driver client holding a session per (server, client) pair, fetching on each
    in turn (``--links``); each pair's times, failures and verify failures."""
    links = ",".join(f"{_SESSIONS[client]}={servers[server]}" for server, client in pairs)
    argv = _vllm_argv("vllm", vpy, "client", "--links", links, "--keys", f"0-{blocks - 1}",
                      "--block-len", str(block_len), "--repeat", str(repeat + warmup),
                      "--linger", "0", "--hold-open", "0")
    empty = {"times": [], "failures": repeat, "verify_failures": 0}
    out = {pair: dict(empty) for pair in pairs}
    done = run_to_end(argv, _RUN_S)
    if done is None:
        return out
    for line in done.stdout.splitlines():
        if not line.startswith(MARK):
            continue
        msg = json.loads(line[len(MARK):])
        if msg.get("kind") != "result":
            continue
        pair = pairs[int(msg["name"])]
        _check_sessions(pair[1], msg)
        attempts = msg.get("attempts", [])[warmup:]
        ok = [a for a in attempts if a.get("success")]
        out[pair] = {"times": [a["seconds"] for a in ok if a.get("verified")],
                     "failures": repeat - len(ok),
                     "verify_failures": sum(1 for a in ok if not a.get("verified"))}
    return out


def _stats(samples: list[float]) -> dict[str, float] | None:
    if not samples:
        return None
    s = sorted(samples)
    cuts = statistics.quantiles(s, n=10, method="inclusive") if len(s) > 1 else s * 9
    return {"median_ms": statistics.median(s) * 1e3, "p10_ms": cuts[0] * 1e3,
            "p90_ms": cuts[-1] * 1e3, "n": len(s)}


def run(passes: int = 2, repeat: int = 20, warmup: int = 3,
        shapes: Sequence[str] = tuple(SHAPES), cells: Sequence[str] = CELLS,
        progress: Progress | None = None, vpy: Path | None = None) -> dict[str, Any]:
    """Run the matrix; return cells keyed ``"<shape> <server>/<client>"``."""
    say = progress or (lambda _line: None)
    if passes < 1 or repeat < 1 or warmup < 0:
        raise ConfigError(f"--vs-vllm: need passes and repeat >= 1 and warmup >= 0, "
                          f"got {passes}, {repeat}, {warmup}")
    pairs = [(c.partition("/")[0], c.partition("/")[2]) for c in parse_cells(cells)]
    dims = {shape: parse_shape(shape) for shape in shapes}
    if not dims:
        raise ConfigError("--vs-vllm: need at least one fetch shape")
    vpy = vpy or vllm_python()
    if vpy is None and any(k != "p2pfsm" for pair in pairs for k in pair):
        raise ConfigError(f"--vs-vllm needs the interop venv {VENVS[release()]} "
                          f"(bash .ci/install-vllm.sh {release()})")
    samples: dict[str, dict[str, Any]] = {
        f"{shape} {server}/{client}": {"shape": shape, "server": server, "client": client,
                                       "times": [], "failures": 0, "verify_failures": 0}
        for shape in dims for server, client in pairs}

    def add(shape: str, pair: tuple[str, str], got: dict[str, Any]) -> None:
        cell = samples[f"{shape} {pair[0]}/{pair[1]}"]
        for field in ("times", "failures", "verify_failures"):
            cell[field] += got[field]

    t0 = time.monotonic()
    for p in range(passes):
        for shape, (blocks, block_len) in dims.items():
            start = p % len(pairs)
            turn = pairs[start:] + pairs[:start]
            linked = [pair for pair in turn if pair[1] != "p2pfsm"]
            if linked:
                kinds = list(dict.fromkeys(server for server, _ in linked))
                say(f"  pass {p + 1}/{passes}: {shape}, side by side: "
                    f"{' '.join(f'{s}/{c}' for s, c in linked)}")
                procs: list[Command] = []
                try:
                    servers: dict[str, str] = {}
                    for kind in kinds:
                        proc, servers[kind] = _server(kind, vpy, blocks, block_len)
                        procs.append(proc)
                    got_all = _linked(vpy, servers, linked, blocks, block_len, repeat, warmup)
                finally:
                    for proc in procs:
                        proc.stop()
                for pair, got in got_all.items():
                    add(shape, pair, got)
            for server, client in [pair for pair in turn if pair[1] == "p2pfsm"]:
                say(f"  pass {p + 1}/{passes}: {shape}, {server} server, {client} client")
                proc, addr = _server(server, vpy, blocks, block_len)
                try:
                    got = _client(addr, blocks, block_len, repeat, warmup)
                finally:
                    proc.stop()
                add(shape, (server, client), got)
    out = {k: {**{f: v for f, v in c.items() if f != "times"}, "stats": _stats(c["times"]),
               "times_ms": [t * 1e3 for t in c["times"]]} for k, c in samples.items()}
    return {"cells": out, "passes": passes, "repeat": repeat, "vllm_release": release(),
            "wall_s": time.monotonic() - t0}


def _median(cells: dict[str, Any], shape: str, server: str, client: str) -> float | None:
    stats = cells.get(f"{shape} {server}/{client}", {}).get("stats")
    return None if stats is None else float(stats["median_ms"])


def _ratio(label: str, slow: float | None, fast: float | None, indent: str = "  "
           ) -> list[str]:
    return [] if not slow or not fast else [f"{indent}{label} = {slow / fast:.2f}x"]


def _paired(cells: dict[str, Any], shape: str, stock: tuple[str, str],
            adapter: tuple[str, str]) -> str:
    """Fetch by fetch, the adapter's cell against vLLM's: ``k/n`` fetches where the
    adapter was faster and the median difference; only where both cells ran side by
    side (a vLLM-driver client) and lost no fetch, so the i-th samples were neighbours."""
    if stock[1] == "p2pfsm" or adapter[1] == "p2pfsm":
        return ""
    a = cells.get(f"{shape} {stock[0]}/{stock[1]}", {})
    b = cells.get(f"{shape} {adapter[0]}/{adapter[1]}", {})
    x, y = a.get("times_ms") or [], b.get("times_ms") or []
    if not x or len(x) != len(y) or a.get("failures") or b.get("failures"):
        return ""
    diffs = [q - p for p, q in zip(x, y, strict=True)]
    faster = sum(1 for d in diffs if d < 0)
    return (f"; paired: adapter faster in {faster}/{len(diffs)}, median adapter - vLLM "
            f"{statistics.median(diffs):+.2f} ms")


def _adapter_ratios(cells: dict[str, Any], shape: str) -> list[str]:
    """vLLM's sessions / the adapter with everything else equal (>= 1: not slower), and
    where the cells ran side by side, the fetch-by-fetch comparison."""
    lines: list[str] = []

    def add(label: str, stock: tuple[str, str], adapter: tuple[str, str]) -> None:
        got = _ratio(label, _median(cells, shape, *stock), _median(cells, shape, *adapter),
                     "    ")
        lines.extend(line + _paired(cells, shape, stock, adapter) for line in got)

    for other in KINDS:
        add(f"client role, {LABELS[other]} server: vLLM client / adapter client",
            (other, "vllm"), (other, "adapter"))
    for other in KINDS:
        add(f"server role, {LABELS[other]} client: vLLM server / adapter server",
            ("vllm", other), ("adapter", other))
    add("both ends: vLLM<->vLLM / adapter<->adapter", ("vllm", "vllm"),
        ("adapter", "adapter"))
    if lines:
        lines.insert(0, "  the adapter vs vLLM's sessions, all else equal "
                        "(>= 1.00x: the adapter is not slower):")
    return lines


def format_matrix(result: dict[str, Any]) -> str:
    """The matrix as text: one table per shape (rows: servers, columns: clients), ratios."""
    cells = result["cells"]
    lines: list[str] = []
    shapes = list(dict.fromkeys(c["shape"] for c in cells.values()))
    for shape in shapes:
        mine = [c for c in cells.values() if c["shape"] == shape]
        servers = [k for k in KINDS if any(c["server"] == k for c in mine)]
        clients = [k for k in KINDS if any(c["client"] == k for c in mine)]
        lines += ["", f"{shape} fetch [ms]: median (p10-p90) n failures/verify-failures",
                  f"{_CORNER:<16}" + "".join(f"{LABELS[k] + ' client':>36}" for k in clients)]
        for server in servers:
            row = f"{LABELS[server]:<16}"
            for client in clients:
                c = cells.get(f"{shape} {server}/{client}")
                s = None if c is None else c["stats"]
                text = "-" if c is None else (
                    f"none {c['failures']}/{c['verify_failures']}" if s is None else
                    f"{s['median_ms']:.2f} ({s['p10_ms']:.2f}-{s['p90_ms']:.2f}) "
                    f"n={s['n']} {c['failures']}/{c['verify_failures']}")
                row += f"{text:>36}"
            lines.append(row)
        vv = _median(cells, shape, "vllm", "vllm")
        lines += _ratio("vLLM<->vLLM / p2pfsm<->p2pfsm", vv,
                        _median(cells, shape, "p2pfsm", "p2pfsm"))
        lines += _ratio("vLLM server: vLLM client / p2pfsm client", vv,
                        _median(cells, shape, "vllm", "p2pfsm"))
        lines += _ratio("vLLM client: vLLM server / p2pfsm server", vv,
                        _median(cells, shape, "p2pfsm", "vllm"))
        lines += _adapter_ratios(cells, shape)
    lines.append(f"({result['passes']} passes x {result['repeat']} fetches per cell, fresh "
                 f"servers each pass; {result['wall_s']:.0f} s)")
    return "\n".join(lines).strip("\n")
