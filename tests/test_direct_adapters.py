"""Every protocol adapter end to end: DirectTransport against real servers speaking each protocol."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import InvalidResponse
from reach_plugins.model import AgentDescriptor, Capability, ReachRequest
from reach_plugins.protocols import encode_sse
from reach_plugins.transport import Call, Credential, StreamEvent
from transports.direct import DirectTransport

# ----------------------------------------------------------------------------- fake agents


def _completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "fake-gpt",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


async def _chunks(words: list[str]) -> AsyncIterator[bytes]:
    for word in words:
        chunk = {"id": "c1", "model": "fake-gpt", "choices": [{"index": 0, "delta": {"content": word}}]}
        yield encode_sse(json.dumps(chunk))
    yield encode_sse(json.dumps({"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    yield encode_sse("[DONE]")


async def chat_completions(request: Request) -> Response:
    """An OpenAI-compatible chat endpoint that echoes the user and knows two special prompts."""
    body = json.loads(await request.body())
    said = body["messages"][-1]["content"]
    if request.headers.get("authorization") != "Bearer sk-test":
        return JSONResponse({"error": {"message": "bad key", "type": "invalid_request_error"}}, 401)
    if body.get("stream"):
        return StreamingResponse(_chunks(said.split()), media_type="text/event-stream")
    if said == "use a tool":
        call = {"id": "t1", "type": "function", "function": {"name": "query_order", "arguments": '{"order_id": "A1"}'}}
        return JSONResponse(_completion({"role": "assistant", "content": None, "tool_calls": [call]}))
    if said == "upgrade":
        return JSONResponse(_completion({"role": "assistant", "text": "renamed field"}))
    return JSONResponse(_completion({"role": "assistant", "content": f"{body['model']} heard: {said}"}))


async def private_chat(request: Request) -> Response:
    """The seeds' private agent: the answer wrapped in business fields."""
    body = json.loads(await request.body())
    if body["question"] == "unknown order":
        return JSONResponse({"code": 1001, "msg": "order not found"})
    message = {"role": "assistant", "content": f"shipped ({body['uid']})"}
    return JSONResponse({"code": 0, "data": {"message": message, "order_info": {"id": 123, "status": "shipped"}}})


card_reads: list[int] = []


async def agent_card(request: Request) -> Response:
    card_reads.append(1)
    card = {"name": "kb", "url": "/a2a", "version": "1.0", "capabilities": {"streaming": True}, "skills": []}
    return JSONResponse(card)


def _task(state: str, text: str) -> dict[str, Any]:
    artifact = {"artifactId": "a1", "parts": [{"kind": "text", "text": text}, {"kind": "data", "data": {"hits": 2}}]}
    return {"kind": "task", "id": "task-1", "contextId": "ctx-1", "status": {"state": state}, "artifacts": [artifact]}


async def _a2a_events(rpc_id: str, text: str) -> AsyncIterator[bytes]:
    def frame(result: dict[str, Any]) -> bytes:
        return encode_sse(json.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": result}))

    yield frame({"kind": "task", "id": "task-1", "contextId": "ctx-1", "status": {"state": "submitted"}})
    for word in text.split():
        parts = [{"kind": "text", "text": word}]
        yield frame({"kind": "artifact-update", "taskId": "task-1", "artifact": {"artifactId": "a1", "parts": parts}})
    yield frame({"kind": "status-update", "taskId": "task-1", "status": {"state": "completed"}, "final": True})


async def a2a_rpc(request: Request) -> Response:
    """An A2A 0.3 JSON-RPC endpoint."""
    body = json.loads(await request.body())
    text = next(part["text"] for part in body["params"]["message"]["parts"] if part["kind"] == "text")
    if body["method"] == "message/stream":
        return StreamingResponse(_a2a_events(body["id"], text), media_type="text/event-stream")
    if body["method"] != "message/send":
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "error": {"code": -32601, "message": "no method"}})
    state = "failed" if text == "fail" else "completed"
    return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": _task(state, f"answer to {text}")})


kb = ReachAgent("kb", tokens="open")  # reached by the bare transport, which adds no token


@kb.capability("search_kb")
def search_kb(query: str) -> dict[str, str]:
    """An upgraded agent that renamed ``content`` to ``text``."""
    return {"text": f"found {query}"}


def fake_app() -> Starlette:
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/api/chat", private_chat, methods=["POST"]),
        Route("/.well-known/agent-card.json", agent_card, methods=["GET"]),
        Route("/a2a", a2a_rpc, methods=["POST"]),
    ]
    return Starlette(routes=routes)


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer(fake_app()) as server:
        yield server


@pytest.fixture(scope="module")
def reach_server() -> Iterator[BackgroundServer]:
    with BackgroundServer(kb.app) as server:
        yield server


@pytest.fixture(params=["aiohttp", "httpx"])
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[DirectTransport]:
    async with DirectTransport(engine=request.param) as transport:
        yield transport


def call_to(descriptor: AgentDescriptor, capability: str, payload: dict[str, Any], **options: Any) -> Call:
    return Call(
        request=ReachRequest(capability=capability, payload=payload, session_id="s-42"),
        agent=descriptor,
        instance=descriptor.static_instances()[0],
        timeout=3.0,
        **options,
    )


async def collect(transport: DirectTransport, call: Call) -> list[StreamEvent]:
    return [event async for event in transport.stream(call)]


# ----------------------------------------------------------------------------- openai-compatible


def openai_agent(url: str, capability: Capability | None = None) -> AgentDescriptor:
    return AgentDescriptor(
        name="assistant",
        protocol="openai-compatible",
        endpoints=[f"{url}/v1"],
        capabilities=[capability or Capability(name="chat")],
        protocol_options={"model": "fake-gpt-4"},
    )


OPENAI_KEY = Credential(type="bearer", value="sk-test")


async def test_openai_reply_is_normalised(transport: DirectTransport, server: BackgroundServer) -> None:
    """A chat completion becomes reply_content, tool_calls and raw_meta; the model comes from the options."""
    reply = await transport.send(call_to(openai_agent(server.url), "chat", {"input": "hi"}, credential=OPENAI_KEY))
    assert reply.data["reply_content"] == "fake-gpt-4 heard: hi"
    assert reply.data["tool_calls"] == []
    assert reply.data["raw_meta"]["usage"]["total_tokens"] == 5
    assert reply.data["raw_meta"]["finish_reason"] == "stop"


async def test_openai_tool_calls_are_parsed(transport: DirectTransport, server: BackgroundServer) -> None:
    """Tool calls come back with their name and JSON arguments decoded."""
    call = call_to(openai_agent(server.url), "chat", {"messages": [{"role": "user", "content": "use a tool"}]})
    reply = await transport.send(dataclasses.replace(call, credential=OPENAI_KEY))
    assert reply.data["tool_calls"] == [{"id": "t1", "name": "query_order", "arguments": {"order_id": "A1"}}]


async def test_openai_renamed_field_is_invalid(
    transport: DirectTransport, server: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A reply whose message lost 'content' is an InvalidResponse, logged, never data."""
    with caplog.at_level(logging.WARNING, "reach_plugins.protocols"), pytest.raises(InvalidResponse, match="content"):
        await transport.send(call_to(openai_agent(server.url), "chat", {"input": "upgrade"}, credential=OPENAI_KEY))
    assert "invalid response" in caplog.text


async def test_openai_auth_failure_is_business(transport: DirectTransport, server: BackgroundServer) -> None:
    """A 401 from the model server is a business failure carrying its message."""
    reply = await transport.send(call_to(openai_agent(server.url), "chat", {"input": "hi"}))
    assert reply.status == "fail"
    assert reply.error is not None
    assert (reply.status_code, reply.error.type, reply.error.message) == (401, "business", "bad key")


async def test_openai_stream_is_normalised(transport: DirectTransport, server: BackgroundServer) -> None:
    """Chat-completion chunks become reply_content deltas, ending at [DONE]."""
    call = call_to(openai_agent(server.url), "chat", {"input": "one two three"}, credential=OPENAI_KEY)
    events = await collect(transport, call)
    assert "".join(event.data["reply_content"] for event in events if event.kind == "data") == "onetwothree"
    assert events[-1].kind == "end"


# ----------------------------------------------------------------------------- raw-http


def raw_agent(url: str, **options: Any) -> AgentDescriptor:
    settings = {
        "path": "/api/chat",
        "request_template": {"question": "${payload.query}", "uid": "${request.session_id}"},
        "response_mapping": {"reply_content": "data.message.content"},
        "success_path": "code",
        "error_path": "msg",
        **options,
    }
    return AgentDescriptor(
        name="private", protocol="raw-http", endpoints=[url], capabilities=["ask"], protocol_options=settings
    )


async def test_raw_http_reply_is_mapped(transport: DirectTransport, server: BackgroundServer) -> None:
    """The wrapped answer lands in reply_content; the rest (order_info) stays in raw_meta."""
    reply = await transport.send(call_to(raw_agent(server.url), "ask", {"query": "where is A1"}))
    assert reply.data["reply_content"] == "shipped (s-42)"
    assert reply.data["raw_meta"]["data"]["order_info"] == {"id": 123, "status": "shipped"}
    assert "content" not in reply.data["raw_meta"]["data"]["message"]


async def test_raw_http_error_code_is_business(transport: DirectTransport, server: BackgroundServer) -> None:
    """A non-zero business code is a business failure with the body's message."""
    reply = await transport.send(call_to(raw_agent(server.url), "ask", {"query": "unknown order"}))
    assert reply.status == "fail"
    assert reply.error is not None
    assert (reply.error.type, reply.error.message) == ("business", "order not found")


async def test_raw_http_wrong_mapping_is_invalid(transport: DirectTransport, server: BackgroundServer) -> None:
    """A mapping path the reply does not have is an InvalidResponse naming the path."""
    agent = raw_agent(server.url, response_mapping={"reply_content": "data.message.text"})
    with pytest.raises(InvalidResponse, match=r"data\.message\.text"):
        await transport.send(call_to(agent, "ask", {"query": "where is A1"}))


async def test_raw_http_stream_is_one_reply(transport: DirectTransport, server: BackgroundServer) -> None:
    """raw-http has no native stream: streaming yields the one mapped reply, then end."""
    events = await collect(transport, call_to(raw_agent(server.url), "ask", {"query": "where is A1"}))
    assert [event.kind for event in events] == ["data", "end"]
    assert events[0].data["reply_content"] == "shipped (s-42)"


# ----------------------------------------------------------------------------- a2a


def a2a_agent(url: str) -> AgentDescriptor:
    return AgentDescriptor(name="kb", protocol="a2a", endpoints=[url], capabilities=["search_kb"])


async def test_a2a_task_is_normalised_and_card_read_once(transport: DirectTransport, server: BackgroundServer) -> None:
    """A completed task's text parts become reply_content; the agent card is read once per endpoint."""
    before = len(card_reads)
    agent = a2a_agent(server.url)
    first = await transport.send(call_to(agent, "search_kb", {"query": "refunds"}))
    second = await transport.send(call_to(agent, "search_kb", {"query": "returns"}))
    assert (first.data["reply_content"], second.data["reply_content"]) == ("answer to refunds", "answer to returns")
    assert first.data["raw_meta"] == {
        "kind": "task",
        "task_id": "task-1",
        "context_id": "ctx-1",
        "state": "completed",
        "data": [{"hits": 2}],
    }
    assert len(card_reads) - before == 1


async def test_a2a_failed_task_is_business(transport: DirectTransport, server: BackgroundServer) -> None:
    """A failed task is a business failure carrying the task's text."""
    reply = await transport.send(call_to(a2a_agent(server.url), "search_kb", {"query": "fail"}))
    assert reply.status == "fail"
    assert reply.error is not None
    assert (reply.error.type, reply.error.message) == ("business", "answer to fail")


async def test_a2a_stream_yields_artifacts_then_end(transport: DirectTransport, server: BackgroundServer) -> None:
    """message/stream artifact updates become data events; the final status ends the stream."""
    events = await collect(transport, call_to(a2a_agent(server.url), "search_kb", {"query": "alpha beta"}))
    assert [event.data["reply_content"] for event in events if event.kind == "data"] == ["alpha", "beta"]
    assert events[-1].kind == "end"


# ----------------------------------------------------------------------------- reach + return_schema


async def test_reply_breaking_return_schema_is_invalid(
    transport: DirectTransport, reach_server: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The seeds' upgrade story: 'content' renamed to 'text' breaks return_schema and is refused."""
    schema = {"type": "object", "required": ["content"], "properties": {"content": {"type": "string"}}}
    agent = kb.descriptor(reach_server.url).model_copy(
        update={"capabilities": [Capability(name="search_kb", return_schema=schema)]}
    )
    with caplog.at_level(logging.WARNING, "reach_plugins.protocols"), pytest.raises(InvalidResponse, match="content"):
        await transport.send(call_to(agent, "search_kb", {"query": "refunds"}))
    assert "return_schema" in caplog.text
