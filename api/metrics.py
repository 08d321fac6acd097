"""Prometheus metrics: HTTP request metrics (an ASGI middleware) and the engine's metrics
(a custom collector over the Broker), in one registry per app.

Each app has its own ``CollectorRegistry``, so several apps in one process (tests) do not
collide, and ``/metrics`` shows exactly this server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import prometheus_client as prom
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.metrics import EngineMetrics, Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0)


class HttpMetrics:
    """Requests by route template (never the raw path: bounded label sets), status, latency."""

    def __init__(self, registry: prom.CollectorRegistry) -> None:
        prom.disable_created_metrics()  # no *_created series: they double the exposition
        self.requests = prom.Counter("hourglass_http_requests", "HTTP requests answered",
                                ("method", "route", "status"), registry=registry)
        self.latency = prom.Histogram("hourglass_http_request_duration_seconds",
                                 "HTTP request latency, first byte in to last byte out",
                                 ("method", "route"), buckets=_LATENCY_BUCKETS,
                                 registry=registry)
        self.in_flight = prom.Gauge("hourglass_http_requests_in_flight",
                               "HTTP requests being handled (long polls included)",
                               registry=registry)
        # labels() takes a lock and builds a tuple each time; children are cached per key
        self._counters: dict[tuple[str, str, int], Any] = {}
        self._histograms: dict[tuple[str, str], Any] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        counter = self._counters.get((method, route, status))
        if counter is None:
            counter = self._counters[(method, route, status)] = self.requests.labels(
                method, route, str(status))
        counter.inc()
        histogram = self._histograms.get((method, route))
        if histogram is None:
            histogram = self._histograms[(method, route)] = self.latency.labels(method, route)
        histogram.observe(seconds)


class StreamPushCollector(Collector):
    """Frames the committing threads wrote to standing streams themselves (api/push.py), how
    often they handed a stream back to the event loop (a slow reader, a closing socket), how
    often such a write failed, and streams ended because their client stopped reading."""

    def __init__(self, totals: Callable[[], tuple[int, int, int, int]]) -> None:
        self._totals = totals

    def collect(self) -> Iterator[Metric]:
        pushed, handed_back, failed, stalled = self._totals()
        yield CounterMetricFamily("hourglass_stream_frames_pushed",
                                  "Stream frames written by the committing thread", pushed)
        yield CounterMetricFamily("hourglass_stream_handbacks",
                                  "Streams the committing thread handed back to the event loop",
                                  handed_back)
        yield CounterMetricFamily("hourglass_stream_push_failures",
                                  "Stream writes of the committing thread that failed (a "
                                  "socket error, a refused read; logged)", failed)
        yield CounterMetricFamily("hourglass_streams_stalled",
                                  "Streams ended because their client took no bytes for "
                                  "stream_stall_ms", stalled)


class ClusterCollector(Collector):
    """Cluster mode (docs/cluster.md): this node's role (one series per role, 1 for the
    current one), the write-ahead sequence it applied, and how far it trails the stream."""

    ROLES = ("leader", "follower", "starting")

    def __init__(self, role: Callable[[], str], applied_seq: Callable[[], int],
                 lag_ms: Callable[[], int], apply_lag: Histogram | None = None) -> None:
        self._role = role
        self._applied_seq = applied_seq
        self._lag_ms = lag_ms
        self._apply_lag = apply_lag

    def collect(self) -> Iterator[Metric]:
        current = self._role()
        role = GaugeMetricFamily("hourglass_cluster_role", "This node's role (1: current)",
                                 labels=["role"])
        for name in self.ROLES:
            role.add_metric([name], 1.0 if name == current else 0.0)
        yield role
        yield GaugeMetricFamily("hourglass_cluster_applied_seq",
                                "The write-ahead stream sequence this node has applied",
                                self._applied_seq())
        yield GaugeMetricFamily("hourglass_cluster_lag_ms",
                                "How long since this follower was at the stream's end (ms)",
                                self._lag_ms())
        if self._apply_lag is not None:
            snap = self._apply_lag.snapshot()
            family = HistogramMetricFamily("hourglass_" + self._apply_lag.name,
                                           self._apply_lag.help)
            family.add_metric([], [(_bound(b), float(c)) for b, c in snap.buckets],
                              sum_value=snap.sum)
            yield family


class HttpMetricsMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware: that costs a task per request)."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            self.metrics.in_flight.dec()
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            self.metrics.observe(scope["method"], template, status,
                                 time.perf_counter() - start)


class EngineCollector(Collector):
    """The engine's metrics (scheduler/metrics.py: plain counters, gauges and fixed-bucket
    histograms, no Prometheus inside) as Prometheus families named ``hourglass_<name>``,
    plus ``hourglass_ready``. ``refresh`` runs first (a cluster follower recounts what it
    applied: ``Broker.recount_applied``)."""

    def __init__(self, metrics: EngineMetrics, ready: Callable[[], bool],
                 refresh: Callable[[], None] | None = None) -> None:
        self._metrics = metrics
        self._ready = ready
        self._refresh = refresh

    def collect(self) -> Iterator[Metric]:
        if self._refresh is not None:
            self._refresh()
        ready = GaugeMetricFamily("hourglass_ready", "1 when the engine accepts work")
        ready.add_metric([], 1.0 if self._ready() else 0.0)
        yield ready
        for metric in self._metrics.collect():
            name = "hourglass_" + metric.name
            if isinstance(metric, Histogram):
                snap = metric.snapshot()
                family = HistogramMetricFamily(name, metric.help)
                family.add_metric([], [(_bound(b), float(c)) for b, c in snap.buckets],
                                  sum_value=snap.sum)
                yield family
                continue
            labels = [metric.label] if metric.label else []
            family_type = CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily
            out = family_type(name, metric.help, labels=labels)
            for sample_labels, value in metric.samples():
                out.add_metric([sample_labels[label] for label in labels], value)
            yield out


def _bound(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


def render(registry: prom.CollectorRegistry) -> bytes:
    return prom.generate_latest(registry)
