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
:class:`~reach_plugins.telemetry.instruments.RunningTotals` (a dict update, observed by the
SDK when a scrape collects), so ``/metrics`` shows the same figures. The
SDK's exemplars are off: the Prometheus text format has no place for them.

``/metrics`` is safe to expose (issue 24): every label set goes through the
server's :class:`~reach_plugins.telemetry.labels.Vocabulary` (known names
only, a series cap); a scrape renders off the event loop, and scrapes that
arrive while one renders, or soon after, share its page (:meth:`Metrics.scrape`:
rendering takes at most a fifth of the process's time however fast scrapes
come), so a scrape never stalls a call; a bearer ``token`` guards it when one is set
(:func:`scrape_allowed`; the node's thread server checks it too).
"""

from __future__ import annotations

import asyncio
import hmac
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal
from wsgiref.simple_server import WSGIRequestHandler, make_server

try:
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, ThreadingWSGIServer
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('a server\'s /metrics needs the server extra: pip install "reach-plugins[server]"') from exc

from reach_plugins.telemetry.instruments import RunningTotals
from reach_plugins.telemetry.labels import Vocabulary
from reach_plugins.telemetry.metrics import ReachMetrics

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment


Kind = Literal["counter", "gauge", "histogram"]

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CONTENT_TYPE: Final = CONTENT_TYPE_PLAIN_0_0_4
RENDER_GAP: Final = 4.0
"""After a render that took t seconds, scrapes within RENDER_GAP * t get that page again (rendering <= 1/5 of the
time)."""
_METER: Final = "reach_plugins.server"


def scrape_allowed(token: str | None, authorization: str | None) -> bool:
    """Whether a scrape presenting ``authorization`` (the header's value) may read metrics guarded by ``token``."""
    if token is None:
        return True
    return hmac.compare_digest(f"Bearer {token}".encode(), (authorization or "").encode())


class Metrics:
    """Instruments declared up front by their Prometheus name, updated on the hot path, rendered on scrape.

    ``vocabulary`` decides which label values are kept (by default: all, under the series cap); ``token``, when
    given, is the bearer a scrape must present.
    """

    def __init__(self, *, vocabulary: Vocabulary | None = None, token: str | None = None) -> None:
        self.registry = CollectorRegistry()
        reader = PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=self.registry)
        self._sdk = MeterProvider(metric_readers=[reader], exemplar_filter=AlwaysOffExemplarFilter())
        self._instruments: dict[str, Any] = {}
        self.vocabulary = vocabulary if vocabulary is not None else Vocabulary()
        self.token = token
        self.reach = ReachMetrics(meter_provider=self._sdk, vocabulary=self.vocabulary)
        """Request-level metrics on the same ``/metrics``: pass it as the server's pipeline sink."""
        self._before: list[Callable[[], None]] = []
        self._rendering: asyncio.Future[str] | None = None
        self._page = ""
        self._fresh_until = 0.0

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
        self._instruments[name].add(value, self.vocabulary.labels(name, labels))

    def set(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        self._instruments[name].set(value, self.vocabulary.labels(name, labels))

    def observe(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        self._instruments[name].record(value, self.vocabulary.labels(name, labels))

    def before_render(self, update: Callable[[], None]) -> None:
        """Run ``update`` (set a gauge from live state, say) before every render, from whichever thread renders."""
        self._before.append(update)

    def _update(self) -> None:
        for update in self._before:
            update()

    def render(self) -> str:
        """Every instrument in the Prometheus text format (0.0.4), as the exporter writes it."""
        self._update()
        return generate_latest(self.registry).decode("utf-8")

    async def scrape(self) -> str:
        """:meth:`render` in a worker thread, shared by every scrape that arrives while it runs or within
        :data:`RENDER_GAP` times its duration after it.

        The event loop only waits; a burst of scrapes costs one render, not one each.
        """
        if time.monotonic() < self._fresh_until:
            return self._page
        rendering = self._rendering
        if rendering is None or rendering.get_loop() is not asyncio.get_running_loop():
            rendering = self._rendering = asyncio.ensure_future(asyncio.to_thread(self._timed_render))
            rendering.add_done_callback(self._rendered)
        return await asyncio.shield(rendering)

    def _timed_render(self) -> str:
        started = time.monotonic()
        page = self.render()
        ended = time.monotonic()
        self._page, self._fresh_until = page, ended + RENDER_GAP * (ended - started)
        return page

    def _rendered(self, done: asyncio.Future[str]) -> None:
        if self._rendering is done:
            self._rendering = None

    def serve_http(self, host: str, port: int) -> WSGIServer:
        """Serve ``/metrics`` at ``host:port`` (0: a free port) from a thread, for a server without HTTP (the node),
        or beside one (``--metrics-port``); a scrape must present :attr:`token` when there is one.

        Stop it with ``server.shutdown()``; ``server.server_port`` is the port.
        """
        server = make_server(host, port, self._wsgi(), ThreadingWSGIServer, handler_class=_Quiet)
        threading.Thread(target=server.serve_forever, name="reach-metrics", daemon=True).start()
        return server

    def _wsgi(self) -> WSGIApplication:
        exporter: WSGIApplication = make_wsgi_app(self.registry)

        def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
            if not scrape_allowed(self.token, environ.get("HTTP_AUTHORIZATION")):
                start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
                return [b"this /metrics needs its bearer token\n"]
            self._update()
            return exporter(environ, start_response)

        return app

    def shutdown(self) -> None:
        """Stop the meter provider (a server that stops)."""
        self._sdk.shutdown()


class _Quiet(WSGIRequestHandler):
    """No access log line per scrape on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass
