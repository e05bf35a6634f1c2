"""Counters, gauges and latency histograms for one node, in plain Python.

One thread (the node's) writes; any other thread (an HTTP exporter) may call
:meth:`NodeMetrics.snapshot` at any time. Counter and gauge writes are a dict
store under the GIL; a histogram observation takes an uncontended lock so that
its count, sum and buckets always agree in a snapshot.

Counters (monotonic ints; :meth:`NodeMetrics.count`):

- ``fetches_started``: fetches the host asked for.
- ``fetches_succeeded``: fetches that ended in a successful LoadResult.
- ``fetches_failed``: fetches that ended in a failed LoadResult; by its reason
  (``FailReason``): ``fetches_failed_peer_failed`` (transfer_done(false)),
  ``fetches_failed_timeout`` (the load deadline), ``fetches_failed_finished`` (the host
  finished or cancelled the request) and ``fetches_failed_session_ended``.
- ``fetch_bytes``: bytes we loaded from peers.
- ``served_bytes``: bytes we wrote to peers.
- ``lookups_started``: lookups the host asked for.
- ``lookups_answered``: host lookups whose every key the peer answered.
- ``lookups_failed``: host lookups that ended with keys unanswered (deadline, finish,
  session end; ``LookupResult.answered`` False).
- ``lookup_keys_hit``, ``lookup_keys_missed``: keys of host lookups answered as held,
  and not (an unanswered key counts as missed).
- ``lookups_served``: lookups from peers that we answered.
- ``stores_started``: stores the host asked for.
- ``aborts_sent``: aborts we sent to peers.
- ``violations``: frames rejected as protocol violations.
- ``violation_closes``: sessions closed for sending more than ``max_violations``.
- ``idle_closes``: inbound sessions closed after ``idle_timeout_s`` without traffic.
- ``deaths``: sessions that died.
- ``restarts``: sessions ended because their peer came back as a new incarnation.
- ``reconnects``: sessions ended because their peer, having lost its side, connected again.
- ``redials``: sessions the node opened again to a peer its host connected to, after
  the last one died (``NodeConfig.reconnect_backoff_s``).
- ``stale_answers``: disconnects a dead session sent to a peer that still held it live.
- ``destinations_released``: held destinations released later (DestinationReleased).
- ``handshakes``: sessions that became ready.
- ``handshakes_rejected``: handshakes refused (mismatched configuration).
- ``identities_rate_limited``: frames of peer identities dropped at the door for a
  rate: new identities past ``max_new_peers_per_s`` from their host, dial-backs past
  their identity's or host's rate.
- ``results_dropped``: results for which the host held nothing (should stay 0).
- ``connections_resumed``: live sessions carried over to a new connection of their
  peer (its own ended and it connected again from its host).
- ``restarts_refused``: connects of a peer whose session ended, dropped because it
  came back more often than allowed (a few at once, then one per 5 s).
- ``tombstones_dropped``: per-request tombstones dropped before their lifetime, past
  ``max_tombstones`` or ``max_node_tombstones``.
- ``host_errors``: exceptions raised by the host's callbacks (``on_fetch``, ``on_lookup``,
  ``on_result``); each is logged, what it was about fails, and the node serves on.

Gauges (floats; :meth:`NodeMetrics.set_gauge`):

- ``peers``: live sessions.
- ``open_loads``: loads in flight.
- ``open_stores``: stores in flight.
- ``destinations_held``: destinations of failed loads (``released=False``) whose
  DestinationReleased has not come yet (per peer: ``Node.held_destinations()``).

Histograms (seconds; :meth:`NodeMetrics.observe`), with the fixed bounds
:data:`BUCKETS` (50 µs to 60 s, plus an implicit ``+Inf`` bucket):

- ``fetch_seconds``: host fetch to LoadResult.
- ``handshake_seconds``: session start to ready.
- ``lookup_seconds``: host lookup to LookupResult.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Any, Final

__all__ = ["BUCKETS", "COUNTERS", "GAUGES", "HISTOGRAMS", "NodeMetrics"]

#: Counter name -> what it counts.
COUNTERS: Final[dict[str, str]] = {
    "fetches_started": "Fetches the host asked for.",
    "fetches_succeeded": "Fetches that ended in a successful LoadResult.",
    "fetches_failed": "Fetches that ended in a failed LoadResult.",
    "fetches_failed_peer_failed": "Failed fetches the peer answered transfer_done(false).",
    "fetches_failed_timeout": "Failed fetches whose load deadline passed (aborted).",
    "fetches_failed_finished": "Failed fetches whose request the host finished or cancelled.",
    "fetches_failed_session_ended": "Failed fetches whose session died or was closed.",
    "fetch_bytes": "Bytes loaded from peers.",
    "destinations_released": "Held destinations released later (DestinationReleased).",
    "served_bytes": "Bytes written to peers.",
    "lookups_started": "Lookups the host asked for.",
    "lookups_answered": "Host lookups whose every key the peer answered.",
    "lookups_failed": "Host lookups that ended with keys unanswered (deadline, finish, "
                      "session end).",
    "lookup_keys_hit": "Keys of host lookups answered as held.",
    "lookup_keys_missed": "Keys of host lookups not held or not answered.",
    "lookups_served": "Lookups from peers that were answered.",
    "stores_started": "Stores the host asked for.",
    "aborts_sent": "Aborts sent to peers.",
    "violations": "Frames rejected as protocol violations.",
    "violation_closes": "Sessions closed for sending more rejected frames than allowed.",
    "idle_closes": "Inbound sessions closed after idle_timeout_s without traffic.",
    "deaths": "Sessions that died.",
    "restarts": "Peers that came back as a new incarnation (a new process): a session "
                "ended by its connect, or a new session ready with it.",
    "reconnects": "Sessions ended because their peer, having lost its side, connected again.",
    "redials": "Sessions the node opened again to a peer its host connected to, after the "
               "last one died (NodeConfig.reconnect_backoff_s).",
    "stale_answers": "Disconnects a dead session sent to a peer that still held it live.",
    "handshakes": "Sessions that became ready.",
    "handshakes_rejected": "Handshakes refused for a mismatched configuration.",
    "identities_rate_limited": "Frames of peer identities dropped at the door for a rate: "
                               "new identities past max_new_peers_per_s from their host, "
                               "dial-backs past their identity's or host's rate.",
    "results_dropped": "Results for which the host held nothing (should stay 0).",
    "connections_resumed": "Live sessions carried over to a new connection of their peer "
                           "(its own ended and it connected again from its host).",
    "restarts_refused": "Connects of a peer whose session ended, dropped: it came back more "
                        "often than allowed (a few at once, then one per 5 s).",
    "tombstones_dropped": "Per-request tombstones dropped before their lifetime, past "
                          "max_tombstones (a session) or max_node_tombstones (the node).",
    "host_errors": "Exceptions raised by the host's callbacks (each logged; what it was "
                   "about fails, the node serves on).",
}

#: Gauge name -> what it measures.
GAUGES: Final[dict[str, str]] = {
    "peers": "Live sessions.",
    "open_loads": "Loads in flight.",
    "open_stores": "Stores in flight.",
    "destinations_held": "Destinations of failed loads (released=False) whose release "
                         "notice has not come yet (per peer: Node.held_destinations()).",
}

#: Histogram name -> what it times (always in seconds).
HISTOGRAMS: Final[dict[str, str]] = {
    "fetch_seconds": "Seconds from a host fetch to its LoadResult.",
    "handshake_seconds": "Seconds from session start to ready.",
    "lookup_seconds": "Seconds from a host lookup to its LookupResult.",
}

#: Upper bounds (``le``, seconds) of the finite histogram buckets, ascending.
BUCKETS: Final[tuple[float, ...]] = (
    0.00005, 0.0001, 0.00025, 0.0005,
    0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05,
    0.1, 0.25, 0.5,
    1.0, 2.5, 5.0,
    10.0, 30.0, 60.0,
)


class _Histogram:
    """Per-bucket (non-cumulative) counts, the last one for ``+Inf``, with sum, min, max."""

    __slots__ = ("counts", "max", "min", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")


class NodeMetrics:
    """The fixed set of metrics of one node (names in the module docstring).

    Written by one thread; :meth:`snapshot` is safe from any thread.
    """

    def __init__(self) -> None:
        self._counters: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self._gauges: dict[str, float] = dict.fromkeys(GAUGES, 0.0)
        self._histograms: dict[str, _Histogram] = {name: _Histogram() for name in HISTOGRAMS}
        self._lock = threading.Lock()

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` (>= 0) to counter ``name``."""
        if n < 0:
            raise ValueError(f"counter {name!r}: cannot add a negative amount ({n})")
        try:
            self._counters[name] += n
        except KeyError:
            raise KeyError(_unknown("counter", name, COUNTERS)) from None

    def set_gauge(self, name: str, value: float) -> None:
        """Set gauge ``name`` to ``value``."""
        if name not in self._gauges:
            raise KeyError(_unknown("gauge", name, GAUGES))
        self._gauges[name] = float(value)

    def set_loop_gauges(self, peers: int, open_loads: int, open_stores: int,
                        destinations_held: int) -> None:
        """Set the four gauges a node's loop refreshes after every turn, in one call."""
        gauges = self._gauges
        gauges["peers"] = float(peers)
        gauges["open_loads"] = float(open_loads)
        gauges["open_stores"] = float(open_stores)
        gauges["destinations_held"] = float(destinations_held)

    def observe(self, name: str, seconds: float) -> None:
        """Record one duration of ``seconds`` (>= 0) in histogram ``name``."""
        try:
            hist = self._histograms[name]
        except KeyError:
            raise KeyError(_unknown("histogram", name, HISTOGRAMS)) from None
        if not seconds >= 0.0:  # also rejects NaN
            raise ValueError(f"histogram {name!r}: expected seconds >= 0, got {seconds!r}")
        seconds = float(seconds)
        index = bisect_left(BUCKETS, seconds)  # first bound >= seconds: "le" semantics
        with self._lock:
            hist.counts[index] += 1
            hist.sum += seconds
            if seconds < hist.min:
                hist.min = seconds
            if seconds > hist.max:
                hist.max = seconds

    def snapshot(self) -> dict[str, Any]:
        """A JSON-serialisable copy of every metric.

        ``histograms[name]["buckets"]`` lists ``[le, cumulative_count]`` for the
        finite bounds in :data:`BUCKETS`; the ``+Inf`` bucket is ``count``. ``p50``
        and ``p99`` are estimated from the buckets (linear within a bucket, clamped
        to the observed min and max), ``None`` while the histogram is empty.
        """
        with self._lock:
            counters = dict(self._counters)
            gauges = dict(self._gauges)
            hists = {
                name: (list(h.counts), h.sum, h.min, h.max)
                for name, h in self._histograms.items()
            }
        histograms: dict[str, Any] = {}
        for name, (counts, total, low, high) in hists.items():
            cumulative: list[int] = []
            running = 0
            for c in counts:
                running += c
                cumulative.append(running)
            histograms[name] = {
                "count": running,
                "sum": total,
                "buckets": [[le, cum] for le, cum in zip(BUCKETS, cumulative, strict=False)],
                "p50": _quantile(0.50, counts, low, high),
                "p99": _quantile(0.99, counts, low, high),
            }
        return {"counters": counters, "gauges": gauges, "histograms": histograms}


def _quantile(q: float, counts: list[int], low: float, high: float) -> float | None:
    """Estimate quantile ``q`` from per-bucket counts (last one ``+Inf``)."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, c in enumerate(counts):
        if c and seen + c >= rank:
            lower = BUCKETS[index - 1] if index > 0 else 0.0
            upper = BUCKETS[index] if index < len(BUCKETS) else high
            estimate = lower + (upper - lower) * (rank - seen) / c
            return min(max(estimate, low), high)
        seen += c
    return high  # unreachable: the last non-empty bucket always reaches rank


def _unknown(kind: str, name: str, known: dict[str, str]) -> str:
    return f"unknown {kind} {name!r}; known {kind}s: {', '.join(sorted(known))}"
