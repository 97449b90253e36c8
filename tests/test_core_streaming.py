"""Streaming through the core: retry before the first event only, idle cut, no total-timeout cut."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import pytest
from core_fakes import FakeRouter, make_agent

from reach_plugins.core import FakeClock, Pipeline
from reach_plugins.errors import ConnectError, LoopDetected
from reach_plugins.model import ErrorInfo, Hop, PoolConfig, ReachRequest, Timeouts
from reach_plugins.transport import BaseTransport, Call, StreamEvent

Script = list[tuple[float, StreamEvent | Exception]]


class ScriptedStreams(BaseTransport):
    """Each stream() call plays the next script: (delay, event or exception) steps on the fake clock."""

    def __init__(self, clock: FakeClock, *scripts: Script) -> None:
        self.clock = clock
        self.scripts = deque(scripts)
        self.calls: list[Call] = []

    async def stream(self, call: Call) -> AsyncIterator[StreamEvent]:
        self.calls.append(call)
        for delay, step in self.scripts.popleft():
            await self.clock.sleep(delay)
            if isinstance(step, Exception):
                raise step
            yield step


def data(text: str, delay: float = 0.1) -> tuple[float, StreamEvent | Exception]:
    return delay, StreamEvent("data", text)


END: tuple[float, StreamEvent | Exception] = (0.0, StreamEvent("end"))


def setup(*scripts: Script, **agent_fields: Any) -> tuple[FakeClock, ScriptedStreams, Pipeline]:
    clock = FakeClock()
    transport = ScriptedStreams(clock, *scripts)
    router = FakeRouter([make_agent(**agent_fields)])
    return clock, transport, Pipeline(router=router, transport=transport, clock=clock, rng=random.Random(4))


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
