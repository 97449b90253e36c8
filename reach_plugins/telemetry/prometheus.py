"""A server's ``/metrics``: OpenTelemetry instruments, scraped through the OpenTelemetry Prometheus exporter.

The gateway (and any server of ours) declares its few counters, gauges and
histograms by name; they live on an OpenTelemetry SDK ``MeterProvider`` of
its own whose ``PrometheusMetricReader`` writes into a private
``prometheus_client`` registry, so several servers in one process never
collide. The same provider carries :class:`~reach_plugins.telemetry.metrics.ReachMetrics`
(:attr:`Metrics.reach`): give it to the server's pipeline as its trace sink
and ``/metrics`` also shows attempts by outcome, breakers, route decisions
and the rest, under Prometheus names (``reach.client.requests`` ->
``reach_client_requests_total``).

Counters are the hot path's most frequent measurement (five per request in
a gateway) and an SDK ``Counter.add`` costs ~10 us; they are
:class:`~reach_plugins.telemetry.metrics.RunningTotals` (a dict update, observed by the
SDK when a scrape collects), so ``/metrics`` shows the same figures. The
SDK's exemplars are off: the Prometheus text format has no place for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

try:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('a server\'s /metrics needs the server extra: pip install "reach-plugins[server]"') from exc

from reach_plugins.telemetry.metrics import ReachMetrics, RunningTotals

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer


Kind = Literal["counter", "gauge", "histogram"]

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4
_METER: Final = "reach_plugins.server"


class Metrics:
    """Instruments declared up front by their Prometheus name, updated on the hot path, rendered on scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        reader = PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=self.registry)
        self._sdk = MeterProvider(metric_readers=[reader], exemplar_filter=AlwaysOffExemplarFilter())
        self._instruments: dict[str, Any] = {}
        self.reach = ReachMetrics(meter_provider=self._sdk)
        """Request-level metrics on the same ``/metrics``: pass it as the server's pipeline sink."""

    def declare(self, name: str, kind: Kind, help: str, *, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        """One instrument; a counter's ``_total`` suffix is the exporter's to add, so it is dropped here."""
        meter = self._sdk.get_meter(_METER)
        base = name.removesuffix("_total") if kind == "counter" else name
        if kind == "counter":
            self._instruments[name] = RunningTotals(meter, base, unit="", description=help)
        elif kind == "gauge":
            self._instruments[name] = meter.create_gauge(base, description=help)
        else:
            self._instruments[name] = meter.create_histogram(
                base, description=help, explicit_bucket_boundaries_advisory=sorted(buckets)
            )

    def inc(self, name: str, labels: dict[str, str] | None = None, value: float = 1.0) -> None:
        self._instruments[name].add(value, labels)

    def set(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        self._instruments[name].set(value, labels)

    def observe(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        self._instruments[name].record(value, labels)

    def render(self) -> str:
        """Every instrument in the Prometheus text format (0.0.4), as the exporter writes it."""
        return generate_latest(self.registry).decode("utf-8")

    def serve_http(self, host: str, port: int) -> WSGIServer:
        """Serve ``/metrics`` at ``host:port`` (0: a free port) from a thread, for a server without HTTP (the node).

        Stop it with ``server.shutdown()``; ``server.server_port`` is the port.
        """
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        return server

    def shutdown(self) -> None:
        """Stop the meter provider (a server that stops)."""
        self._sdk.shutdown()
