"""Spans and propagation: one CLIENT span per request, events for attempts/retries/breaker, W3C traceparent."""

from __future__ import annotations

import random
import typing

import pytest
from core_fakes import FakeAgent, FakeRouter, make_agent
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import UnknownCapability
from reach_plugins.model import ReachRequest
from reach_plugins.telemetry import spans as telemetry
from reach_plugins.testing.clock import FakeClock


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def setup(provider: TracerProvider | None, instances: int = 3) -> tuple[FakeAgent, Pipeline]:
    clock = FakeClock()
    fake = FakeAgent(clock)
    router = FakeRouter([make_agent(instances=instances)])
    pipeline = Pipeline(
        router=router, transport=fake.transport, clock=clock, rng=random.Random(0), tracer_provider=provider
    )
    router.is_available = pipeline.is_available
    return fake, pipeline


def order() -> ReachRequest:
    return ReachRequest(capability="query_order", payload={"order_id": "A1"}, tenant="acme")


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    spans = exporter.get_finished_spans()
    assert len(spans) == 1
    return spans[0]


def test_attribute_names_are_final_constants() -> None:
    """Attribute, event and header names are module-level Final strings."""
    names = [name for name in vars(telemetry) if name.startswith(("ATTR_", "EVENT_", "HEADER_"))]
    assert len(names) > 20
    for name in names:
        assert isinstance(getattr(telemetry, name), str)
        assert telemetry.__annotations__[name] in ("Final", typing.Final)


async def test_one_client_span_per_request_with_attempt_events(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A retried request is one CLIENT span ``invoke_agent {agent}`` whose events are its attempts and retry."""
    fake, pipeline = setup(provider)
    fake.script("*", "503")
    await pipeline.run(order())
    span = only_span(exporter)
    assert span.name == "invoke_agent orders" and span.kind == SpanKind.CLIENT
    assert span.attributes is not None
    assert span.attributes[telemetry.ATTR_CAPABILITY] == "query_order"
    assert span.attributes[telemetry.ATTR_TENANT] == "acme"
    assert span.attributes[telemetry.ATTR_STATUS] == "success"
    assert span.attributes[telemetry.ATTR_ATTEMPTS] == 2
    names = [event.name for event in span.events]
    assert names == [telemetry.EVENT_ATTEMPT, telemetry.EVENT_RETRY, telemetry.EVENT_ATTEMPT]
    assert span.events[0].attributes is not None and span.events[0].attributes["outcome"] == "transient"


async def test_a_first_attempt_that_succeeds_records_no_span_event(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A call answered at once is the span alone: who answered in its attributes, no event, no dedup attribute."""
    _, pipeline = setup(provider)
    response = await pipeline.run(order().model_copy(update={"session_id": "s1"}))
    span = only_span(exporter)
    assert response.status == "success" and span.events == ()
    assert span.attributes is not None
    assert span.attributes[telemetry.ATTR_GEN_AI_AGENT_NAME] == "orders"
    assert span.attributes[telemetry.ATTR_GEN_AI_CONVERSATION_ID] == "s1"
    assert "reach.session_id" not in span.attributes and telemetry.ATTR_DEDUP_HIT not in span.attributes


async def test_traceparent_carries_the_request_span(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    """The traceparent header sent downstream names this request's span as parent."""
    fake, pipeline = setup(provider)
    await pipeline.run(order())
    span = only_span(exporter)
    context = span.get_span_context()
    assert context is not None
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    assert fake.calls[0].headers["traceparent"] == expected


async def test_upstream_context_becomes_the_parent(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    """A traceparent extracted from incoming headers (any case) parents the request span."""
    incoming = {"Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    token = otel_context.attach(telemetry.extract_context(incoming))
    try:
        fake, pipeline = setup(provider)
        await pipeline.run(order())
    finally:
        otel_context.detach(token)
    span = only_span(exporter)
    assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331
    assert fake.calls[0].headers["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")


async def test_without_an_sdk_nothing_is_recorded_but_context_passes_through() -> None:
    """With the API only (no SDK), no new trace starts, yet an upstream traceparent is forwarded unchanged."""
    fake, pipeline = setup(None)
    await pipeline.run(order())
    assert "traceparent" not in fake.calls[0].headers
    upstream = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    token = otel_context.attach(telemetry.extract_context({"traceparent": upstream}))
    try:
        await pipeline.run(order())
    finally:
        otel_context.detach(token)
    assert fake.calls[1].headers["traceparent"] == upstream


async def test_breaker_transitions_are_span_events(provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    """The request that opens a breaker carries the transition as a span event with its reason."""
    fake, pipeline = setup(provider, instances=1)
    fake.default("503")
    for _ in range(10):
        await pipeline.run(order())
    events = [event for span in exporter.get_finished_spans() for event in span.events]
    breaker_events = [event for event in events if event.name == telemetry.EVENT_BREAKER]
    assert len(breaker_events) == 1
    attributes = breaker_events[0].attributes
    assert attributes is not None and attributes[telemetry.ATTR_BREAKER_TO] == "open"
    assert "failure rate" in str(attributes["reason"])


async def test_failures_and_refusals_mark_the_span_as_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A failed request and a refused one both end their span with status ERROR and an error type."""
    fake, pipeline = setup(provider)
    fake.default("business")
    await pipeline.run(order())
    with pytest.raises(UnknownCapability):
        await pipeline.run(ReachRequest(capability="launch_rocket"))
    failed, refused = exporter.get_finished_spans()
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes[telemetry.ATTR_ERROR_TYPE] == "business"
    assert refused.status.status_code == StatusCode.ERROR
    assert refused.attributes is not None and refused.attributes[telemetry.ATTR_ERROR_TYPE] == "unknown_capability"


def test_inject_and_extract_round_trip(provider: TracerProvider) -> None:
    """inject_context writes the current span's traceparent; extract_context reads it back."""
    tracer = telemetry.get_tracer(provider)
    with tracer.start_as_current_span("outer") as span:
        headers: dict[str, str] = {}
        telemetry.inject_context(headers)
    restored = trace.get_current_span(telemetry.extract_context(headers)).get_span_context()
    assert restored.trace_id == span.get_span_context().trace_id
    assert restored.span_id == span.get_span_context().span_id


def test_get_tracer_uses_the_given_provider_not_the_global_one(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """Spans go to the provider passed in; the global provider is untouched."""
    with telemetry.get_tracer(provider).start_as_current_span("x"):
        pass
    assert [s.name for s in exporter.get_finished_spans()] == ["x"]
    assert not telemetry.get_tracer().start_span("y").is_recording()
