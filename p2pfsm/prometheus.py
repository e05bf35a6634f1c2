"""Prometheus exposition of :class:`p2pfsm.metrics.NodeMetrics` (needs ``prometheus_client``).

:func:`serve_metrics` serves ``http://HOST:PORT/metrics`` from a daemon thread,
with its own registry (never the process-wide default one). Names are
``p2pfsm_<name>``: counters end ``_total``, histograms ``_seconds``.

Importing this module without ``prometheus_client`` raises
:class:`p2pfsm.errors.ConfigError`.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.metrics import COUNTERS, GAUGES, HISTOGRAMS, NodeMetrics

try:
    import prometheus_client  # noqa: F401  (fail on the package, not on a submodule)
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
    from prometheus_client.registry import Collector, CollectorRegistry
except ImportError as exc:
    raise ConfigError(
        f"p2pfsm.prometheus needs prometheus_client (import of {exc.name or exc} failed: {exc}); "
        "install it with: pip install 'p2pfsm[prometheus]'"
    ) from exc

__all__ = ["MetricsCollector", "MetricsServer", "serve_metrics"]

Snapshot = Callable[[], dict[str, Any]]

_PREFIX = "p2pfsm_"


class MetricsCollector(Collector):
    """A custom collector that turns each ``snapshot()`` into metric families.

    Args:
        snapshot: returns a dict shaped like :meth:`NodeMetrics.snapshot`.
        node_label: when given, every sample carries the constant label ``node``.
    """

    def __init__(self, snapshot: Snapshot, *, node_label: str | None = None) -> None:
        self._snapshot = snapshot
        self._labels = ["node"] if node_label is not None else []
        self._values = [node_label] if node_label is not None else []

    def collect(self) -> Iterator[Metric]:
        """Yield one family per counter, gauge and histogram in a fresh snapshot."""
        snap = self._snapshot()
        for name, value in sorted(snap.get("counters", {}).items()):
            counter = CounterMetricFamily(
                _PREFIX + name, COUNTERS.get(name, f"p2pfsm counter {name}"), labels=self._labels
            )
            counter.add_metric(self._values, value)
            yield counter
        for name, value in sorted(snap.get("gauges", {}).items()):
            gauge = GaugeMetricFamily(
                _PREFIX + name, GAUGES.get(name, f"p2pfsm gauge {name}"), labels=self._labels
            )
            gauge.add_metric(self._values, value)
            yield gauge
        for name, hist in sorted(snap.get("histograms", {}).items()):
            full = _PREFIX + name if name.endswith("_seconds") else f"{_PREFIX}{name}_seconds"
            family = HistogramMetricFamily(
                full, HISTOGRAMS.get(name, f"p2pfsm histogram {name} (seconds)"),
                labels=self._labels,
            )
            buckets = [(repr(float(le)), float(cum)) for le, cum in hist["buckets"]]
            buckets.append(("+Inf", float(hist["count"])))
            family.add_metric(self._values, buckets, float(hist["sum"]))
            yield family


class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` (or ``with``) stops it."""

    def __init__(self, server: ThreadingHTTPServer, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server = server
        self.host: str = str(server.server_address[0])
        self.port: int = int(server.server_address[1])
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}/metrics"
        self._closed = False
        self._close_lock = threading.Lock()
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.1},
            name=f"p2pfsm-metrics-{self.port}", daemon=True,
        )
        self._thread.start()

    def close(self) -> None:
        """Stop serving, release the port and join the thread (idempotent)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MetricsServer({self.url!r}{', closed' if self._closed else ''})"


def serve_metrics(
    source: NodeMetrics | Snapshot | Any,
    host: str,
    port: int,
    *,
    node_label: str | None = None,
) -> MetricsServer:
    """Serve Prometheus text for ``source`` on ``http://host:port/metrics``.

    ``source`` is a :class:`NodeMetrics`, a snapshot callable, or a node (a ``Node`` or
    ``AsyncNode``: its ``metrics``, labelled ``node=<its local_id>`` unless
    ``node_label`` says otherwise, as ``p2pfsm serve --metrics`` labels them).

    ``host`` is bound exactly as given (pass a loopback address unless you mean
    otherwise; ``""`` is refused); ``port`` 0 picks a free port (see
    :attr:`MetricsServer.port`).

    Raises:
        ConfigError: ``host`` is empty or ``port`` is out of range.
        TransportError: the address cannot be bound.
    """
    if not host:
        raise ConfigError("metrics host: expected an explicit address such as 127.0.0.1")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"metrics port: expected an int in 0..65535, got {port!r}")
    held = getattr(source, "metrics", None)
    if not isinstance(source, NodeMetrics) and isinstance(held, NodeMetrics):
        if node_label is None:
            node_label = str(getattr(source, "local_id", ""))
        source = held
    snapshot = source.snapshot if isinstance(source, NodeMetrics) else source
    if not callable(snapshot):
        raise ConfigError(f"metrics source: expected a node, a NodeMetrics or a snapshot "
                          f"callable, got {type(source).__name__}")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsCollector(snapshot, node_label=node_label))
    server_class = _Server6 if ":" in host else _Server4
    try:
        server = server_class((host, port), _handler_for(registry))
    except OSError as exc:
        raise TransportError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
    return MetricsServer(server, registry)


class _Server4(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        """Bind without HTTPServer's reverse DNS lookup of the host."""
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])


class _Server6(_Server4):
    address_family = socket.AF_INET6


def _handler_for(registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    """A request handler class that answers GET/HEAD ``/metrics`` from ``registry``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._answer(with_body=True)

        def do_HEAD(self) -> None:
            self._answer(with_body=False)

        def _answer(self, *, with_body: bool) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            try:
                body = generate_latest(registry)
            except Exception as exc:  # a failing snapshot must not kill the server
                self.send_error(500, f"collecting metrics failed: {type(exc).__name__}")
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Silent: scrapes are not worth a log line each."""

    return Handler
