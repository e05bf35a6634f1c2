"""serve_metrics over loopback: scraped text matches what was counted; close frees the port."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

prometheus_client = pytest.importorskip(
    "prometheus_client", reason="needs prometheus_client: pip install 'p2pfsm[prometheus]'"
)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from p2pfsm.errors import ConfigError, TransportError  # noqa: E402
from p2pfsm.metrics import BUCKETS, COUNTERS, GAUGES, HISTOGRAMS, NodeMetrics  # noqa: E402
from p2pfsm.prometheus import MetricsServer, serve_metrics  # noqa: E402

LOOPBACK = "127.0.0.1"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(url: str) -> tuple[Samples, dict[str, str]]:
    """Every sample of ``url`` keyed by (name, labels), and each family's type."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode("utf-8")
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = s.value
    return samples, types


def _filled() -> NodeMetrics:
    """Distinct values everywhere, so that a mixed-up name cannot pass."""
    m = NodeMetrics()
    for i, name in enumerate(sorted(COUNTERS)):
        m.count(name, 10 * (i + 1) + 3)
    for i, name in enumerate(sorted(GAUGES)):
        m.set_gauge(name, i + 0.25)
    for v in (0.0002, 0.004, 0.004, 0.3, 7.0, 90.0):
        m.observe("fetch_seconds", v)
    m.observe("handshake_seconds", 0.02)
    return m


@pytest.fixture
def metrics() -> NodeMetrics:
    return _filled()


@pytest.fixture
def server(metrics: NodeMetrics) -> Iterator[MetricsServer]:
    with serve_metrics(metrics, LOOPBACK, 0, node_label="node-a") as srv:
        yield srv


def _check_against(samples: Samples, snap: dict[str, Any], labels: dict[str, str]) -> None:
    base = frozenset(labels.items())
    for name, value in snap["counters"].items():
        assert samples[(f"p2pfsm_{name}_total", base)] == value, name
    for name, value in snap["gauges"].items():
        assert samples[(f"p2pfsm_{name}", base)] == value, name
    for name, hist in snap["histograms"].items():
        assert name.endswith("_seconds")
        assert samples[(f"p2pfsm_{name}_count", base)] == hist["count"]
        assert samples[(f"p2pfsm_{name}_sum", base)] == pytest.approx(hist["sum"])
        scraped = {
            float(dict(lbls)["le"]): v
            for (sample, lbls), v in samples.items()
            if sample == f"p2pfsm_{name}_bucket" and base <= lbls
        }
        expected = {float(le): c for le, c in hist["buckets"]}
        expected[float("inf")] = hist["count"]
        assert scraped == expected, name


def test_the_scrape_matches_the_snapshot(server: MetricsServer, metrics: NodeMetrics) -> None:
    assert server.host == LOOPBACK
    assert server.port > 0
    assert server.url == f"http://{LOOPBACK}:{server.port}/metrics"
    samples, types = _scrape(server.url)
    snap = metrics.snapshot()
    _check_against(samples, snap, {"node": "node-a"})
    assert {types[f"p2pfsm_{n}"] for n in COUNTERS} == {"counter"}
    assert {types[f"p2pfsm_{n}"] for n in GAUGES} == {"gauge"}
    assert {types[f"p2pfsm_{n}"] for n in HISTOGRAMS} == {"histogram"}
    ours = {name for name, _ in samples}
    assert all(name.startswith("p2pfsm_") for name in ours)
    # Spot checks against hand-counted values, independent of snapshot():
    node = frozenset({("node", "node-a")})
    assert samples[("p2pfsm_aborts_sent_total", node)] == 13  # first counter, sorted
    assert samples[("p2pfsm_fetch_seconds_count", node)] == 6
    assert samples[("p2pfsm_fetch_seconds_bucket", node | {("le", "0.005")})] == 3
    assert samples[("p2pfsm_fetch_seconds_bucket", node | {("le", "60.0")})] == 5
    assert samples[("p2pfsm_fetch_seconds_bucket", node | {("le", "+Inf")})] == 6
    assert len([s for s, lbls in samples if s == "p2pfsm_fetch_seconds_bucket"]) == len(BUCKETS) + 1


def test_each_scrape_reads_the_live_values(server: MetricsServer, metrics: NodeMetrics) -> None:
    node = frozenset({("node", "node-a")})
    before, _ = _scrape(server.url)
    metrics.count("fetches_failed", 5)
    metrics.set_gauge("peers", 42)
    metrics.observe("handshake_seconds", 0.5)
    after, _ = _scrape(server.url)
    assert after[("p2pfsm_fetches_failed_total", node)] == before[
        ("p2pfsm_fetches_failed_total", node)] + 5
    assert after[("p2pfsm_peers", node)] == 42
    assert after[("p2pfsm_handshake_seconds_count", node)] == 2
    _check_against(after, metrics.snapshot(), {"node": "node-a"})


def test_a_snapshot_callable_without_a_node_label() -> None:
    m = _filled()
    calls = []

    def snapshot() -> dict[str, Any]:
        calls.append(1)
        return m.snapshot()

    with serve_metrics(snapshot, LOOPBACK, 0) as srv:
        samples, _ = _scrape(srv.url)
    assert len(calls) == 1
    _check_against(samples, m.snapshot(), {})
    assert all("node" not in dict(lbls) for _, lbls in samples)


def test_the_default_registry_is_left_alone(server: MetricsServer) -> None:
    _scrape(server.url)
    text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "p2pfsm_" not in text


def test_only_metrics_is_served(server: MetricsServer) -> None:
    root = server.url.removesuffix("/metrics")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(root + "/other", timeout=10)
    assert info.value.code == 404


def test_a_failing_snapshot_answers_500_and_the_server_keeps_serving() -> None:
    m = NodeMetrics()
    fail = [True]

    def snapshot() -> dict[str, Any]:
        if fail[0]:
            raise RuntimeError("boom")
        return m.snapshot()

    with serve_metrics(snapshot, LOOPBACK, 0) as srv:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(srv.url, timeout=10)
        assert info.value.code == 500
        fail[0] = False
        m.count("deaths", 2)
        samples, _ = _scrape(srv.url)
    assert samples[("p2pfsm_deaths_total", frozenset())] == 2


def test_a_busy_port_is_a_transport_error_and_close_frees_it() -> None:
    m = NodeMetrics()
    first = serve_metrics(m, LOOPBACK, 0)
    port = first.port
    thread_name = f"p2pfsm-metrics-{port}"
    assert thread_name in {t.name for t in threading.enumerate()}
    try:
        with pytest.raises(TransportError, match=f"{LOOPBACK}:{port}"):
            serve_metrics(m, LOOPBACK, port)
        _scrape(first.url)  # leaves a connection behind, as a real scraper would
    finally:
        first.close()
    first.close()  # idempotent
    assert thread_name not in {t.name for t in threading.enumerate()}
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(first.url, timeout=10)
    with serve_metrics(m, LOOPBACK, port) as again:
        assert again.port == port
        m.count("handshakes")
        samples, _ = _scrape(again.url)
        assert samples[("p2pfsm_handshakes_total", frozenset())] == 1


@pytest.mark.parametrize(("host", "port"), [("", 0), (LOOPBACK, -1), (LOOPBACK, 65536)])
def test_bad_addresses_are_config_errors(host: str, port: int) -> None:
    with pytest.raises(ConfigError):
        serve_metrics(NodeMetrics(), host, port)


def test_a_node_is_served_labelled_with_its_id_as_serve_metrics_labels_it() -> None:
    from p2pfsm import Node, NodeConfig

    with Node(NodeConfig("127.0.0.1:0", 4, 4096)) as node:
        node.metrics.count("lookups_answered", 3)
        node.metrics.observe("lookup_seconds", 0.002)
        with serve_metrics(node, LOOPBACK, 0) as srv:
            samples, types = _scrape(srv.url)
        label = frozenset({("node", node.local_id)})
        assert samples[("p2pfsm_lookups_answered_total", label)] == 3
        assert samples[("p2pfsm_lookup_seconds_count", label)] == 1
        assert types["p2pfsm_lookup_seconds"] == "histogram"
        assert all(("node", node.local_id) in lbls for _, lbls in samples)
    with pytest.raises(ConfigError, match="metrics source"):
        serve_metrics(object(), LOOPBACK, 0)
