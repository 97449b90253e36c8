"""A server's ``/metrics``: OpenTelemetry instruments, scraped through the OpenTelemetry Prometheus exporter.

The gateway (and any server of ours) declares its few counters, gauges and
histograms by name; they live on an OpenTelemetry SDK ``MeterProvider`` of
its own whose ``PrometheusMetricReader`` writes into a private
``prometheus_client`` registry, so several servers in one process never
collide. The same provider carries :class:`~reach_plugins.metrics.ReachMetrics`
(:attr:`Metrics.reach`): give it to the server's pipeline as its trace sink
and ``/metrics`` also shows attempts by outcome, breakers, route decisions
and the rest, under Prometheus names (``reach.client.requests`` ->
``reach_client_requests_total``).

Counters are the hot path's most frequent measurement (five per request in
a gateway) and an SDK ``Counter.add`` costs ~10 us; here each counter adds up
in a dict of its own (~1 us) and hands its totals to the SDK counter just
before each scrape collects, so ``/metrics`` shows the same figures. The
SDK's exemplars are off: the Prometheus text format has no place for them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from opentelemetry import metrics as otel
from opentelemetry.util.types import Attributes

try:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest, start_http_server
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('a server\'s /metrics needs the server extra: pip install "reach-plugins[server]"') from exc

from reach_plugins.metrics import ReachMetrics

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from opentelemetry.context import Context
    from prometheus_client.metrics_core import Metric

Kind = Literal["counter", "gauge", "histogram"]

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4
_METER: Final = "reach_plugins.server"


class _Tally(otel.Counter):
    """A counter that adds up per attribute set in a dict, and hands the totals to ``counter`` on :meth:`flush`."""

    def __init__(self, counter: otel.Counter, lock: threading.Lock) -> None:
        self._counter = counter
        self._lock = lock
        self._pending: dict[tuple[tuple[str, Any], ...], float] = {}

    def add(self, amount: float, attributes: Attributes = None, context: Context | None = None) -> None:
        key = tuple(attributes.items()) if attributes else ()
        try:
            with self._lock:
                self._pending[key] = self._pending.get(key, 0) + amount
        except TypeError:  # an unhashable attribute value (a list): measured as it comes
            self._counter.add(amount, attributes, context)

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for key, amount in pending.items():
            self._counter.add(amount, dict(key))


class _TallyMeter(otel.Meter):
    """``meter`` whose counters are :class:`_Tally` counters; every other instrument is the SDK's own."""

    def __init__(self, meter: otel.Meter, tallies: list[_Tally], lock: threading.Lock) -> None:
        super().__init__(meter.name, meter.version, meter.schema_url)
        self._meter = meter
        self._tallies = tallies
        self._lock = lock

    def create_counter(self, *args: Any, **kwargs: Any) -> otel.Counter:
        tally = _Tally(self._meter.create_counter(*args, **kwargs), self._lock)
        self._tallies.append(tally)
        return tally

    def create_up_down_counter(self, *args: Any, **kwargs: Any) -> otel.UpDownCounter:
        return self._meter.create_up_down_counter(*args, **kwargs)

    def create_observable_counter(self, *args: Any, **kwargs: Any) -> otel.ObservableCounter:
        return self._meter.create_observable_counter(*args, **kwargs)

    def create_histogram(self, *args: Any, **kwargs: Any) -> otel.Histogram:
        return self._meter.create_histogram(*args, **kwargs)

    def create_gauge(self, *args: Any, **kwargs: Any) -> Any:
        return self._meter.create_gauge(*args, **kwargs)

    def create_observable_gauge(self, *args: Any, **kwargs: Any) -> otel.ObservableGauge:
        return self._meter.create_observable_gauge(*args, **kwargs)

    def create_observable_up_down_counter(self, *args: Any, **kwargs: Any) -> otel.ObservableUpDownCounter:
        return self._meter.create_observable_up_down_counter(*args, **kwargs)


class _TallyProvider(otel.MeterProvider):
    """The SDK provider's meters with tallied counters; also a Prometheus collector that flushes them.

    The SDK provider comes in :meth:`wrap`, once its reader exists: the reader registers its collector in
    the registry, after this one, so a scrape flushes the tallies before it reads.
    """

    def __init__(self) -> None:
        self.provider: MeterProvider | None = None
        self._tallies: list[_Tally] = []
        self._lock = threading.Lock()

    def wrap(self, provider: MeterProvider) -> None:
        self.provider = provider

    def get_meter(
        self, name: str, version: str | None = None, schema_url: str | None = None, attributes: Attributes = None
    ) -> otel.Meter:
        if self.provider is None:
            raise RuntimeError("_TallyProvider.wrap(provider) comes before the first get_meter")
        return _TallyMeter(self.provider.get_meter(name, version, schema_url, attributes), self._tallies, self._lock)

    def collect(self) -> Iterator[Metric]:
        """Registered first in the scrape's registry: every tally reaches its SDK counter before it is read."""
        for tally in self._tallies:
            tally.flush()
        yield from ()


class Metrics:
    """Instruments declared up front by their Prometheus name, updated on the hot path, rendered on scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.provider = _TallyProvider()
        self.registry.register(self.provider)  # before the reader's collector: a scrape flushes the tallies first
        reader = PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=self.registry)
        self._sdk = MeterProvider(metric_readers=[reader], exemplar_filter=AlwaysOffExemplarFilter())
        self.provider.wrap(self._sdk)
        self._instruments: dict[str, Any] = {}
        self.reach = ReachMetrics(meter_provider=self.provider)
        """Request-level metrics on the same ``/metrics``: pass it as the server's pipeline sink."""

    def declare(self, name: str, kind: Kind, help: str, *, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        """One instrument; a counter's ``_total`` suffix is the exporter's to add, so it is dropped here."""
        meter = self.provider.get_meter(_METER)
        base = name.removesuffix("_total") if kind == "counter" else name
        if kind == "counter":
            self._instruments[name] = meter.create_counter(base, description=help)
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
