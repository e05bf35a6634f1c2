"""NodeMetrics: counter, gauge and histogram semantics, snapshots, and the optional exporter."""

from __future__ import annotations

import importlib
import json
import math
import sys
import threading
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from p2pfsm import metrics as metrics_module
from p2pfsm.errors import ConfigError
from p2pfsm.metrics import BUCKETS, COUNTERS, GAUGES, HISTOGRAMS, NodeMetrics

COUNTER_NAMES = sorted(COUNTERS)


def test_the_documented_names_are_the_fixed_set() -> None:
    assert set(COUNTERS) == {
        "fetches_started", "fetches_succeeded", "fetches_failed", "fetch_bytes", "served_bytes",
        "lookups_started", "lookups_served", "stores_started", "aborts_sent", "violations",
        "violation_closes", "idle_closes", "deaths", "restarts", "reconnects", "redials",
        "stale_answers",
        "handshakes", "handshakes_rejected", "identities_rate_limited", "results_dropped",
        "connections_resumed", "host_errors", "fetches_failed_peer_failed", "tombstones_dropped",
        "restarts_refused",
        "fetches_failed_timeout", "fetches_failed_finished", "fetches_failed_session_ended",
        "destinations_released",
        "lookups_answered", "lookups_failed", "lookup_keys_hit", "lookup_keys_missed",
    }
    assert set(GAUGES) == {"peers", "open_loads", "open_stores", "destinations_held"}
    assert set(HISTOGRAMS) == {"fetch_seconds", "handshake_seconds", "lookup_seconds"}
    doc = metrics_module.__doc__ or ""
    undocumented = [n for n in [*COUNTERS, *GAUGES, *HISTOGRAMS] if f"``{n}``" not in doc]
    assert undocumented == []


def test_a_fresh_snapshot_is_all_zero() -> None:
    snap = NodeMetrics().snapshot()
    assert snap["counters"] == dict.fromkeys(COUNTERS, 0)
    assert snap["gauges"] == dict.fromkeys(GAUGES, 0.0)
    for name in HISTOGRAMS:
        hist = snap["histograms"][name]
        assert hist["count"] == 0
        assert hist["sum"] == 0.0
        assert hist["buckets"] == [[le, 0] for le in BUCKETS]
        assert hist["p50"] is None
        assert hist["p99"] is None


def test_buckets_span_50_microseconds_to_60_seconds() -> None:
    assert BUCKETS[0] == 50e-6
    assert BUCKETS[-1] == 60.0
    assert list(BUCKETS) == sorted(set(BUCKETS))


def test_counters_add_one_by_default_and_n_when_given() -> None:
    m = NodeMetrics()
    m.count("fetches_started")
    m.count("fetches_started")
    m.count("fetch_bytes", 4096)
    m.count("fetch_bytes", 0)
    m.count("served_bytes", 7)
    counters = m.snapshot()["counters"]
    assert counters["fetches_started"] == 2
    assert counters["fetch_bytes"] == 4096
    assert counters["served_bytes"] == 7
    untouched = set(COUNTERS) - {"fetches_started", "fetch_bytes", "served_bytes"}
    assert {counters[n] for n in untouched} == {0}


def test_counters_are_independent() -> None:
    m = NodeMetrics()
    for i, name in enumerate(COUNTER_NAMES):
        m.count(name, i + 1)
    assert m.snapshot()["counters"] == {name: i + 1 for i, name in enumerate(COUNTER_NAMES)}


def test_a_counter_refuses_to_go_down() -> None:
    m = NodeMetrics()
    m.count("deaths", 3)
    with pytest.raises(ValueError, match="negative"):
        m.count("deaths", -1)
    assert m.snapshot()["counters"]["deaths"] == 3


@pytest.mark.parametrize(
    ("call", "kind"),
    [
        (lambda m: m.count("fetch_started"), "counter"),
        (lambda m: m.set_gauge("peer", 1.0), "gauge"),
        (lambda m: m.observe("fetch", 0.1), "histogram"),
        (lambda m: m.count("peers"), "counter"),  # a gauge is not a counter
        (lambda m: m.set_gauge("fetch_seconds", 1.0), "gauge"),
        (lambda m: m.observe("deaths", 0.1), "histogram"),
    ],
)
def test_unknown_names_raise_key_error_naming_the_known_ones(
    call: Callable[[NodeMetrics], object], kind: str
) -> None:
    m = NodeMetrics()
    before = m.snapshot()
    with pytest.raises(KeyError) as info:
        call(m)
    message = str(info.value)
    assert f"unknown {kind}" in message
    known = {"counter": COUNTERS, "gauge": GAUGES, "histogram": HISTOGRAMS}[kind]
    assert all(name in message for name in known)
    assert m.snapshot() == before


def test_gauges_hold_the_last_value_set() -> None:
    m = NodeMetrics()
    m.set_gauge("peers", 3)
    m.set_gauge("peers", 2)
    m.set_gauge("open_loads", 5.5)
    gauges = m.snapshot()["gauges"]
    assert gauges == {"peers": 2.0, "open_loads": 5.5, "open_stores": 0.0,
                      "destinations_held": 0.0}
    assert isinstance(gauges["peers"], float)


def test_loop_gauges_set_all_four_as_floats() -> None:
    m = NodeMetrics()
    m.set_gauge("open_loads", 9)
    m.set_loop_gauges(4, 1, 2, 7)
    gauges = m.snapshot()["gauges"]
    assert gauges == {"peers": 4.0, "open_loads": 1.0, "open_stores": 2.0,
                      "destinations_held": 7.0}
    assert set(gauges) == set(GAUGES)
    assert all(type(v) is float for v in gauges.values())


def _expected_cumulative(values: list[float]) -> list[list[float]]:
    return [[le, sum(1 for v in values if v <= le)] for le in BUCKETS]


def test_histogram_buckets_are_cumulative_and_le_inclusive() -> None:
    m = NodeMetrics()
    values = [0.0, 10e-6, 50e-6, 51e-6, 0.001, 0.0011, 0.3, 0.3, 2.5, 59.9, 60.0, 61.0, 3600.0]
    for v in values:
        m.observe("fetch_seconds", v)
    hist = m.snapshot()["histograms"]["fetch_seconds"]
    assert hist["count"] == len(values)
    assert hist["sum"] == pytest.approx(sum(values))
    assert hist["buckets"] == _expected_cumulative(values)
    by_le = dict((le, c) for le, c in hist["buckets"])
    assert by_le[50e-6] == 3  # 0, 10 us and exactly 50 us
    assert by_le[60.0] == len(values) - 2  # 61 s and an hour only in +Inf
    untouched = m.snapshot()["histograms"]["handshake_seconds"]
    assert untouched["count"] == 0


@given(st.lists(st.floats(min_value=0.0, max_value=120.0), min_size=1, max_size=200))
def test_bucket_counts_match_a_direct_count(values: list[float]) -> None:
    m = NodeMetrics()
    for v in values:
        m.observe("handshake_seconds", v)
    hist = m.snapshot()["histograms"]["handshake_seconds"]
    assert hist["count"] == len(values)
    assert hist["buckets"] == _expected_cumulative(values)
    assert hist["sum"] == pytest.approx(math.fsum(values))


def test_observe_rejects_negative_and_nan_durations() -> None:
    m = NodeMetrics()
    for bad in (-0.001, float("nan")):
        with pytest.raises(ValueError, match="seconds >= 0"):
            m.observe("fetch_seconds", bad)
    assert m.snapshot()["histograms"]["fetch_seconds"]["count"] == 0


def test_one_observation_is_its_own_p50_and_p99() -> None:
    m = NodeMetrics()
    m.observe("fetch_seconds", 0.0037)
    hist = m.snapshot()["histograms"]["fetch_seconds"]
    assert hist["p50"] == 0.0037
    assert hist["p99"] == 0.0037


def test_percentiles_pick_the_bucket_of_the_true_percentile() -> None:
    m = NodeMetrics()
    for _ in range(98):
        m.observe("fetch_seconds", 0.0003)
    for _ in range(2):
        m.observe("fetch_seconds", 20.0)
    hist = m.snapshot()["histograms"]["fetch_seconds"]
    assert 0.0003 <= hist["p50"] <= 0.0005
    assert 10.0 <= hist["p99"] <= 20.0


def test_percentiles_beyond_the_last_bucket_stay_within_what_was_seen() -> None:
    m = NodeMetrics()
    for v in (100.0, 200.0, 300.0):
        m.observe("handshake_seconds", v)
    hist = m.snapshot()["histograms"]["handshake_seconds"]
    assert 100.0 <= hist["p50"] <= 300.0
    assert hist["p50"] <= hist["p99"] <= 300.0


def _bucket_bounds(value: float) -> tuple[float, float]:
    for i, le in enumerate(BUCKETS):
        if value <= le:
            return (BUCKETS[i - 1] if i else 0.0), le
    return BUCKETS[-1], math.inf


@given(st.lists(st.floats(min_value=0.0, max_value=120.0), min_size=1, max_size=200))
def test_percentiles_lie_in_the_bucket_of_the_exact_percentile(values: list[float]) -> None:
    m = NodeMetrics()
    for v in values:
        m.observe("fetch_seconds", v)
    hist = m.snapshot()["histograms"]["fetch_seconds"]
    ordered = sorted(values)
    for q, key in ((0.50, "p50"), (0.99, "p99")):
        exact = ordered[math.ceil(q * len(values)) - 1]
        low, high = _bucket_bounds(exact)
        estimate = hist[key]
        assert low <= estimate <= high, (key, exact, estimate)
        assert ordered[0] <= estimate <= ordered[-1]
    assert hist["p50"] <= hist["p99"]


def test_snapshot_is_a_deep_copy() -> None:
    m = NodeMetrics()
    m.count("handshakes")
    m.set_gauge("peers", 1)
    m.observe("handshake_seconds", 0.01)
    snap = m.snapshot()
    frozen = json.loads(json.dumps(snap))
    m.count("handshakes", 5)
    m.set_gauge("peers", 4)
    m.observe("handshake_seconds", 0.02)
    assert json.loads(json.dumps(snap)) == frozen
    snap["counters"]["handshakes"] = 99
    snap["histograms"]["handshake_seconds"]["buckets"][0][1] = 99
    later = m.snapshot()
    assert later["counters"]["handshakes"] == 6
    assert later["gauges"]["peers"] == 4.0
    assert later["histograms"]["handshake_seconds"]["count"] == 2
    assert later["histograms"]["handshake_seconds"]["buckets"][0][1] == 0


def test_snapshot_is_strict_json() -> None:
    m = NodeMetrics()
    m.count("fetch_bytes", 1 << 40)
    m.observe("fetch_seconds", 1e6)  # beyond the last bucket: no inf may leak out
    m.set_gauge("open_stores", 2)
    snap = m.snapshot()
    assert json.loads(json.dumps(snap, allow_nan=False)) == snap


def test_snapshots_taken_while_another_thread_observes_are_consistent() -> None:
    m = NodeMetrics()
    n = 20_000
    done = threading.Event()

    def writer() -> None:
        for _ in range(n):
            m.observe("fetch_seconds", 0.5)  # exact in binary: sum must be count / 2
            m.count("fetches_succeeded")
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    torn = []
    seen = 0
    while not done.is_set() or seen == 0:
        hist = m.snapshot()["histograms"]["fetch_seconds"]
        seen += 1
        if hist["sum"] != hist["count"] * 0.5 or hist["buckets"][-1][1] != hist["count"]:
            torn.append(hist)
    thread.join()
    final = m.snapshot()
    assert torn == []
    assert final["histograms"]["fetch_seconds"]["count"] == n
    assert final["counters"]["fetches_succeeded"] == n


def test_the_exporter_without_prometheus_client_raises_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "prometheus_client"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "p2pfsm.prometheus", raising=False)
    with pytest.raises(ConfigError) as info:
        importlib.import_module("p2pfsm.prometheus")
    message = str(info.value)
    assert "prometheus_client" in message
    assert "pip install 'p2pfsm[prometheus]'" in message
    assert isinstance(info.value.__cause__, ImportError)
