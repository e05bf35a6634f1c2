"""The ``p2pfsm`` command line as a user runs it: real processes, exit codes, output lines.

One ``p2pfsm serve`` process serves the module. The commands that start a node (and so
load torch and NIXL) run concurrently, once, from the ``runs`` fixture, so the module
costs about one process start-up per core instead of one per test; each test then
checks its own command's result. Every process is waited for with a deadline and
killed if it overstays.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from subprocess import Popen

import pytest
from helpers.requires import needs_nixl_and_torch

needs_nixl_and_torch()

CLI = [sys.executable, "-m", "p2pfsm.tools.cli"]
SERVED_BLOCKS = 32
RUN_TIMEOUT = 900.0
"""Bound on the concurrent batch (about 25 s here): far past what load makes of it (it
shares two cores with everything else, and the bench's fan-out alone allows its
consumers 300 s), so only a hang reaches it."""


@dataclass
class Ran:
    args: list[str]
    code: int
    out: str
    err: str

    def describe(self) -> str:
        return (f"p2pfsm {' '.join(self.args)} -> {self.code}\n"
                f"stdout: {self.out}\nstderr: {self.err}")


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=None if env is None else {**os.environ, **env})


def finish(proc: subprocess.Popen[str], timeout: float) -> Ran:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += f"\n[killed after {timeout:.0f} s]"
    assert isinstance(proc.args, list)
    return Ran([str(a) for a in proc.args[len(CLI):]], proc.returncode, out, err)


@pytest.fixture
def children_procs() -> Iterator[list[Popen[str]]]:
    """CLI processes a test starts; any still running at its end is killed by PID."""
    started: list[Popen[str]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def run(*args: str, timeout: float = 60.0) -> Ran:
    return finish(start(*args), timeout)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def assert_one_error_line(ran: Ran, *needles: str) -> None:
    assert ran.code == 2, ran.describe()
    assert ran.out == "", ran.describe()
    assert "Traceback" not in ran.err, ran.describe()
    # Log records (WARNING and up by default, e.g. the node's "peer rejected") may come
    # first; the error itself is one line, the last.
    lines = [line for line in ran.err.strip().splitlines()
             if not line.startswith(("p2pfsm WARNING ", "p2pfsm ERROR "))]
    assert len(lines) == 1 and lines[0].startswith("p2pfsm: error: "), ran.describe()
    assert ran.err.strip().splitlines()[-1] == lines[0], ran.describe()
    for needle in needles:
        assert needle in lines[0], ran.describe()


def one_json_line(ran: Ran) -> dict[str, object]:
    lines = ran.out.strip().splitlines()
    assert len(lines) == 1, ran.describe()
    value = json.loads(lines[0])
    assert isinstance(value, dict)
    return value


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``p2pfsm serve`` on a free port; yields its ``tcp://`` address."""
    proc = start("serve", "--bind", "tcp://127.0.0.1:0", "--blocks", str(SERVED_BLOCKS),
                 "--block-len", "4096")
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60.0)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("serving"), f"serve did not start: {line!r} (exit {proc.poll()})"
        yield "tcp://" + line.rsplit("tcp://", 1)[1].strip()
        proc.terminate()
        ran = finish(proc, 15.0)
        assert ran.code == 0 and "Traceback" not in ran.err, ran.describe()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


REFUSING_PORT = closed_port()


@pytest.fixture(scope="module")
def runs(server: str) -> dict[str, Ran]:
    """Every command that starts a node, run at the same time."""
    commands = {
        "pd": ["fetch", "--connect", server, "--keys", "0-15"],
        "sym": ["fetch", "--connect", server, "--mode", "sym", "--keys", f"0-3,{SERVED_BLOCKS}"],
        # Both deadlines far past RUN_TIMEOUT: a refusal that waited for either one
        # would be killed (not exit 2) and fail its test.
        "refused": ["fetch", "--connect", f"tcp://127.0.0.1:{REFUSING_PORT}",
                    "--timeout", "3600", "--connect-timeout", "3600"],
        # Keys 32 and 33 are past the server's blocks: the report must name them.
        "missing": ["fetch", "--connect", server, "--keys", f"{SERVED_BLOCKS - 2}-"
                    f"{SERVED_BLOCKS + 1}", "--load-timeout", "2", "--abort-ack-timeout", "1"],
        "mismatch": ["fetch", "--connect", server, "--block-len", "8192"],
        "demo": ["demo", "--json"],
        # Tiny sizes: structure only. The workloads share the transfer suite's peer.
        "bench": ["bench", "--suite", "all", "workloads", "layouts", "--json", "--number", "20",
                  "--rounds", "2", "--per-round", "3", "--idle-seconds", "0.5",
                  "--open-rounds", "0", "100", "10000", "--soak", "4", "--cpu-fetches", "1",
                  "--region-mib", "4", "--consumers", "2", "--fanout-fetches", "1",
                  # Run region and fan-out whatever memory the box's other work leaves
                  # at that moment (2 x ~400 MiB): skipping them on a busy box made
                  # their checks fail on a missing result.
                  "--no-memory-check"],
        # Issue 29's suites, tiny sizes: structure only.
        "bench29": ["bench", "--suite", "concurrency", "large", "throughput", "--json",
                    "--rounds", "2", "--widths", "1", "4", "--fanout-consumers", "2",
                    "--fanout-fetches", "1", "--no-memory-check", "--large-mib", "2",
                    "--large-blocks", "64KiB", "2MiB", "--throughput-peers", "2",
                    "--in-flight", "2", "--throughput-fetches", "40",
                    "--throughput-drive", "wait", "spin"],
    }
    # UCX logs to stdout unless told otherwise; the demo raises its level so that UCX
    # surely logs, and its --json stdout must still be the one JSON line.
    envs = {"demo": {"UCX_LOG_LEVEL": "info"}}
    started = {name: start(*args, env=envs.get(name)) for name, args in commands.items()}
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        return {name: finish(proc, max(1.0, deadline - time.monotonic()))
                for name, proc in started.items()}
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_fetch_prints_one_json_line(runs: dict[str, Ran]) -> None:
    ran = runs["pd"]
    assert ran.code == 0, ran.describe()
    report = one_json_line(ran)
    assert report["success"] is True and report["verified"] is True, ran.describe()
    assert report["keys"] == 16 and report["bytes"] == 16 * 4096
    assert "Traceback" not in ran.err


def test_fetch_sym_looks_up_then_fetches_the_hits(runs: dict[str, Ran]) -> None:
    ran = runs["sym"]
    assert ran.code == 0, ran.describe()
    report = one_json_line(ran)
    assert report["hits"] == 4 and report["keys"] == 5, ran.describe()
    assert report["success"] is True and report["verified"] is True
    assert report["bytes"] == 4 * 4096


def test_fetch_from_a_closed_port_fails_with_one_line(runs: dict[str, Ran]) -> None:
    """Refused at once (not after either deadline: see ``runs``), and said so."""
    assert_one_error_line(runs["refused"], f"cannot reach 127.0.0.1:{REFUSING_PORT}",
                          "connection refused")


def test_a_refused_peer_is_reported_before_the_node_starts() -> None:
    """Alone (not in the concurrent batch): the TCP probe answers before torch and NIXL
    load. The time is printed for the record, not asserted."""
    t0 = time.monotonic()
    ran = run("fetch", "--connect", f"tcp://127.0.0.1:{REFUSING_PORT}")
    elapsed = time.monotonic() - t0
    print(f"refused peer reported in {elapsed:.2f} s")
    assert_one_error_line(ran, f"cannot reach 127.0.0.1:{REFUSING_PORT}: transport lost: "
                          "connection refused")


def test_a_fetch_of_keys_the_peer_lacks_names_them(runs: dict[str, Ran]) -> None:
    ran = runs["missing"]
    assert ran.code == 1, ran.describe()
    report = one_json_line(ran)
    assert report["success"] is False and report["verified"] is False, ran.describe()
    assert report["error"] == f"peer has no blocks for keys {SERVED_BLOCKS}-{SERVED_BLOCKS + 1}"
    assert report["reason"] == "peer_failed", report
    assert report["detail"].startswith("from 127.0.0.1:") and "transfer_done(false)" in report[
        "detail"], report
    assert report["keys"] == 4 and report["bytes"] == 0
    assert "Traceback" not in ran.err


def test_fetch_from_a_mismatched_peer_fails_with_one_line(runs: dict[str, Ran]) -> None:
    assert_one_error_line(runs["mismatch"], "incompatible", "block_len")


def test_demo_json(runs: dict[str, Ran]) -> None:
    ran = runs["demo"]
    assert ran.code == 0, ran.describe()
    assert "UCX  INFO" in ran.err, ran.describe()  # UCX's own lines: on stderr
    summary = one_json_line(ran)
    assert summary["ok"] is True, ran.describe()
    pd, sym, abort = summary["pd"], summary["sym"], summary["abort"]
    assert isinstance(pd, dict) and isinstance(sym, dict) and isinstance(abort, dict)
    assert pd["verified"] is True and sym["hits"] == 2 and abort["success"] is False


def test_bench_smoke_reports_every_measurement(runs: dict[str, Ran]) -> None:
    """Structure only: timings on a shared CI machine are not asserted."""
    ran = runs["bench"]
    assert ran.code == 0, ran.describe()
    result = one_json_line(ran)
    assert [row["open_rounds"] for row in result["fsm"]] == [0, 100, 10_000]  # type: ignore[index]
    transfer = result["transfer"]
    assert isinstance(transfer, dict)
    for key, unit in (("fetch_large", "ms"), ("fetch_small", "us")):
        row = transfer[key]
        assert row["unit"] == unit and row["target"] > 0 and row["ratio"] > 0
        for side in ("raw", "node"):
            stats = row[side]
            assert 0 < stats["p10"] <= stats["median"] <= stats["p90"], row
    small = transfer["fetch_small"]
    assert small["floor"] > small["raw_tight"]["median"] and small["raw_write"]["median"] > 0
    idle = transfer["idle_cpu"]
    assert idle["seconds"] == 0.5 and idle["peer_percent"] >= 0 and idle["local_percent"] >= 0
    assert "(a)" in ran.err and "(b)" in ran.err  # progress went to stderr


def test_bench_workloads_report_each_workload(runs: dict[str, Ran]) -> None:
    """Structure only (every fetch in them was verified, or the command failed). Every
    workload ran: none was skipped for the memory the machine had free at the time."""
    ran = runs["bench"]
    assert ran.code == 0, ran.describe()
    w = one_json_line(ran)["workloads"]
    assert isinstance(w, dict)
    assert not [k for k, v in w.items() if isinstance(v, dict) and "skipped" in v], w
    for key, stats in (("lookup", "lookup_ms"), ("lookup", "total_ms"),
                       ("concurrent", "request_ms"), ("soak", "first_ms"),
                       ("fanout", "latency_ms")):
        q = w[key][stats]
        assert 0 < q["p10"] <= q["median"] <= q["p90"] <= q["p99"], (key, q)
    assert w["lookup"]["hits"] == 192 and w["concurrent"]["requests"] == 8
    assert len(w["concurrent"]["request_ms"]) and w["concurrent"]["request_ms"]["n"] == 16
    assert w["soak"]["count"] == 4 and w["soak"]["before"]["fds"] > 0
    # CPU time is counted in clock ticks (10 ms): a quick run may use less than one.
    assert w["cpu"]["consumer_cpu_s_per_gb"] >= 0 and w["cpu"]["producer_cpu_s_per_gb"] >= 0
    region = w["region"]
    assert region["mib"] == 4 and region["blocks"] == 64 and region["connect_ready_ms"] > 0
    fan = w["fanout"]
    assert fan["consumers"] == 2 and len(fan["times_ms"]) == 2 and fan["aggregate_gbps"] > 0


def test_bench_layouts_report_each_layout(runs: dict[str, Ran]) -> None:
    """Structure only (every layout's fetch was checked byte for byte, or it failed)."""
    ran = runs["bench"]
    assert ran.code == 0, ran.describe()
    got = one_json_line(ran)["layouts"]
    assert isinstance(got, dict)
    rows = got["rows"]
    assert [(row["layers"], row["regions"]) for row in rows] == [(0, 1), (8, 16), (32, 64)]
    for row in rows:
        assert row["raw_ms"] > 0 and row["fetch_ms"] > 0 and row["rounds"] == 2, row
        assert row["slice_len"] * row["regions"] == got["block_len"]


def test_bench_issue29_suites_report_each_cell(runs: dict[str, Ran]) -> None:
    """Structure only: the concurrency, large and throughput suites (every fetch in them
    was verified, or the command failed)."""
    ran = runs["bench29"]
    assert ran.code == 0, ran.describe()
    got = one_json_line(ran)
    conc = got["concurrency"]
    assert isinstance(conc, dict)
    assert [w["width"] for w in conc["widths"]] == [1, 4]
    for w in conc["widths"]:
        assert w["all_done_ms"]["median"] > 0 and w["single_ms"]["median"] > 0, w
        assert w["ratio"] > 0 and w["aggregate_gbps"] > 0
    assert [f["consumers"] for f in conc["fanout"]] == [2]
    assert conc["fanout"][0]["aggregate_gbps"] > 0
    large = got["large"]
    assert isinstance(large, dict)
    assert [(c["total"], c["block_len"]) for c in large["cells"]] == \
        [(2 << 20, 64 << 10), (2 << 20, 2 << 20)]
    assert all(c["raw_ms"]["median"] > 0 and c["ratio"] > 0 for c in large["cells"])
    rows = got["throughput"]
    assert isinstance(rows, list)
    assert [(r["impl"], r["drive"]) for r in rows] == [("p2pfsm", "wait"), ("p2pfsm/spin", "spin")]
    for row in rows:
        assert row["fetches"] == 40 and row["fetches_per_s"] > 0
        # CPU time is counted in clock ticks (10 ms): a quick run may use less than one.
        assert row["consumer_cpu_us"] >= 0 and row["producer_cpu_us"] >= 0


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["fetch"], "--connect"),
        (["fetch", "--connect", "localhost"], "HOST:PORT or tcp://HOST:PORT"),
        (["fetch", "--connect", "udp://127.0.0.1:1"], "HOST:PORT or tcp://HOST:PORT"),
        (["fetch", "--connect", "tcp://127.0.0.1:1", "--keys", "5-1"], "--keys"),
        (["fetch", "--connect", "tcp://127.0.0.1:1", "--block-len", "0"], "--block-len"),
        (["fetch", "--connect", "tcp://127.0.0.1:1", "--mode", "both"], "--mode"),
        (["fetch", "--connect", "tcp://127.0.0.1:1", "--connect-timeout", "0"],
         "--connect-timeout"),
        (["serve", "--bind", "udp://127.0.0.1:0"], "'HOST:PORT' or 'tcp://HOST:PORT'"),
        (["demo", "--blocks", "100"], "--blocks"),
        (["bench", "--suite", "everything"], "--suite"),
        (["bench", "--suite", "transfer", "--rounds", "1"], "--rounds"),
        (["bench", "--number", "0"], "--number"),
        (["launch"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_error_line(args: list[str], needle: str) -> None:
    assert_one_error_line(run(*args), needle)


def test_serve_on_a_port_in_use_fails_with_one_line(server: str) -> None:
    assert_one_error_line(run("serve", "--bind", server, timeout=60.0), "cannot bind")


def test_serve_metrics_prints_its_url_and_serves_the_node(children_procs: list[Popen[str]]) -> None:
    pytest.importorskip("prometheus_client")
    pytest.importorskip("p2pfsm.prometheus")
    proc = start("serve", "--bind", "tcp://127.0.0.1:0", "--blocks", "4", "--block-len", "4096",
                 "--metrics", "127.0.0.1:0")
    children_procs.append(proc)
    assert proc.stdout is not None and proc.stderr is not None
    ready, _, _ = select.select([proc.stderr], [], [], 60.0)
    url_line = proc.stderr.readline() if ready else ""
    assert url_line.startswith("metrics on http://127.0.0.1:"), (url_line, proc.poll())
    url = url_line.split(" on ", 1)[1].strip()
    ready, _, _ = select.select([proc.stdout], [], [], 60.0)
    serving = proc.stdout.readline() if ready else ""
    assert serving.startswith("serving 4 blocks"), serving
    node_id = serving.rsplit("tcp://", 1)[1].strip()
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read().decode()
    assert "p2pfsm_handshakes_total" in body and f'node="{node_id}"' in body, body[:2000]
    proc.terminate()
    ran = finish(proc, 15.0)
    assert ran.code == 0 and "Traceback" not in ran.err, ran.describe()
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    with socket.socket() as s:  # the metrics port was closed with the server
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_serve_metrics_on_a_bad_address_fails_with_one_line() -> None:
    pytest.importorskip("prometheus_client")
    assert_one_error_line(run("serve", "--bind", "tcp://127.0.0.1:0", "--metrics",
                              "127.0.0.1:99999"), "--metrics", "HOST:PORT")
