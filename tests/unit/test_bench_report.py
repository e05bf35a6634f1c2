"""``p2pfsm bench`` argument handling and report formatting (no measurement runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2pfsm.errors import ConfigError
from p2pfsm.tools.bench import matrix, report
from p2pfsm.tools.bench.transfer import format_table
from p2pfsm.tools.cli import build_parser


@pytest.mark.parametrize(("text", "shape"), [("256x64KiB", (256, 65536)), ("1x4KiB", (1, 4096)),
                                              ("8x2MiB", (8, 2 << 20)), ("3x100", (3, 100))])
def test_shapes_parse(text: str, shape: tuple[int, int]) -> None:
    assert report.parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "0x4KiB", "4KiB", "2x", "1x4GiB", "-1x4KiB", "1x04 KiB"])
def test_bad_shapes_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="BLOCKSxSIZE"):
        report.parse_shape(text)


def test_loop_line_names_failures_and_quantiles() -> None:
    line = report.format_loop("x", {"times": [0.001, 0.002, 0.003], "failures": 1,
                                     "verify_failures": 2})
    assert line.startswith("x: 3 fetches, 1 failed, 2 verify failures; median 2.000 ms")
    assert report.format_loop("y", {"times": [], "failures": 4, "verify_failures": 0}) == \
        "y: 0 fetches, 4 failed, 0 verify failures"


def test_bench_arguments() -> None:
    args = build_parser().parse_args(["bench", "--connect", "tcp://127.0.0.1:5", "--shapes",
                                      "1x4KiB", "--repeat", "3"])
    assert (args.connect, args.shapes, args.repeat, args.vs_vllm) == \
        ("tcp://127.0.0.1:5", ["1x4KiB"], 3, False)
    args = build_parser().parse_args(["bench", "--vs-vllm", "--passes", "2", "--plot", "d"])
    assert args.vs_vllm and args.passes == 2 and args.plot == "d"
    assert build_parser().parse_args(["bench"]).open_rounds == [0, 1000, 10_000, 100_000]


def _cell(shape: str, server: str, client: str, ms: list[float]) -> dict[str, object]:
    stats = None if not ms else {"median_ms": sorted(ms)[len(ms) // 2], "p10_ms": min(ms),
                                 "p90_ms": max(ms), "n": len(ms)}
    return {"shape": shape, "server": server, "client": client, "failures": 0,
            "verify_failures": 0, "stats": stats, "times_ms": ms}


def test_matrix_table_has_every_cell_and_the_ratios() -> None:
    cells = {f"256x64KiB {s}/{c}": _cell("256x64KiB", s, c, ms) for s, c, ms in (
        ("vllm", "vllm", [9.0]), ("vllm", "p2pfsm", [6.0]), ("p2pfsm", "vllm", [4.5]),
        ("p2pfsm", "p2pfsm", [3.0]))}
    text = matrix.format_matrix({"cells": cells, "passes": 1, "repeat": 1, "wall_s": 1.0})
    assert "vLLM<->vLLM / p2pfsm<->p2pfsm = 3.00x" in text
    assert "vLLM server: vLLM client / p2pfsm client = 1.50x" in text
    assert "vLLM client: vLLM server / p2pfsm server = 2.00x" in text
    assert "1x4KiB" not in text


def test_matrix_refuses_zero_passes() -> None:
    with pytest.raises(ConfigError, match="passes"):
        matrix.run(passes=0, vpy=Path("/nonexistent/python"))


def test_matrix_adapter_ratios_compare_like_with_like() -> None:
    cells = {f"1x4KiB {s}/{c}": _cell("1x4KiB", s, c, ms) for s, c, ms in (
        ("vllm", "vllm", [6.0]), ("vllm", "adapter", [4.0]), ("adapter", "vllm", [12.0]),
        ("adapter", "adapter", [3.0]), ("p2pfsm", "adapter", [2.0]))}
    text = matrix.format_matrix({"cells": cells, "passes": 1, "repeat": 1, "wall_s": 1.0})
    assert "client role, vLLM server: vLLM client / adapter client = 1.50x" in text
    assert "server role, vLLM client: vLLM server / adapter server = 0.50x" in text
    assert "both ends: vLLM<->vLLM / adapter<->adapter = 2.00x" in text
    assert "p2pfsm server: vLLM client" not in text  # that cell was not run
    assert "adapter client" in text.splitlines()[1] and "p2pfsm client" not in text


def test_matrix_cells_parse_and_refuse() -> None:
    assert matrix.parse_cells(["vllm/adapter", "p2pfsm/vllm", "vllm/adapter"]) == \
        ("vllm/adapter", "p2pfsm/vllm")
    assert len(matrix.CELLS) == 9 and matrix.parse_cells(matrix.CELLS) == matrix.CELLS
    for bad in (["vllm"], ["vllm/ours"], ["/vllm"], []):
        with pytest.raises(ConfigError, match="--cells"):
            matrix.parse_cells(bad)
    with pytest.raises(ConfigError, match="BLOCKSxSIZE"):  # checked before anything starts
        matrix.run(passes=1, shapes=["4KiB"], vpy=Path("/nonexistent/python"))
    args = build_parser().parse_args(["bench", "--vs-vllm", "--cells", "vllm/adapter",
                                      "adapter/vllm", "--shapes", "1x4KiB"])
    assert args.cells == ["vllm/adapter", "adapter/vllm"] and args.shapes == ["1x4KiB"]


def _row(median: float) -> dict[str, float]:
    return {"median": median, "p10": median / 2, "p90": median * 2, "n": 3.0}


def test_transfer_table_shows_both_raws_and_the_floor_ratio() -> None:
    result = {"fetch_large": {"unit": "ms", "raw": _row(3.0), "raw_prompt": _row(1.5),
                              "node": _row(2.25), "ratio": 0.75, "ratio_prompt": 1.5,
                              "target": 1.5},
              "fetch_small": {"unit": "us", "raw": _row(60.0), "raw_tight": _row(50.0),
                              "raw_write": _row(30.0), "floor": 80.0,
                              "node": _row(100.0), "ratio": 1.67, "ratio_tight": 2.0,
                              "ratio_floor": 1.25, "target": 1.5},
              "idle_cpu": {"peer_percent": 0.5, "local_percent": 0.4, "target_percent": 1.0,
                           "seconds": 1.0},
              "rounds": 2, "number": 1, "wall_s": 1.0}
    text = format_table(result)
    assert "raw WRITE, target spinning [ms]" in text and "raw REQ-REP round trip [us]" in text
    assert " 1.50x  <= 1.5x of the last raw (0.75x of the first)" in text
    assert " 2.00x  <= 1.5x of the REQ-REP (1.67x of the first, 1.25x of the floor)" in text
    assert "raw WRITE of the 1 block [us]" in text and "floor: REQ-REP + that WRITE" in text


def _q(median: float) -> dict[str, float]:
    return {"median": median, "p10": median / 2, "p90": median * 2, "p99": median * 3,
            "n": 4.0}


def test_workloads_text_names_every_workload_and_the_load() -> None:
    from p2pfsm.tools.bench.workloads import format_workloads

    text = format_workloads({
        "lookup": {"keys": 256, "hits": 192, "lookup_ms": _q(1.0), "total_ms": _q(4.0),
                   "load": 2.0},
        "concurrent": {"requests": 8, "blocks_each": 32, "request_ms": _q(3.0),
                       "all_done_ms": _q(4.0), "single_ms": _q(2.0), "aggregate_gbps": 4.0,
                       "single_gbps": 8.0, "load": 2.5},
        "soak": {"count": 1000, "edge": 100, "block_len": 65536, "first_ms": _q(1.0),
                 "last_ms": _q(1.1), "drift": 1.1, "load": 3.0,
                 "before": {"fds": 40, "rss": 2**20, "peer_fds": 38, "peer_rss": 2**21},
                 "after": {"fds": 40, "rss": 2**20, "peer_fds": 38, "peer_rss": 2**21}},
        "cpu": {"fetches": 60, "gb": 1.0, "gbps": 2.0, "consumer_cpu_s_per_gb": 0.5,
                "producer_cpu_s_per_gb": 0.25, "consumer_core_share": 1.0,
                "producer_core_share": 0.5, "load": 1.0},
        "region": {"mib": 1024, "skipped": "not enough memory", "load": 1.0},
        "fanout": {"consumers": 16, "skipped": "no memory"},
        "wall_s": 60.0})
    assert "lookup 256 keys (192 hits)" in text and "[load 2.0]" in text
    assert "last/first 1.10x" in text and "fds 40 -> 40 (peer 38 -> 38)" in text
    assert "all done     4.00 ms (p10 2.00, p90 8.00): 4.00 GB/s" in text
    assert "p99 9.00" in text  # per request: the tail is shown
    assert "consumer 0.50 CPU s/GB (100 % of a core), producer 0.25 CPU s/GB" in text
    assert "1024 MiB region handshake: skipped: not enough memory" in text
    assert "fan-out of 16 consumers: skipped: no memory" in text


def test_quantiles_take_p99_and_survive_one_sample() -> None:
    from p2pfsm.tools.bench.report import quantiles

    q = quantiles([i / 1000 for i in range(1, 101)])
    assert q["median"] == pytest.approx(50.5) and q["p99"] == pytest.approx(99.01)
    assert quantiles([0.002])["p99"] == 2.0


def test_several_suites_and_workload_options_parse() -> None:
    args = build_parser().parse_args(["bench", "--suite", "all", "workloads", "--consumers",
                                      "0", "--region-mib", "8", "--soak", "5"])
    assert args.suite == ["all", "workloads"] and (args.consumers, args.region_mib,
                                                     args.soak) == (0, 8, 5)
    assert build_parser().parse_args(["bench"]).suite == ["all"]


def test_workloads_refuse_bad_sizes_before_starting_anything() -> None:
    from p2pfsm.tools.bench import workloads

    with pytest.raises(ConfigError, match="soak >= 2"):
        workloads.run(soak=1)
    with pytest.raises(ConfigError, match="consumers >= 0"):
        workloads.run(consumers=-1)


def _flat(median: float) -> dict[str, float]:
    return {"median": median, "p10": median, "p90": median, "p99": median, "n": 3.0}


def test_concurrency_widths_parse() -> None:
    from p2pfsm.tools.bench.concurrency import parse_widths

    assert parse_widths(["1", "4,16", "4", "64"]) == (1, 4, 16, 64)
    for bad in (["0"], ["x"], ["4,"], ["-1"]):
        with pytest.raises(ConfigError, match="positive integers"):
            parse_widths(bad)


def test_concurrency_table_has_a_row_per_width_and_the_vllm_ratio() -> None:
    from p2pfsm.tools.bench.concurrency import format_concurrency

    text = format_concurrency({
        "rounds": 5, "target": 0.8,
        "widths": [{"width": 64, "all_done_ms": _flat(10.0), "single_ms": _flat(5.0),
                    "aggregate_gbps": 1.68, "single_gbps": 3.36, "ratio": 0.5, "load": 2.0}],
        "vllm": [{"width": 64, "all_done_ms": _flat(7.0), "aggregate_gbps": 2.4}],
        "fanout": [{"consumers": 4, "fetches_each": 2, "setup_s": 1.0, "span_s": 0.1,
                    "aggregate_gbps": 1.68, "latency_ms": _flat(3.0), "load": 2.0}]})
    assert "   64       10.00         5.00    1.68     3.36  0.50x   2.0" in text
    assert "C=64: all done 7.00 ms, 2.40 GB/s; vLLM's time / p2pfsm's 0.70x" in text
    assert "0.50x the GB/s of one 256-block fetch" in text


def test_large_table_names_sizes_and_ratio() -> None:
    from p2pfsm.tools.bench.large import format_large

    text = format_large({"rounds": 3, "target": 1.1, "cells": [
        {"total": 16 << 20, "block_len": 2 << 20, "blocks": 8, "raw_ms": _flat(2.5),
         "fetch_ms": _flat(3.0), "raw_gbps": 6.7, "fetch_gbps": 5.6, "ratio": 1.2, "load": 1.0}]})
    assert "  16 MiB    2 MiB     2.50      3.00     6.70   5.60  1.20x   1.0" in text


def test_throughput_table_has_a_row_per_implementation() -> None:
    from p2pfsm.tools.bench.throughput import format_throughput

    row = {"impl": "p2pfsm", "peers": 4, "in_flight": 16, "fetches": 4000,
           "fetches_per_s": 3000.0, "consumer_cpu_us": 120.0, "producer_cpu_us": 150.5,
           "per_core": 3700.0, "load": 2.5}
    lines = format_throughput([row, {**row, "impl": "vLLM"}]).splitlines()
    assert len(lines) == 4 and lines[2].split() == \
        ["p2pfsm", "4", "16", "4000", "3000", "120.0", "150.5", "3700", "2.5"]
    assert lines[3].startswith("  vLLM ")


def test_vllm_result_line_parses_and_failures_raise() -> None:
    from p2pfsm.errors import TransportError
    from p2pfsm.tools.bench.vllm_concurrency import parse_result

    ok = matrix.MARK + '{"kind": "result", "success": true, "times": [0.1]}'
    assert parse_result(f"noise\n{ok}\n")["times"] == [0.1]
    with pytest.raises(TransportError, match="boom"):
        parse_result(matrix.MARK + '{"kind": "result", "success": false, "error": "boom"}')
    with pytest.raises(TransportError, match="no result"):
        parse_result("nothing\n")


def test_issue29_suite_arguments() -> None:
    args = build_parser().parse_args(["bench", "--suite", "concurrency", "large", "throughput",
                                      "--widths", "1", "64", "--large-mib", "16",
                                      "--fanout-consumers"])
    assert (args.suite, args.widths, args.large_mib, args.fanout_consumers) == \
        (["concurrency", "large", "throughput"], ["1", "64"], [16], [])
    assert args.throughput_drive == ["wait"]
    both = build_parser().parse_args(["bench", "--suite", "throughput",
                                      "--throughput-drive", "wait", "spin"])
    assert both.throughput_drive == ["wait", "spin"]


def test_throughput_refuses_an_unknown_drive_before_starting_anything() -> None:
    from p2pfsm.errors import ConfigError
    from p2pfsm.tools.bench import throughput

    with pytest.raises(ConfigError, match="drive is one of"):
        throughput.run(fetches=64, drive="nap")


def test_figures_name_the_vllm_release_measured() -> None:
    from p2pfsm.tools.bench import plot

    assert plot.vllm_label({"vllm_release": "0.34.0"}) == "vLLM 0.34.0"
    assert plot.vllm_label({}) == "vLLM (release not recorded)"
    matrix_result = {"vllm_release": "0.33.0", "cells": {}}
    assert [plot.kind_label(k, matrix_result) for k in matrix.KINDS] == [
        "vLLM 0.33.0", "adapter", "p2pfsm"]
