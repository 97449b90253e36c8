"""Streaming through the core: retry before the first event only, idle cut, no total-timeout cut, batching, usage."""

from __future__ import annotations

import random
from collections import deque
from contextlib import aclosing
from typing import Any

import pytest
from core_fakes import FakeRouter, make_agent
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import ConfigError, ConnectError, LoopDetected
from reach_plugins.model import ErrorInfo, Hop, PoolConfig, ReachRequest, ReachTrace, Timeouts
from reach_plugins.policy.batching import BatchPolicy, StreamBatcher, streamed_chars
from reach_plugins.telemetry.spans import (
    ATTR_AGENT,
    ATTR_STREAM_CHARS,
    ATTR_STREAM_EVENTS,
    ATTR_TENANT,
    EVENT_STREAMED,
)
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import BaseTransport, Call, EventStream, StreamEvent

Script = list[tuple[float, StreamEvent | Exception]]


class ScriptedStreams(BaseTransport):
    """Each stream() call plays the next script: (delay, event or exception) steps on the fake clock."""

    def __init__(self, clock: FakeClock, *scripts: Script) -> None:
        self.clock = clock
        self.scripts = deque(scripts)
        self.calls: list[Call] = []
        self.pulled = 0
        self.arrivals: list[float] = []
        self.closed = 0

    async def stream(self, call: Call) -> EventStream:
        self.calls.append(call)
        try:
            for delay, step in self.scripts.popleft():
                await self.clock.sleep(delay)
                if isinstance(step, Exception):
                    raise step
                self.pulled += 1
                self.arrivals.append(self.clock.now())
                yield step
        finally:
            self.closed += 1


def data(text: str, delay: float = 0.1) -> tuple[float, StreamEvent | Exception]:
    return delay, StreamEvent("data", text)


END: tuple[float, StreamEvent | Exception] = (0.0, StreamEvent("end"))


def setup(
    *scripts: Script, pipeline_options: dict[str, Any] | None = None, **agent_fields: Any
) -> tuple[FakeClock, ScriptedStreams, Pipeline]:
    clock = FakeClock()
    transport = ScriptedStreams(clock, *scripts)
    router = FakeRouter([make_agent(**agent_fields)])
    options = pipeline_options or {}
    return clock, transport, Pipeline(router=router, transport=transport, clock=clock, rng=random.Random(4), **options)


def chat(**fields: Any) -> ReachRequest:
    return ReachRequest(capability="query_order", payload={"q": "hi"}, **fields)


async def collect(pipeline: Pipeline, request: ReachRequest) -> list[StreamEvent]:
    return [event async for event in pipeline.stream(request)]


async def test_events_pass_through_and_end_once() -> None:
    """Data events arrive in order and the stream ends with exactly one end event."""
    _, transport, pipeline = setup([data("a"), data("b"), END])
    events = await collect(pipeline, chat())
    assert [(e.kind, e.data) for e in events] == [("data", "a"), ("data", "b"), ("end", None)]
    assert transport.calls[0].headers["X-Reach-Hops"] == "orders/query_order"


async def test_failure_before_the_first_event_is_retried() -> None:
    """A connect failure or an error event before any data is retried on a fresh stream."""
    error = StreamEvent("error", error=ErrorInfo(type="transient", message="warming up"))
    _, transport, pipeline = setup([(0.0, ConnectError("refused"))], [(0.0, error)], [data("ok"), END])
    events = await collect(pipeline, chat())
    assert [e.kind for e in events] == ["data", "end"]
    assert len(transport.calls) == 3


async def test_failure_after_the_first_event_is_not_retried() -> None:
    """Once an event was passed on, a failure becomes an error event, never a second stream."""
    _, transport, pipeline = setup([data("partial"), (0.1, ConnectError("gone"))], [data("never"), END])
    events = await collect(pipeline, chat())
    assert [e.kind for e in events] == ["data", "error"]
    assert len(transport.calls) == 1


async def test_idle_stream_is_cut_with_an_error_event() -> None:
    """No event for stream_idle seconds ends the stream with a timeout error event."""
    _, _, pipeline = setup([data("a"), data("late", delay=20.0), END], timeouts=Timeouts(stream_idle=5))
    events = await collect(pipeline, chat())
    assert [e.kind for e in events] == ["data", "error"]
    assert events[-1].error is not None and events[-1].error.type == "timeout"
    assert "5s" in events[-1].error.message


async def test_seed_lively_stream_outlives_the_default_timeout() -> None:
    """Seed story: a stream that keeps talking is not cut by the 30 s default total timeout."""
    script: Script = [data(str(i), delay=2.0) for i in range(40)] + [END]
    clock, _, pipeline = setup(script)
    start = clock.now()
    events = await collect(pipeline, chat())
    assert len(events) == 41 and events[-1].kind == "end"
    assert clock.now() - start == pytest.approx(80.0)


async def test_explicit_deadline_does_cut_a_stream() -> None:
    """When the caller set a deadline, the stream is cut there."""
    script: Script = [data(str(i), delay=2.0) for i in range(40)] + [END]
    _, _, pipeline = setup(script)
    events = await collect(pipeline, chat(timeout_ms=9000))
    assert events[-1].kind == "error" and events[-1].error is not None
    assert "deadline" in events[-1].error.message
    assert len(events) == 5


async def test_breaking_out_early_frees_the_slot() -> None:
    """A consumer that stops reading releases its concurrency slot for the next stream."""
    _, _, pipeline = setup([data("a"), data("b"), END], [data("c"), END], pool=PoolConfig(max_conns=1))
    async for _ in pipeline.stream(chat()):
        break
    events = await collect(pipeline, chat())
    assert [e.data for e in events] == ["c", None]


async def test_stream_refusals_raise_before_anything_is_sent() -> None:
    """The loop guard applies to streams: nothing is sent, the error is raised."""
    _, transport, pipeline = setup([END])
    with pytest.raises(LoopDetected):
        await collect(pipeline, chat(hops=[Hop(agent="orders", capability="query_order")]))
    assert transport.calls == []


# --------------------------------------------------------------------------- the batcher alone (sans-IO)

POLICY = BatchPolicy(max_events=4, max_delay=0.05)


def text(value: str) -> StreamEvent:
    return StreamEvent("data", value)


def test_batcher_lets_the_first_event_through_at_once() -> None:
    """The stream's first event is flushed on arrival: batching never delays time to first token."""
    batcher = StreamBatcher(POLICY)
    assert batcher.add(text("a"), 10.0) is True
    assert batcher.take() == [text("a")]
    assert batcher.add(text("b"), 10.0) is False


def test_batcher_flushes_a_full_batch() -> None:
    """Data events wait until max_events of them are buffered, then go together in arrival order."""
    batcher = StreamBatcher(POLICY)
    batcher.add(text("first"), 0.0)
    batcher.take()
    flushes = [batcher.add(text(str(n)), 0.001 * n) for n in range(POLICY.max_events)]
    assert flushes == [False] * (POLICY.max_events - 1) + [True]
    assert [event.data for event in batcher.take()] == [str(n) for n in range(POLICY.max_events)]
    assert batcher.due() is None


def test_batcher_is_due_max_delay_after_its_oldest_event() -> None:
    """The buffer falls due max_delay after its oldest event, and an event arriving then flushes it."""
    batcher = StreamBatcher(POLICY)
    batcher.add(text("first"), 0.0)
    batcher.take()
    batcher.add(text("a"), 1.0)
    batcher.add(text("b"), 1.02)
    assert batcher.due() == pytest.approx(1.0 + POLICY.max_delay)
    assert batcher.add(text("c"), 1.0 + POLICY.max_delay) is True


@pytest.mark.parametrize(
    "last", [StreamEvent("end"), StreamEvent("error", error=ErrorInfo(type="timeout", message="x"))]
)
def test_batcher_flushes_everything_with_end_or_error(last: StreamEvent) -> None:
    """An end or error event flushes at once and carries the buffered events with it."""
    batcher = StreamBatcher(POLICY)
    batcher.add(text("first"), 0.0)
    batcher.take()
    batcher.add(text("a"), 0.01)
    assert batcher.add(last, 0.011) is True
    assert batcher.take() == [text("a"), last]


@pytest.mark.parametrize(("events", "delay"), [(0, 0.05), (4, -0.1)])
def test_batch_policy_refuses_nonsense(events: int, delay: float) -> None:
    """A batch of no events or a negative delay is a ConfigError naming both settings."""
    with pytest.raises(ConfigError, match="max_events"):
        BatchPolicy(max_events=events, max_delay=delay)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.08), st.sampled_from(["data", "data", "data", "end"])), max_size=40))
def test_batcher_never_holds_more_or_longer_than_its_policy(steps: list[tuple[float, str]]) -> None:
    """Whatever the arrivals, a held buffer is below max_events and younger than max_delay; order is kept."""
    batcher = StreamBatcher(POLICY)
    now, sent, received = 0.0, [], []
    for n, (gap, kind) in enumerate(steps):
        now += gap
        due = batcher.due()
        if due is not None and due <= now:
            received += batcher.take()
        event = StreamEvent("data", n) if kind == "data" else StreamEvent("end")
        sent.append(event)
        if batcher.add(event, now):
            received += batcher.take()
        else:
            assert batcher.pending < POLICY.max_events
            due = batcher.due()
            assert due is not None and due - now <= POLICY.max_delay + 1e-9
    received += batcher.take()
    assert received == sent


def test_streamed_chars_counts_text_only() -> None:
    """String chunks and chat chunks' reply_content count their characters; other data counts none."""
    assert streamed_chars("héllo") == 5
    assert streamed_chars({"reply_content": "abc", "tool_calls": []}) == 3
    assert streamed_chars({"n": 1}) == 0
    assert streamed_chars(None) == 0


# --------------------------------------------------------------------------- batching through the pipeline


async def timed_batches(clock: FakeClock, pipeline: Pipeline, request: ReachRequest) -> list[tuple[float, list[Any]]]:
    return [(clock.now(), [(e.kind, e.data) for e in batch]) async for batch in pipeline.stream_batches(request)]


async def test_first_event_arrives_without_batching_delay() -> None:
    """The caller holds the first event at the moment it arrived, alone in its batch."""
    clock, _, pipeline = setup([data("a", delay=0.3), data("b", delay=0.01), END])
    start = clock.now()
    at, first = (await timed_batches(clock, pipeline, chat()))[0]
    assert at == pytest.approx(start + 0.3)
    assert first == [("data", "a")]


async def test_a_burst_is_handed_on_in_full_batches() -> None:
    """Forty events arriving at once reach the caller in batches of max_events, the last one carrying end."""
    burst: Script = [data(str(n), delay=0.0) for n in range(41)] + [END]
    _, _, pipeline = setup(burst, pipeline_options={"stream_batching": BatchPolicy(max_events=16)})
    batches = [[e.kind for e in batch] async for batch in pipeline.stream_batches(chat())]
    assert [len(batch) for batch in batches] == [1, 16, 16, 9]
    assert batches[-1][-1] == "end" and sum(batch.count("end") for batch in batches) == 1


async def test_no_event_waits_longer_than_max_delay() -> None:
    """Events trickling in faster than max_delay are each handed on at most max_delay after they arrived."""
    trickle: Script = [data(str(n), delay=0.02) for n in range(12)] + [(0.5, StreamEvent("end"))]
    clock, transport, pipeline = setup(trickle)
    batches = await timed_batches(clock, pipeline, chat())
    handed = [at for at, batch in batches for kind, _ in batch if kind == "data"]
    waits = [given - arrived for given, arrived in zip(handed, transport.arrivals[:-1], strict=True)]
    assert max(waits) <= BatchPolicy().max_delay + 1e-9
    assert len(batches) < len(handed)


async def test_end_flushes_the_buffer_at_once() -> None:
    """The events still buffered when the stream ends go out with the end event, without waiting."""
    clock, _, pipeline = setup([data("a"), data("b", delay=0.01), (0.01, StreamEvent("end"))])
    start = clock.now()
    at, last = (await timed_batches(clock, pipeline, chat()))[-1]
    assert at == pytest.approx(start + 0.12)
    assert last == [("data", "b"), ("end", None)]


async def test_a_mid_stream_failure_flushes_the_buffer_with_the_error() -> None:
    """A failure after the first event hands on what was buffered, then the error, in the same batch."""
    clock, _, pipeline = setup([data("a"), data("b", delay=0.01), (0.01, ConnectError("gone"))])
    start = clock.now()
    at, last = (await timed_batches(clock, pipeline, chat()))[-1]
    assert at == pytest.approx(start + 0.12)
    assert [kind for kind, _ in last] == ["data", "error"]


async def test_a_slow_caller_holds_the_agent_back() -> None:
    """A caller that stops reading stops the relay after one more full batch: nothing piles up in memory."""
    burst: Script = [data(str(n), delay=0.0) for n in range(100)] + [END]
    clock, transport, pipeline = setup(burst, pipeline_options={"stream_batching": BatchPolicy(max_events=8)})
    batches = pipeline.stream_batches(chat())
    assert len(await anext(batches)) == 1
    assert len(await anext(batches)) == 8
    await clock.sleep(5.0)
    assert transport.pulled == 1 + 8 + 8
    await batches.aclose()
    assert transport.closed == 1


async def test_leaving_mid_stream_stops_the_relay_and_frees_the_slot() -> None:
    """Breaking out while the relay reads closes the agent's stream and releases the concurrency slot."""
    long: Script = [data(str(n), delay=0.01) for n in range(50)] + [END]
    _, transport, pipeline = setup(long, [data("next"), END], pool=PoolConfig(max_conns=1))
    seen = 0
    async with aclosing(pipeline.stream(chat())) as events:
        async for _ in events:
            seen += 1
            if seen == 3:
                break
    assert transport.closed == 1 and transport.pulled < 50
    assert [e.data for e in await collect(pipeline, chat())] == ["next", None]


# --------------------------------------------------------------------------- usage on the span and in the trace


class Traces:
    def __init__(self) -> None:
        self.traces: list[ReachTrace] = []

    def emit(self, trace: ReachTrace) -> None:
        self.traces.append(trace)


async def test_stream_usage_is_counted_on_the_span_and_in_the_trace() -> None:
    """Events and characters handed to the caller land on the span (with tenant and agent) and in the trace."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = Traces()
    chunks = ["Hel", "lo, ", "world"]
    script: Script = [data(chunk) for chunk in chunks] + [(0.0, StreamEvent("data", {"n": 1})), END]
    _, _, pipeline = setup(script, pipeline_options={"tracer_provider": provider, "sink": sink})
    events = await collect(pipeline, chat(tenant="acme"))
    assert events[-1].kind == "end"
    (span,) = exporter.get_finished_spans()
    attributes = span.attributes or {}
    expected_chars = sum(len(chunk) for chunk in chunks)
    assert attributes[ATTR_STREAM_EVENTS] == len(chunks) + 1
    assert attributes[ATTR_STREAM_CHARS] == expected_chars
    assert attributes[ATTR_TENANT] == "acme" and attributes[ATTR_AGENT] == "orders"
    (trace,) = sink.traces
    usage = [event for event in trace.events if event["event"] == EVENT_STREAMED]
    assert usage == [{"event": EVENT_STREAMED, "at": usage[0]["at"], "events": 4, "chars": expected_chars}]


async def test_usage_counts_only_what_the_caller_received() -> None:
    """A caller that leaves early is charged for the batches it was handed, not for the whole answer."""
    sink = Traces()
    script: Script = [data("abcd", delay=0.01) for _ in range(30)] + [END]
    _, _, pipeline = setup(script, pipeline_options={"sink": sink})
    handed: list[StreamEvent] = []
    async with aclosing(pipeline.stream_batches(chat())) as batches:
        handed += await anext(batches)
        handed += await anext(batches)
    (trace,) = sink.traces
    (usage,) = [event for event in trace.events if event["event"] == EVENT_STREAMED]
    assert (usage["events"], usage["chars"]) == (len(handed), sum(len(event.data) for event in handed))
    assert 1 < usage["events"] < 30
    assert trace.status == "cancelled"
