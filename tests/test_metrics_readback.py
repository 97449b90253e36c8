"""What a metrics reader sees of a scripted run: the same names, units, attributes, counts, sums and buckets as
recorded before the hot path stopped calling the SDK per request (``fixtures/metrics_readback.json``, written by
main at 818b963, which recorded straight into the SDK)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from core_fakes import FakeRouter, make_agent
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_span_id

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import ConnectError, ReachError
from reach_plugins.model import ErrorInfo, ReachRequest
from reach_plugins.telemetry import metrics as m
from reach_plugins.telemetry.metrics import ReachMetrics
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, MockTransport, Reply

GOLDEN = Path(__file__).parent / "fixtures" / "metrics_readback.json"


def snapshot(reader: InMemoryMetricReader) -> list[dict[str, Any]]:
    """Every metric a reader collects, with each point's attributes and value (or count, sum, min, max, buckets)."""
    data = reader.get_metrics_data()
    assert data is not None
    shown: list[dict[str, Any]] = []
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points = []
                for point in metric.data.data_points:
                    row: dict[str, Any] = {"attributes": dict(sorted((point.attributes or {}).items()))}
                    if isinstance(point, HistogramDataPoint):
                        row.update(
                            count=point.count, sum=point.sum, min=point.min, max=point.max,
                            bounds=list(point.explicit_bounds), buckets=list(point.bucket_counts),
                        )  # fmt: skip
                    else:
                        row["value"] = point.value
                    points.append(row)
                points.sort(key=lambda row: json.dumps(row["attributes"], sort_keys=True))
                kind = type(metric.data).__name__
                shown.append({"name": metric.name, "unit": metric.unit, "kind": kind, "points": points})
    return sorted(shown, key=lambda metric: metric["name"])


async def answer(call: Call) -> Reply:
    """What the payload's ``do`` says, after ``ms`` milliseconds of the fake clock (the latest script's)."""
    clock = CLOCKS[-1]
    await clock.sleep(float(call.request.payload.get("ms", 0)) / 1000.0)
    todo = call.request.payload.get("do", "ok")
    if todo == "usage":
        return Reply(status="success", data={"usage": {"prompt_tokens": 7, "completion_tokens": 5}})
    if todo == "text":
        return Reply(status="success", data="twelve chars" * 10)
    if todo == "business":
        return Reply(status="fail", error=ErrorInfo(type="business", message="no such order"), status_code=200)
    first = call.request.request_id not in TRIED
    TRIED.add(call.request.request_id)
    if todo == "flaky" and first:
        return Reply(status="fail", status_code=503)
    if todo == "refused" and first:
        raise ConnectError("refused: nothing ran")
    return Reply(status="success", data={"served_by": call.instance.instance_id})


CLOCKS: list[FakeClock] = []
TRIED: set[str] = set()
"""Requests that had an attempt already (``flaky`` and ``refused`` fail only the first)."""


async def scripted(pipeline: Pipeline, after_each: list[Callable[[], object]]) -> None:
    """Successes in several buckets, tenants, usage, a business refusal, a retry, a failover, a replay, a refused
    call and a stream; ``after_each`` runs after every call (collections mid-run must not change the totals)."""
    calls: list[dict[str, Any]] = [
        {"payload": {"ms": 0.5}},
        {"payload": {"ms": 3}, "tenant": "acme"},
        {"payload": {"ms": 40, "do": "usage"}, "tenant": "acme"},
        {"payload": {"ms": 700, "do": "business"}},
        {"payload": {"ms": 20, "do": "flaky"}},
        {"payload": {"ms": 2, "do": "refused"}, "tenant": "globex"},
        {"payload": {"ms": 12}, "idempotency_key": "k-1"},
        {"payload": {"ms": 12}, "idempotency_key": "k-1"},
        {"payload": {"ms": 4000}, "session_id": "s-1"},
    ]
    for fields in calls:
        await pipeline.run(ReachRequest(capability="query_order", **fields))
        for collect in after_each:
            collect()
    with pytest.raises(ReachError):
        await pipeline.run(ReachRequest(capability="no_such_thing"))
    streamed = ReachRequest(capability="query_order", payload={"ms": 8, "do": "text"}, tenant="acme")
    assert [event.kind async for event in pipeline.stream(streamed)][-1] == "end"


async def run_script(*readers: InMemoryMetricReader, after_each: list[Callable[[], object]]) -> InMemorySpanExporter:
    clock = FakeClock()
    CLOCKS.append(clock)
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    metrics = ReachMetrics(MeterProvider(metric_readers=list(readers)))
    pipeline = Pipeline(
        router=FakeRouter([make_agent(instances=3)]),
        transport=MockTransport(answer),
        clock=clock,
        rng=random.Random(7),
        sink=metrics,
        tracer_provider=tracer_provider,
    )
    await scripted(pipeline, after_each)
    return exporter


async def test_a_reader_sees_what_direct_sdk_recording_showed() -> None:
    """Counters, the duration histogram (counts, sums, min, max, buckets), attempts, usage: as recorded before."""
    reader = InMemoryMetricReader()
    await run_script(reader, after_each=[])
    assert snapshot(reader) == json.loads(GOLDEN.read_text())


async def test_readers_collecting_at_different_times_see_the_same_totals() -> None:
    """A reader collecting after every call, one only at the end, one taking deltas: the same totals as before."""
    often, once = InMemoryMetricReader(), InMemoryMetricReader()
    delta = InMemoryMetricReader(preferred_temporality={Histogram: AggregationTemporality.DELTA})
    deltas: list[list[dict[str, Any]]] = []
    await run_script(often, once, delta, after_each=[often.get_metrics_data, lambda: deltas.append(snapshot(delta))])
    golden = json.loads(GOLDEN.read_text())
    assert snapshot(often) == snapshot(once) == golden
    deltas.append(snapshot(delta))
    summed: dict[str, list[float]] = {}
    for taken in deltas:
        for row in taken:
            if row["name"] == m.REQUEST_DURATION:
                for point in row["points"]:
                    key = json.dumps(point["attributes"], sort_keys=True)
                    count, buckets = summed.setdefault(key, [0, [0] * len(point["buckets"])])
                    added = [a + b for a, b in zip(buckets, point["buckets"], strict=True)]
                    summed[key] = [count + point["count"], added]
    (expected,) = [row for row in golden if row["name"] == m.REQUEST_DURATION]
    assert summed == {
        json.dumps(point["attributes"], sort_keys=True): [point["count"], point["buckets"]]
        for point in expected["points"]
    }


async def test_the_duration_histogram_keeps_its_exemplars_span() -> None:
    """A sampled request's duration still carries that request's span as its exemplar (trace-based filter)."""
    reader = InMemoryMetricReader()
    exporter = await run_script(reader, after_each=[])
    data = reader.get_metrics_data()
    assert data is not None
    durations = [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == m.REQUEST_DURATION
        for point in metric.data.data_points
    ]
    spans = {format_span_id(span.context.span_id) for span in exporter.get_finished_spans()}
    exemplars = [exemplar for point in durations for exemplar in point.exemplars]
    assert exemplars and all(format_span_id(exemplar.span_id or 0) in spans for exemplar in exemplars)
