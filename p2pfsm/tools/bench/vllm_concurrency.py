"""The vLLM <-> vLLM cells of the concurrency and throughput suites (the release of
``--vllm``, :func:`p2pfsm.tools.bench.matrix.use_release`).

A vLLM server (``python -m p2pfsm.tools.vllm_peer server``, vLLM's own sessions, in the
interop venv) and one vLLM client process (``client --concurrent``,
:func:`p2pfsm.tools.vllm_peer.plans.run_concurrent`): for concurrency, one session on which C
fetches of 4 x 64 KiB are issued together and polled until all are done, round after
round; for throughput, several sessions each keeping one-block fetches of 4 KiB in
flight, with the CPU seconds of both processes over the window.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.tools.bench import matrix
from p2pfsm.tools.bench.procs import Command, run_to_end
from p2pfsm.tools.bench.procstat import cpu_s
from p2pfsm.tools.bench.report import Progress, quantiles

__all__ = ["parse_result", "run", "throughput"]

_BLOCK = 64 * 1024
_PER_REQUEST = 4


def parse_result(stdout: str) -> dict[str, Any]:
    """The last ``result`` line of a vLLM driver's stdout; a TransportError without one
    or when it failed."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(matrix.MARK):
            msg: dict[str, Any] = json.loads(line[len(matrix.MARK):])
            if msg.get("kind") == "result":
                if not msg.get("success"):
                    raise TransportError(f"vLLM client failed: {msg.get('error')}")
                return msg
    raise TransportError("vLLM client: no result line")


def _client(addr: str, block_len: int, *rest: str) -> dict[str, Any]:
    vpy = matrix.vllm_python()
    argv = matrix._vllm_argv("vllm", vpy, "client", "--connect", addr, "--block-len",
                             str(block_len), *rest)
    done = run_to_end(argv, matrix._RUN_S)
    if done is None:
        raise TransportError(f"vLLM client: not done within {matrix._RUN_S:.0f} s")
    try:
        return parse_result(done.stdout)
    except TransportError as exc:
        raise TransportError(f"{exc}: {(done.stderr or '')[-300:]}") from None


def _need_vllm() -> None:
    if matrix.vllm_python() is None:
        raise ConfigError(f"--vs-vllm needs {matrix.VENVS[matrix.release()]} (vLLM "
                          f"{matrix.release()}): bash .ci/install-vllm.sh {matrix.release()}")


def run(widths: tuple[int, ...], rounds: int, progress: Progress | None = None
        ) -> list[dict[str, Any]]:
    """For each C: ``rounds`` rounds of C concurrent fetches vLLM <-> vLLM."""
    _need_vllm()
    say = progress or (lambda _line: None)
    rows = []
    for width in widths:
        say(f"  concurrency: vLLM <-> vLLM, {width} concurrent fetches, {rounds} rounds")
        proc, addr = matrix._server("vllm", matrix.vllm_python(), width * _PER_REQUEST, _BLOCK)
        try:
            got = _client(addr, _BLOCK, "--concurrent", str(width), "--per-request",
                          str(_PER_REQUEST), "--repeat", str(rounds))
        finally:
            proc.stop()
        med = statistics.median(got["times"])
        rows.append({"width": width, "all_done_ms": quantiles(got["times"]),
                     "aggregate_gbps": width * _PER_REQUEST * _BLOCK / med / 1e9})
    return rows


def throughput(peers: int, in_flight: int, fetches: int, progress: Progress | None = None
               ) -> dict[str, Any]:
    """The throughput suite's window, vLLM <-> vLLM."""
    from p2pfsm.tools.bench.workloads import load_average

    _need_vllm()
    say = progress or (lambda _line: None)
    say(f"  throughput: vLLM <-> vLLM, {peers} sessions x {in_flight} in flight")
    vpy = matrix.vllm_python()
    proc, addr = matrix._server("vllm", vpy, in_flight, 4096)
    client: Command | None = None
    try:
        argv = matrix._vllm_argv("vllm", vpy, "client", "--connect", addr, "--block-len",
                                 "4096", "--concurrent", str(in_flight), "--per-request", "1",
                                 "--links-count", str(peers), "--saturate", str(fetches))
        client = Command(argv, "vLLM client")
        until = time.monotonic() + matrix._RUN_S
        lines: list[str] = []
        marks: dict[str, tuple[float, float]] = {}
        while True:  # bounded by _readline's deadline and the client's exit
            line = client.readline(until)
            lines.append(line)
            if '"kind": "window"' in line:
                marks[json.loads(line[len(matrix.MARK):])["at"]] = (cpu_s(proc.pid),
                                                                    load_average())
            elif '"kind": "result"' in line:
                break
        got = parse_result("".join(lines))
        server = marks["end"][0] - marks["start"][0]
        load = (marks["start"][1] + marks["end"][1]) / 2
    finally:
        if client is not None:
            client.stop()
        proc.stop()
    n = got["fetches"]
    return {"impl": "vLLM", "peers": peers, "in_flight": in_flight, "fetches": n,
            "block_len": 4096, "wall_s": got["wall_s"], "fetches_per_s": n / got["wall_s"],
            "consumer_cpu_us": got["cpu_s"] / n * 1e6, "producer_cpu_us": server / n * 1e6,
            "per_core": n / (got["cpu_s"] + server), "load": load}
