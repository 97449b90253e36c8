"""What the resilience core costs per call: the pipeline over a no-fault MockTransport vs the transport alone.

Real time, no OpenTelemetry SDK configured (spans are no-ops), one event loop,
calls made one after another. Overhead = p50(pipeline) - p50(transport alone).

Then what an OpenTelemetry SDK adds, on the same pipeline: a ``TracerProvider``
whose spans go through a ``SimpleSpanProcessor`` to an exporter that drops them
(so export is not measured, only what recording a span costs), and the same
plus :class:`~reach_plugins.telemetry.metrics.ReachMetrics` on a ``MeterProvider`` with an
in-memory reader. Added cost = p50(with the SDK) - p50(pipeline.run).

    python benchmarks/bench_overhead.py          # prints the table, writes benchmarks/results/overhead.json
"""

from __future__ import annotations

import asyncio
import functools
import json
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import propagate
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.model import AgentDescriptor, Capability, Instance, ReachRequest, RouteDecision
from reach_plugins.telemetry.metrics import ReachMetrics
from reach_plugins.telemetry.spans import spans_are_noop
from reach_plugins.transport import Call, MockTransport

CALLS = 40_000
WARMUP = 5_000
TARGET_US = 30.0
OTEL_TARGET_US = 40.0
"""Most an OpenTelemetry SDK (spans, then spans and metrics) may add to a call (issue 18)."""
RESULTS = Path(__file__).parent / "results" / "overhead.json"


@dataclass(frozen=True)
class StaticRoute:
    decision: RouteDecision
    agent: AgentDescriptor
    instance: Instance
    capability: Capability
    affinity: str = "none"


class StaticRouter:
    """Always the same instance: routing cost is not the core's and is measured by the routing benchmark."""

    def __init__(self, route: StaticRoute) -> None:
        self._route = route

    def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> StaticRoute:
        return self._route


async def measure(call: Callable[[], Awaitable[Any]]) -> list[float]:
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(CALLS):
        started = clock()
        await call()
        samples.append((clock() - started) / 1000.0)
    return samples[WARMUP:]


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": statistics.median(ordered),
        "p90_us": ordered[int(0.9 * len(ordered))],
        "p99_us": ordered[int(0.99 * len(ordered))],
    }


async def run() -> dict[str, Any]:
    capability = Capability(name="query_order")
    instance = Instance(agent="orders", instance_id="orders-0", endpoint="http://orders-0")
    agent = AgentDescriptor(name="orders", capabilities=[capability], instances=[instance])
    decision = RouteDecision(
        capability="query_order", agent="orders", instance="orders-0", endpoint=instance.endpoint, reason="static"
    )
    transport = MockTransport(lambda call: {"status": "shipped"}, record=0)
    pipeline = Pipeline(router=StaticRouter(StaticRoute(decision, agent, instance, capability)), transport=transport)
    request = ReachRequest(capability="query_order", payload={"order_id": "A1"})
    call = Call(request=request, agent=agent, instance=instance, timeout=30.0)
    rows = {
        "transport alone": await measure(lambda: transport.send(call)),
        "pipeline.run": await measure(lambda: pipeline.run(request)),
        "pipeline.run(trace=True)": await measure(lambda: pipeline.run(request, trace=True)),
    }
    # Before the dedup row, whose 40,000 stored keys would make every garbage collection of the SDK rows dearer.
    rows.update(await with_sdk(StaticRouter(StaticRoute(decision, agent, instance, capability)), transport, request))
    keyed = iter([request.model_copy(update={"idempotency_key": f"k{n}"}) for n in range(CALLS)])
    rows["pipeline.run + dedup key"] = await measure(lambda: pipeline.run(next(keyed)))
    await pipeline.aclose()
    figures = {name: stats(samples) for name, samples in rows.items()}
    base = figures["transport alone"]["p50_us"]
    overhead = figures["pipeline.run"]["p50_us"] - base
    otel = {
        name: round(figures[name]["p50_us"] - figures["pipeline.run"]["p50_us"], 2) for name in (SPANS, SPANS_METRICS)
    }
    return {
        "settings": {"calls": CALLS - WARMUP, "python": platform.python_version(), "otel_sdk": not spans_are_noop()},
        "figures": figures,
        "overhead_p50_us": overhead,
        "target_p50_us": TARGET_US,
        "met": overhead <= TARGET_US,
        "otel_added_p50_us": otel,
        "otel_target_p50_us": OTEL_TARGET_US,
        "otel_met": all(added <= OTEL_TARGET_US for added in otel.values()),
        "otel_sdk_floor_p50_us": figures[SDK_FLOOR]["p50_us"],
    }


SDK_FLOOR = "OTel SDK floor: current span + event + inject"
"""What the SDK costs with none of our attributes: the part of the spans row that is not ours."""
SPANS = "pipeline.run, OTel SDK spans"
SPANS_METRICS = "pipeline.run, OTel SDK spans + metrics"


class DroppingExporter(SpanExporter):
    """Takes every span and keeps none: what is measured is recording spans, not exporting them."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def with_sdk(router: StaticRouter, transport: MockTransport, request: ReachRequest) -> dict[str, list[float]]:
    """The pipeline with an SDK tracer provider (spans dropped), then also with ReachMetrics (in-memory reader)."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(DroppingExporter()))
    reader = InMemoryMetricReader()
    metrics = ReachMetrics(MeterProvider(metric_readers=[reader]))
    tracer = tracer_provider.get_tracer("bench")

    async def sdk_floor() -> None:
        with tracer.start_as_current_span("reach query_order", kind=SpanKind.CLIENT) as span:
            span.add_event("reach.attempt")
            propagate.inject({})

    rows = {SDK_FLOOR: await measure(sdk_floor)}
    for name, sink in ((SPANS, None), (SPANS_METRICS, metrics)):
        pipeline = Pipeline(router=router, transport=transport, tracer_provider=tracer_provider, sink=sink)
        rows[name] = await measure(functools.partial(pipeline.run, request))
        await pipeline.aclose()
    if not reader.get_metrics_data():
        raise RuntimeError("ReachMetrics recorded nothing: the metrics row would measure no work")
    tracer_provider.shutdown()
    return rows


def main() -> int:
    results = asyncio.run(run())
    print(f"{'path':56} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8}")
    for name, row in results["figures"].items():
        print(f"{name:56} {row['p50_us']:8.2f} {row['p90_us']:8.2f} {row['p99_us']:8.2f}")
    verdict = "met" if results["met"] else "MISSED"
    print(f"\npipeline overhead p50: {results['overhead_p50_us']:.2f} us (target <= {TARGET_US:g} us: {verdict})")
    for name, added in results["otel_added_p50_us"].items():
        verdict = "met" if added <= OTEL_TARGET_US else "MISSED"
        print(f"added by '{name}': {added:.2f} us p50 (target <= {OTEL_TARGET_US:g} us: {verdict})")
    floor = results["otel_sdk_floor_p50_us"]
    print(f"of which the SDK's own floor (a bare span, an event, inject): {floor:.2f} us p50")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"written to {RESULTS}")
    return 0 if results["met"] and results["otel_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
