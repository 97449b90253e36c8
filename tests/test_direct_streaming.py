"""Streaming through DirectTransport against a real agent: events, end, idle cut, mid-stream failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from core_fakes import FakeRouter
from faultproxy import FaultProxy
from transport_conformance import make_call

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import BusinessError
from reach_plugins.model import Instance, ReachRequest, Timeouts
from reach_plugins.transport import Call, StreamEvent
from transports.direct import DirectTransport

agent = ReachAgent("streamer", tokens="open")


@agent.capability("spell")
async def spell(word: str) -> AsyncIterator[str]:
    """One event per letter."""
    for letter in word:
        yield letter


@agent.capability("ticker")
async def ticker(count: int) -> AsyncIterator[dict[str, int]]:
    """Numbered events, a little apart so they travel in separate packets."""
    for n in range(count):
        await asyncio.sleep(0.005)
        yield {"n": n}


@agent.capability("hang")
async def hang(first: bool) -> AsyncIterator[str]:
    """Optionally one event, then silence until the caller leaves."""
    if first:
        yield "first"
    await asyncio.Event().wait()


@agent.capability("broken")
async def broken() -> AsyncIterator[str]:
    """One event, then a crash."""
    yield "partial"
    raise RuntimeError("disk full")


@agent.capability("refuse")
async def refuse() -> AsyncIterator[str]:
    """A business refusal before any event."""
    raise BusinessError("quota exhausted")
    yield "never"


@agent.capability("lookup")
def lookup(key: str) -> dict[str, str]:
    """A plain, non-streaming handler."""
    return {"key": key, "value": key.upper()}


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer(agent.app) as server:
        yield server


@pytest.fixture(params=["aiohttp", "httpx"])
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[DirectTransport]:
    async with DirectTransport(engine=request.param) as transport:
        yield transport


def stream_call(url: str, capability: str, payload: dict[str, Any] | None = None, **options: Any) -> Call:
    call = make_call(url, capability, payload, **options)
    descriptor = agent.descriptor(url).model_copy(update={"timeouts": Timeouts(stream_idle=0.2)})
    return Call(request=call.request, agent=descriptor, instance=call.instance, timeout=call.timeout)


async def collect(transport: DirectTransport, call: Call) -> list[StreamEvent]:
    return [event async for event in transport.stream(call)]


async def test_events_then_end(transport: DirectTransport, server: BackgroundServer) -> None:
    """Each yielded item is one data event, in order, followed by end."""
    events = await collect(transport, stream_call(server.url, "spell", {"word": "ship"}))
    assert [event.data for event in events[:-1]] == list("ship")
    assert [event.kind for event in events] == ["data"] * 4 + ["end"]


async def test_plain_handler_streams_as_one_event(transport: DirectTransport, server: BackgroundServer) -> None:
    """A non-streaming capability asked to stream answers one data event and end."""
    events = await collect(transport, stream_call(server.url, "lookup", {"key": "a1"}))
    assert [(event.kind, event.data) for event in events] == [("data", {"key": "a1", "value": "A1"}), ("end", None)]


async def through_core(
    transport: DirectTransport, url: str, payload: dict[str, Any], **timeouts: float
) -> list[StreamEvent]:
    """The events of a ``hang`` stream read through the core (which alone times a stream) over ``transport``."""
    descriptor = agent.descriptor(url)
    instance = Instance(agent=descriptor.name, instance_id=f"{descriptor.name}-0", endpoint=url)
    descriptor = descriptor.model_copy(update={"timeouts": Timeouts(**timeouts), "instances": [instance]})
    pipeline = Pipeline(router=FakeRouter([descriptor]), transport=transport)
    request = ReachRequest(capability="hang", payload=payload)
    return [event async for event in pipeline.stream(request)]


async def test_idle_stream_ends_with_a_timeout_event(transport: DirectTransport, server: BackgroundServer) -> None:
    """After an event, stream_idle seconds of silence end the stream with a timeout error event (cut by the core)."""
    events = await through_core(transport, server.url, {"first": True}, stream_idle=0.2)
    assert [event.kind for event in events] == ["data", "error"]
    error = events[-1].error
    assert error is not None
    assert error.type == "timeout"
    assert "stream_idle" in error.message


async def test_idle_before_any_event_is_cut_at_ttfbt(transport: DirectTransport, server: BackgroundServer) -> None:
    """Silence before the first event is cut at ttfbt by the core: nothing was committed; the stream ends in error."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    events = await through_core(transport, server.url, {"first": False}, ttfbt=0.2, response=5.0)
    assert [event.kind for event in events] == ["error"]
    assert events[0].error is not None and events[0].error.type == "timeout"
    assert loop.time() - started < 4.0


async def test_handler_crash_mid_stream_is_an_error_event(transport: DirectTransport, server: BackgroundServer) -> None:
    """A failure after events were sent surfaces as a handler_failed error event, never a silent retry."""
    events = await collect(transport, stream_call(server.url, "broken"))
    assert [event.kind for event in events] == ["data", "error"]
    assert events[1].error is not None
    assert events[1].error.type == "handler_failed"
    assert "error id" in events[1].error.message and "disk full" not in events[1].error.message


async def test_business_refusal_is_an_error_event(transport: DirectTransport, server: BackgroundServer) -> None:
    """A business refusal of a stream arrives as a business error event."""
    events = await collect(transport, stream_call(server.url, "refuse"))
    assert [(event.kind, event.error.type if event.error else None) for event in events] == [("error", "business")]


async def test_refused_request_is_one_error_event(transport: DirectTransport, server: BackgroundServer) -> None:
    """A request the agent refuses before streaming (unknown capability) is one error event."""
    events = await collect(transport, stream_call(server.url, "no_such_thing"))
    assert [event.kind for event in events] == ["error"]
    assert events[0].error is not None
    assert events[0].error.type == "unknown_capability"


async def test_cut_connection_mid_stream_is_an_error_event(
    transport: DirectTransport, server: BackgroundServer
) -> None:
    """A connection cut after some events ends the stream with an error event and no end."""
    async with FaultProxy((server.host, server.port)) as proxy:
        proxy.cut_after = 400
        events = await collect(transport, stream_call(proxy.url, "ticker", {"count": 50}))
    kinds = [event.kind for event in events]
    assert kinds[-1] == "error"
    assert "data" in kinds
    assert "end" not in kinds
    assert [event.data["n"] for event in events[:-1]] == list(range(len(events) - 1))


async def test_leaving_early_keeps_the_transport_usable(transport: DirectTransport, server: BackgroundServer) -> None:
    """A consumer that stops reading closes that stream; the next call works."""
    async for event in transport.stream(stream_call(server.url, "ticker", {"count": 50})):
        assert event.data == {"n": 0}
        break
    reply = await transport.send(stream_call(server.url, "lookup", {"key": "b2"}))
    assert reply.data == {"key": "b2", "value": "B2"}
