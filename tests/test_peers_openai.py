"""The openai-compatible adapter against a server whose replies are built from the ``openai`` package's models.

The server (tests/peers/openai_server.py) runs in the peers' virtualenv and
reports the last request body it received (``GET /last``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from peer_servers import peer

from reach_plugins import ReachClient
from reach_plugins.errors import Refused
from reach_plugins.model import AgentDescriptor
from reach_plugins.registry.memory import MemoryRegistry
from reach_plugins.transport import StreamEvent
from transports.direct import DirectTransport


@pytest.fixture(scope="module")
def openai_peer() -> Iterator[str]:
    with peer("openai_server.py", "/last") as url:
        yield url


async def client_for(url: str, **options: Any) -> ReachClient:
    registry = MemoryRegistry()
    agent = AgentDescriptor(
        name="assistant",
        protocol="openai-compatible",
        endpoints=[f"{url}/v1"],
        capabilities=["chat"],
        protocol_options={"model": "gpt-test", **options},
    )
    await registry.register_agent(agent)
    return ReachClient(registry=registry, transport=DirectTransport())


@pytest.fixture
async def reach(openai_peer: str) -> AsyncIterator[ReachClient]:
    client = await client_for(openai_peer)
    yield client
    await client.aclose()


def received(url: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{url}/last").json()
    return body


async def streamed(client: ReachClient, payload: dict[str, Any]) -> list[StreamEvent]:
    return [event async for event in client.stream("chat", payload, session_id=f"s-{uuid.uuid4().hex[:6]}")]


async def test_a_refusal_is_its_own_outcome_and_never_opens_the_breaker(reach: ReachClient) -> None:
    """content null + refusal: a 'refusal' failure carrying the text; 30 of them leave the instance reachable."""
    refusals = [await reach.reach("chat", {"query": "refuse please"}) for _ in range(30)]
    assert {(r.status, r.error.type if r.error else None) for r in refusals} == {("fail", "refusal")}
    assert refusals[0].data["refusal"] == "I can't help with that."
    with pytest.raises(Refused, match="can't help"):
        refusals[0].raise_for_status()
    after = await reach.reach("chat", {"query": "hello"})
    assert (after.status, after.data["reply_content"]) == ("success", "you said: hello")


async def test_request_fields_pass_through_untouched(reach: ReachClient, openai_peer: str) -> None:
    """A chat request's fields, known to openai or not, reach the server as sent."""
    payload = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 64,
        "parallel_tool_calls": False,
        "reasoning_effort": "low",
        "top_k": 5,
    }
    response = await reach.reach("chat", payload)
    assert response.status == "success", response.error
    body = received(openai_peer)
    assert {key: body[key] for key in payload} == payload


async def test_tool_style_payload_keeps_its_chat_fields(reach: ReachClient, openai_peer: str) -> None:
    """A {"query": ...} payload becomes the user message; its chat-completions fields still reach the server."""
    await reach.reach("chat", {"query": "hi", "max_completion_tokens": 9, "order_id": "A1"})
    body = received(openai_peer)
    assert (body["max_completion_tokens"], body["messages"], "order_id" in body) == (
        9,
        [{"role": "user", "content": "hi"}],
        False,
    )


async def test_stream_asks_for_usage_and_yields_it_as_an_event(reach: ReachClient, openai_peer: str) -> None:
    """A stream asks for include_usage; the usage chunk (choices: []) arrives as a data event before end."""
    events = await streamed(reach, {"query": "hi there"})
    assert received(openai_peer)["stream_options"] == {"include_usage": True}
    text = "".join(e.data["reply_content"] for e in events if e.kind == "data")
    usage = [e.data["usage"] for e in events if e.kind == "data" and "usage" in e.data]
    assert (text, events[-1].kind) == ("you said: hi there ", "end")
    assert [(u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) for u in usage] == [(7, 5, 12)]


async def test_streamed_tool_call_fragments_are_assembled(reach: ReachClient) -> None:
    """Fragments '{"order_id": "', '12', '"}' become one call whose order_id is the string "12"."""
    events = await streamed(reach, {"query": "tool"})
    calls = [call for e in events if e.kind == "data" for call in e.data["tool_calls"]]
    assert calls == [{"id": "call_1", "name": "lookup_order", "arguments": {"order_id": "12"}, "index": 0}]
    assert "tool_call_fragments" not in str([e.data for e in events])


async def test_raw_fragments_only_on_request(openai_peer: str) -> None:
    """tool_call_fragments: true adds the raw fragments, as the server sent them, beside the assembled call."""
    client = await client_for(openai_peer, tool_call_fragments=True)
    try:
        events = await streamed(client, {"query": "tool"})
    finally:
        await client.aclose()
    raw = [fragment for e in events if e.kind == "data" for fragment in e.data.get("tool_call_fragments", [])]
    fragments = [fragment["function"]["arguments"] for fragment in raw]
    assert fragments == ["", '{"order_id": "', "12", '"}']


async def test_streamed_refusal_ends_with_a_refusal_error(reach: ReachClient) -> None:
    """Refusal deltas are joined; the stream ends with a 'refusal' error carrying the whole text."""
    events = await streamed(reach, {"query": "refuse"})
    assert events[-1].kind == "error"
    assert events[-1].error is not None
    assert (events[-1].error.type, events[-1].error.message) == (
        "refusal",
        "the model refused: I can't help with that.",
    )


async def test_blocking_tool_call_and_usage_are_normalised(reach: ReachClient) -> None:
    """A blocking tool call keeps its parsed arguments; usage stays in raw_meta."""
    response = await reach.reach("chat", {"query": "tool"})
    assert response.data["tool_calls"] == [{"id": "call_1", "name": "lookup_order", "arguments": {"order_id": "12"}}]
    assert response.data["raw_meta"]["usage"]["total_tokens"] == 12
