"""Protocol adapters as pure functions: requests built from calls, replies normalised, SSE framing."""

from __future__ import annotations

import dataclasses
import email.utils
import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reach_plugins.errors import ConfigError, ConnectError, InvalidPayload, InvalidResponse
from reach_plugins.model import AgentDescriptor, Capability, Hop, ReachRequest
from reach_plugins.protocols import (
    A2AAdapter,
    HttpResponse,
    McpAdapter,
    OpenAIAdapter,
    RawHttpAdapter,
    ReachAdapter,
    SseDecoder,
    SseEvent,
    adapter_for,
    encode_sse,
    parse_retry_after,
    reach_headers,
)
from reach_plugins.protocols.a2a_wire import Binding
from reach_plugins.protocols.paths import lookup, render, without
from reach_plugins.transport import Call


def call(protocol: str = "reach", payload: dict[str, Any] | None = None, **options: Any) -> Call:
    """A call to an agent at http://127.0.0.1:9000 speaking ``protocol``."""
    agent = AgentDescriptor(
        name="agent",
        protocol=protocol,
        endpoints=["http://127.0.0.1:9000"],
        capabilities=[options.pop("capability", Capability(name="ask"))],
        protocol_options=options.pop("protocol_options", {}),
    )
    request = ReachRequest(capability="ask", payload=payload or {}, **options)
    return Call(request=request, agent=agent, instance=agent.static_instances()[0], timeout=2.0)


def response(body: Any, status: int = 200, **headers: str) -> HttpResponse:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return HttpResponse(status, headers, raw)


def sent(request_body: bytes | None) -> Any:
    assert request_body is not None
    return json.loads(request_body)


# ----------------------------------------------------------------------------- SSE

FRAMES = st.lists(
    st.tuples(st.sampled_from(["data", "end", "message"]), st.text(alphabet="ab é\n中", max_size=12)),
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(frames=FRAMES, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8), crlf=st.booleans())
def test_sse_decoding_ignores_how_bytes_are_chunked(frames: list[tuple[str, str]], cuts: list[int], crlf: bool) -> None:
    """However the byte stream is split (inside CRLF pairs or UTF-8 characters), the same events come out."""
    wire = b"".join(encode_sse(data, event) for event, data in frames)
    if crlf:
        wire = wire.replace(b"\n", b"\r\n")
    points = sorted({cut % (len(wire) + 1) for cut in cuts} | {0, len(wire)})
    decoder = SseDecoder()
    events = [event for start, end in itertools.pairwise(points) for event in decoder.feed(wire[start:end])]
    assert [(event.event, event.data) for event in events] == frames


def test_sse_comments_and_ids_are_handled() -> None:
    """Comment lines are skipped; id and multi-line data are kept; the default event name is message."""
    events = SseDecoder().feed(b": keep-alive\nid: 7\ndata: a\ndata: b\n\n")
    assert events == [SseEvent(event="message", data="a\nb", id="7")]


# ----------------------------------------------------------------------------- shared helpers


def test_retry_after_reads_seconds_and_dates() -> None:
    """Retry-After is delta-seconds or an HTTP date; anything else is ignored."""
    now = 1_700_000_000.0
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == 30.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_reach_headers_complete_what_the_core_left_out() -> None:
    """Headers the core prepared win (any case); missing ones are derived from the request."""
    base = call(idempotency_key="k", tenant="acme", hops=[Hop(agent="a", capability="b")])
    prepared = dataclasses.replace(base, headers={"x-tenant": "given"})
    headers = reach_headers(prepared)
    assert headers["x-tenant"] == "given"
    assert "X-Tenant" not in headers
    assert (headers["Idempotency-Key"], headers["X-Reach-Hops"], headers["X-Reach-Deadline"]) == ("k", "a/b", "2000")


def test_unknown_protocol_is_a_config_error() -> None:
    """Only the four protocols exist; the error lists them."""
    with pytest.raises(ConfigError, match="a2a, mcp, openai-compatible, raw-http, reach"):
        adapter_for("grpc")


def test_invalid_return_schema_is_a_config_error() -> None:
    """A return_schema that is not JSON Schema is a configuration error, not a bad reply."""
    bad = call(capability=Capability(name="ask", return_schema={"type": 12}))
    with pytest.raises(ConfigError, match="return_schema"):
        ReachAdapter().parse(bad, response({"status": "success", "data": {}}))


# ----------------------------------------------------------------------------- paths and templates


def test_paths_look_up_remove_and_render() -> None:
    """JSON paths read nested values and list items; templates keep a lone placeholder's type."""
    body = {"data": {"items": [{"id": 1}, {"id": 2}], "message": {"content": "hi", "role": "assistant"}}}
    assert lookup(body, "$.data.items[1].id") == 2
    assert lookup(body, "data.nope", None) is None
    assert without(body, ["data.message.content", "data.items"]) == {"data": {"message": {"role": "assistant"}}}
    context = {"payload": {"n": 3, "q": "x"}}
    assert render({"n": "${payload.n}", "text": "q=${payload.q}", "k": [1]}, context) == {
        "n": 3,
        "text": "q=x",
        "k": [1],
    }


# ----------------------------------------------------------------------------- reach


def test_reach_fail_without_error_is_transient() -> None:
    """A fail reply that names no error is treated as transient."""
    reply = ReachAdapter().parse(call(), response({"status": "fail"}))
    assert reply.error is not None
    assert reply.error.type == "transient"


def test_reach_reply_of_the_wrong_shape_is_invalid() -> None:
    """JSON that is not a reach reply is an InvalidResponse."""
    with pytest.raises(InvalidResponse, match="status"):
        ReachAdapter().parse(call(), response([1, 2]))


def test_reach_overload_keeps_the_bodys_error_type() -> None:
    """A 503 whose body says backpressure stays backpressure, with the Retry-After delay attached."""
    body = {"status": "fail", "error": {"type": "backpressure", "message": "queue full"}}
    reply = ReachAdapter().parse(call(), response(body, 503, **{"Retry-After": "4"}))
    assert reply.error is not None
    assert (reply.error.type, reply.error.retry_after, reply.retry_after) == ("backpressure", 4.0, 4.0)


# ----------------------------------------------------------------------------- openai-compatible


@pytest.mark.parametrize(
    ("payload", "messages"),
    [
        ({"input": "hi"}, [{"role": "user", "content": "hi"}]),
        ({"messages": [{"role": "system", "content": "s"}]}, [{"role": "system", "content": "s"}]),
        ({"order_id": "A1"}, [{"role": "user", "content": '{"order_id": "A1"}'}]),
    ],
)
def test_openai_messages_come_from_the_payload(payload: dict[str, Any], messages: list[Any]) -> None:
    """Messages are the payload's messages, else its text field, else the payload as JSON text."""
    assert sent(OpenAIAdapter().build(call("openai-compatible", payload)).body)["messages"] == messages


def test_openai_request_options() -> None:
    """Model and path come from protocol_options; tools pass through; streaming asks for SSE."""
    options = {"model": "qwen", "path": "/api/v3/chat"}
    request = OpenAIAdapter().build(
        call("openai-compatible", {"input": "x", "tools": [{"type": "function"}]}, protocol_options=options),
        stream=True,
    )
    assert request.url == "http://127.0.0.1:9000/api/v3/chat"
    assert request.headers["Accept"] == "text/event-stream"
    assert {key: sent(request.body)[key] for key in ("model", "stream", "tools")} == {
        "model": "qwen",
        "stream": True,
        "tools": [{"type": "function"}],
    }


def test_openai_content_parts_are_joined() -> None:
    """A content given as a list of text parts is joined into reply_content."""
    body = {"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}]}
    assert OpenAIAdapter().parse(call("openai-compatible"), response(body)).data["reply_content"] == "ab"


def test_openai_stream_chunks_are_normalised() -> None:
    """Role-only deltas are skipped; content deltas become data; [DONE] ends the stream."""
    decoder = OpenAIAdapter().decoder(call("openai-compatible"))
    frames = [{"choices": [{"delta": {"role": "assistant"}}]}, {"choices": [{"delta": {"content": "Hi"}}]}]
    events = [event for frame in frames for event in decoder.feed(SseEvent("message", json.dumps(frame)))]
    events += decoder.feed(SseEvent("message", "[DONE]"))
    assert [(event.kind, event.data and event.data["reply_content"]) for event in events] == [
        ("data", "Hi"),
        ("end", None),
    ]


@pytest.mark.parametrize(("finished", "kind"), [(True, "end"), (False, "error")])
def test_openai_stream_closed_without_done(finished: bool, kind: str) -> None:
    """A stream closed without [DONE] is complete only if a finish_reason was seen."""
    decoder = OpenAIAdapter().decoder(call("openai-compatible"))
    decoder.feed(
        SseEvent("message", json.dumps({"choices": [{"delta": {}, "finish_reason": "stop" if finished else None}]}))
    )
    assert [event.kind for event in decoder.close()] == [kind]


def test_openai_error_chunk_is_an_error_event() -> None:
    """An error object in the stream becomes an error event."""
    decoder = OpenAIAdapter().decoder(call("openai-compatible"))
    (event,) = decoder.feed(SseEvent("message", json.dumps({"error": {"message": "overloaded"}})))
    assert (event.kind, event.error.message if event.error else None) == ("error", "overloaded")


# ----------------------------------------------------------------------------- raw-http


def test_raw_http_get_sends_the_template_as_query() -> None:
    """With method GET the rendered template becomes query parameters."""
    options = {"method": "GET", "path": "/q", "request_template": {"id": "${payload.order_id}"}}
    request = RawHttpAdapter().build(call("raw-http", {"order_id": "A1"}, protocol_options=options))
    assert (request.method, request.url, request.params, request.body) == (
        "GET",
        "http://127.0.0.1:9000/q",
        {"id": "A1"},
        None,
    )


def test_raw_http_template_needs_its_fields() -> None:
    """A template placeholder the request lacks is an InvalidPayload naming it."""
    options = {"request_template": {"id": "${payload.order_id}"}}
    with pytest.raises(InvalidPayload, match=r"payload\.order_id"):
        RawHttpAdapter().build(call("raw-http", {}, protocol_options=options))


def test_raw_http_without_mapping_returns_the_body() -> None:
    """Without a response_mapping the body is the reply data as is."""
    assert RawHttpAdapter().parse(call("raw-http"), response({"any": ["thing"]})).data == {"any": ["thing"]}


def test_raw_http_mapping_must_name_reply_content() -> None:
    """A response_mapping without reply_content (or with unknown keys) is a ConfigError."""
    options = {"response_mapping": {"answer": "data"}}
    with pytest.raises(ConfigError, match="reply_content"):
        RawHttpAdapter().parse(call("raw-http", protocol_options=options), response({"data": 1}))


# ----------------------------------------------------------------------------- a2a


def test_a2a_request_is_a_jsonrpc_message() -> None:
    """0.3: the user's text is a text part, the rest of the payload a data part; the session is the contextId."""
    binding = Binding("http://x/a2a", "0.3", "0.3.0")
    request = A2AAdapter().build(call("a2a", {"query": "refunds", "lang": "en"}, session_id="s-1"), discovered=binding)
    body = sent(request.body)
    assert (request.url, body["method"], body["params"]["message"]["contextId"]) == (
        "http://x/a2a",
        "message/send",
        "s-1",
    )
    assert body["params"]["message"]["parts"] == [
        {"kind": "text", "text": "refunds"},
        {"kind": "data", "data": {"lang": "en"}},
    ]


def test_a2a_1x_request_speaks_the_current_spec() -> None:
    """1.x: SendMessage, ROLE_USER, kind-less parts and the A2A-Version header the 1.x server requires."""
    binding = Binding("http://x/a2a", "1.0", "1.0")
    request = A2AAdapter().build(call("a2a", {"query": "refunds", "lang": "en"}), discovered=binding, stream=True)
    body = sent(request.body)
    assert (body["method"], body["params"]["message"]["role"], request.headers["A2A-Version"]) == (
        "SendStreamingMessage",
        "ROLE_USER",
        "1.0",
    )
    assert body["params"]["message"]["parts"] == [{"text": "refunds"}, {"data": {"lang": "en"}}]


def test_a2a_card_picks_the_1x_interface_then_0_3() -> None:
    """A 1.x card's JSON-RPC 1.x interface wins; a 0.3 card's relative url is resolved; no interface is invalid."""
    adapter, a2a_call = A2AAdapter(), call("a2a")
    both = {
        "supportedInterfaces": [
            {"url": "http://a/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
            {"url": "/old", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            {"url": "/new", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
        ]
    }
    assert adapter.discovered(a2a_call, response(both)) == Binding("http://127.0.0.1:9000/new", "1.0", "1.0")
    assert adapter.discovered(a2a_call, response({"url": "/rpc"})) == Binding("http://127.0.0.1:9000/rpc", "0.3", "0.3")
    old = call("a2a", protocol_options={"version": "0.3"})
    assert adapter.discovered(old, response(both)).url == "http://127.0.0.1:9000/old"
    with pytest.raises(InvalidResponse, match=r"offers no JSON-RPC .* or HTTP\+JSON"):
        adapter.discovered(a2a_call, response({"name": "kb"}))


def test_a2a_http_json_is_used_only_without_json_rpc() -> None:
    """A card offering HTTP+JSON and JSON-RPC is spoken in JSON-RPC; HTTP+JSON alone gives the REST binding."""
    adapter, a2a_call = A2AAdapter(), call("a2a")
    rest = {"url": "/rest/v1", "protocolBinding": "HTTP+JSON", "protocolVersion": "1.0"}
    rpc = {"url": "/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
    assert (
        adapter.discovered(a2a_call, response({"supportedInterfaces": [rest, rpc]})).url == "http://127.0.0.1:9000/rpc"
    )
    binding = adapter.discovered(a2a_call, response({"supportedInterfaces": [rest]}))
    assert binding == Binding("http://127.0.0.1:9000/rest/v1", "1.0", "1.0", "HTTP+JSON")
    request = adapter.build(call("a2a", {"query": "refunds"}), discovered=binding)
    body = sent(request.body)
    assert (request.method, request.url, request.headers["A2A-Version"]) == (
        "POST",
        "http://127.0.0.1:9000/rest/v1/message:send",
        "1.0",
    )
    assert body["configuration"] == {"returnImmediately": True} and "jsonrpc" not in body


@pytest.mark.parametrize(
    ("binding", "poll", "stop"),
    [
        (
            Binding("http://127.0.0.1:9000/rpc", "1.0", "1.0"),
            ("POST", "/rpc", "GetTask"),
            ("POST", "/rpc", "CancelTask"),
        ),
        (
            Binding("http://127.0.0.1:9000/rest/v1", "1.0", "1.0", "HTTP+JSON"),
            ("GET", "/rest/v1/tasks/t%2F1", None),
            ("POST", "/rest/v1/tasks/t%2F1:cancel", None),
        ),
    ],
)
def test_a2a_a_working_task_is_pending_until_it_is_final(
    binding: Binding, poll: tuple[str, str, str | None], stop: tuple[str, str, str | None]
) -> None:
    """A task answered at once and still working is pending (GetTask polls it, CancelTask stops it); a final one not."""
    adapter, a2a_call = A2AAdapter(), call("a2a", {"query": "slow"})
    request = adapter.build(a2a_call, discovered=binding)
    rest = binding.transport == "HTTP+JSON"

    def answer(state: str) -> HttpResponse:
        task = {"task": {"id": "t/1", "contextId": "c", "status": {"state": state}}}
        return response(task if rest else {"jsonrpc": "2.0", "id": "x", "result": task})

    pending = adapter.pending(a2a_call, request, answer("TASK_STATE_WORKING"))
    assert pending is not None
    for made, (method, path, rpc) in ((pending.poll, poll), (pending.stop, stop)):
        assert (made.method, made.url) == (method, "http://127.0.0.1:9000" + path)
        assert (sent(made.body)["method"] if rpc else None) == rpc
        assert rpc is None or sent(made.body)["params"] == {"id": "t/1"}
    assert adapter.pending(a2a_call, request, answer("TASK_STATE_COMPLETED")) is None
    assert adapter.pending(a2a_call, request, answer("TASK_STATE_INPUT_REQUIRED")) is None
    bare = {"id": "t/1", "status": {"state": "TASK_STATE_WORKING"}}
    assert adapter.pending(a2a_call, pending.poll, response(bare if rest else {"jsonrpc": "2.0", "result": bare}))


def test_a2a_message_result_is_normalised() -> None:
    """A Message result's text parts become reply_content, in both dialects."""
    result = {"kind": "message", "messageId": "m1", "parts": [{"kind": "text", "text": "hello"}]}
    reply = A2AAdapter().parse(call("a2a"), response({"jsonrpc": "2.0", "id": "1", "result": result}))
    assert (reply.data["reply_content"], reply.data["raw_meta"]["message_id"]) == ("hello", "m1")
    wrapped = {"message": {"messageId": "m2", "role": "ROLE_AGENT", "parts": [{"text": "hi"}, {"data": {"n": 1}}]}}
    reply = A2AAdapter().parse(call("a2a"), response({"jsonrpc": "2.0", "id": "1", "result": wrapped}))
    assert (reply.data["reply_content"], reply.data["raw_meta"]["data"]) == ("hi", [{"n": 1}])


@pytest.mark.parametrize(
    ("code", "key", "kind"),
    [(-32603, None, "business"), (-32603, "k-1", "transient"), (-32602, "k-1", "business"), (-32001, None, "business")],
)
def test_a2a_rpc_errors_are_classified(code: int, key: str | None, kind: str) -> None:
    """An executor error is retried only with an idempotency key (A2A has none of its own); others are business."""
    body = {"jsonrpc": "2.0", "id": "1", "error": {"code": code, "message": "m"}}
    reply = A2AAdapter().parse(call("a2a", idempotency_key=key), response(body))
    assert reply.error is not None
    assert reply.error.type == kind


def test_a2a_executor_error_on_a_non_retryable_capability_is_not_retried_even_with_a_key() -> None:
    """A key alone does not make an executor error retryable when the capability says it is not."""
    body = {"jsonrpc": "2.0", "id": "1", "error": {"code": -32603, "message": "boom"}}
    one = call("a2a", idempotency_key="k-1", capability=Capability(name="ask", retryable=False))
    reply = A2AAdapter().parse(one, response(body))
    assert reply.error is not None
    assert reply.error.type == "business"


def test_a2a_input_required_task_is_continued_by_the_same_session_only() -> None:
    """An input-required task's id goes on the session's next message, not on another session's, until it ends."""
    adapter, binding = A2AAdapter(), Binding("http://x/a2a", "1.0", "1.0")
    waiting = {"task": {"id": "t-1", "contextId": "s-1", "status": {"state": "TASK_STATE_INPUT_REQUIRED"}}}
    adapter.parse(call("a2a", session_id="s-1"), response({"jsonrpc": "2.0", "id": "1", "result": waiting}))

    def task_id(session: str) -> Any:
        body = sent(adapter.build(call("a2a", {"query": "A1"}, session_id=session), discovered=binding).body)
        return body["params"]["message"].get("taskId")

    assert (task_id("s-1"), task_id("s-2")) == ("t-1", None)
    done = {"task": {"id": "t-1", "contextId": "s-1", "status": {"state": "TASK_STATE_COMPLETED"}}}
    adapter.parse(call("a2a", session_id="s-1"), response({"jsonrpc": "2.0", "id": "1", "result": done}))
    assert task_id("s-1") is None


# ----------------------------------------------------------------------------- openai stream assembly


@settings(max_examples=60, deadline=None)
@given(
    arguments=st.dictionaries(st.text(max_size=6), st.one_of(st.integers(), st.text(max_size=6)), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=6),
)
def test_openai_tool_call_fragments_assemble_whatever_the_split(arguments: dict[str, Any], cuts: list[int]) -> None:
    """However the arguments string is cut into fragments, the stream yields one call with the whole JSON value."""
    text = json.dumps(arguments)
    points = sorted({min(cut, len(text)) for cut in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in itertools.pairwise(points)] or [""]
    decoder = OpenAIAdapter().decoder(call("openai-compatible"))
    chunks = [{"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]}]
    chunks += [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} for piece in pieces]
    events = [
        event
        for delta in chunks
        for event in decoder.feed(SseEvent("message", json.dumps({"choices": [{"index": 0, "delta": delta}]})))
    ]
    events += decoder.feed(
        SseEvent("message", json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}))
    )
    events += decoder.feed(SseEvent("message", "[DONE]"))
    calls = [tool for event in events if event.kind == "data" for tool in event.data["tool_calls"]]
    assert calls == [{"id": "c1", "name": "f", "arguments": arguments, "index": 0}]
    assert events[-1].kind == "end"


# ----------------------------------------------------------------------------- mcp


def mcp_ready(adapter: McpAdapter, mcp_call: Any, session_id: str | None = "sid-1") -> None:
    """Walk the adapter through its handshake: initialize answered (with a session id), then initialized (202)."""
    headers = {"Content-Type": "application/json", **({"Mcp-Session-Id": session_id} if session_id else {})}
    assert adapter.handshake(mcp_call) is not None
    init = {"jsonrpc": "2.0", "id": "i", "result": {"protocolVersion": "2025-06-18", "capabilities": {}}}
    adapter.handshaken(mcp_call, HttpResponse(200, headers, json.dumps(init).encode()))
    notification = adapter.handshake(mcp_call)
    assert notification is not None and sent(notification.body)["method"] == "notifications/initialized"
    adapter.handshaken(mcp_call, HttpResponse(202, {}, b""))
    assert adapter.handshake(mcp_call) is None


def test_mcp_call_carries_the_session_and_the_tool_arguments() -> None:
    """After the handshake, a call is tools/call with the payload as arguments, under the session's id and version."""
    adapter, mcp_call = McpAdapter(), call("mcp", {"a": 1}, session_id="conv-1")
    mcp_ready(adapter, mcp_call)
    request = adapter.build(mcp_call)
    assert sent(request.body)["params"] == {"name": "ask", "arguments": {"a": 1}}
    assert (request.headers["Mcp-Session-Id"], request.headers["MCP-Protocol-Version"]) == ("sid-1", "2025-06-18")
    other = call("mcp", {}, session_id="conv-2")
    assert adapter.handshake(other) is not None and "Mcp-Session-Id" not in adapter.handshake(other).headers


def test_mcp_sse_reply_tool_error_and_rpc_error() -> None:
    """A reply in one SSE event is read; isError is a business failure; a JSON-RPC error too."""
    adapter, mcp_call = McpAdapter(), call("mcp", {}, session_id="conv-1")
    mcp_ready(adapter, mcp_call)
    result = {"content": [{"type": "text", "text": "4"}], "structuredContent": {"n": 4}, "isError": False}
    body = f"event: message\ndata: {json.dumps({'jsonrpc': '2.0', 'id': 'x', 'result': result})}\n\n".encode()
    reply = adapter.parse(mcp_call, HttpResponse(200, {"Content-Type": "text/event-stream"}, body))
    assert (reply.data["reply_content"], reply.data["structured_content"]) == ("4", {"n": 4})
    failed = {"jsonrpc": "2.0", "id": "x", "result": {"content": [{"type": "text", "text": "no"}], "isError": True}}
    reply = adapter.parse(mcp_call, response(failed))
    assert reply.error is not None and (reply.error.type, reply.error.message) == ("business", "no")
    reply = adapter.parse(
        mcp_call, response({"jsonrpc": "2.0", "id": "x", "error": {"code": -32602, "message": "bad"}})
    )
    assert reply.error is not None and reply.error.type == "business"


def test_mcp_forgotten_session_is_not_executed_and_reopened() -> None:
    """404 on a known session: a ConnectError (the tool did not run) and the next attempt opens a new session."""
    adapter, mcp_call = McpAdapter(), call("mcp", {}, session_id="conv-1")
    mcp_ready(adapter, mcp_call)
    with pytest.raises(ConnectError, match="no longer knows session sid-1"):
        adapter.parse(mcp_call, response({"error": "gone"}, 404))
    again = adapter.handshake(mcp_call)
    assert again is not None and sent(again.body)["method"] == "initialize"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text() | st.integers(), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
@settings(max_examples=300, deadline=None)
def test_request_bodies_encode_as_the_stdlib_reads_them(value: Any) -> None:
    """encode_json (orjson, stdlib for what orjson refuses) writes what json.loads reads back as json.dumps would."""
    from reach_plugins.protocols.base import encode_json

    assert json.loads(encode_json(value)) == json.loads(json.dumps(value, ensure_ascii=False))


_ANY_FLOATS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=5), _ANY_FLOATS, max_size=4))
@settings(max_examples=300, deadline=None)
def test_a_payload_json_cannot_carry_is_refused_and_any_other_arrives_unchanged(payload: dict[str, Any]) -> None:
    """NaN/Infinity anywhere in a payload: InvalidPayload naming where; otherwise the body reads back as sent."""
    from reach_plugins.client.client import ReachClient
    from reach_plugins.protocols.base import encode_json
    from reach_plugins.registry import MemoryRegistry

    try:
        text = json.dumps(payload, allow_nan=False)  # the stdlib's own verdict: it refuses NaN and Infinity
    except ValueError:
        with pytest.raises(InvalidPayload, match="NaN or Infinity, which JSON cannot carry"):
            ReachClient(MemoryRegistry()).request("echo", payload)
    else:
        request = ReachClient(MemoryRegistry()).request("echo", payload)
        assert json.loads(encode_json(request.payload)) == json.loads(text)


def test_a_payload_nested_past_the_recursion_limit_is_invalid_payload() -> None:
    """A payload 5,000 lists deep is InvalidPayload saying to flatten it, not a RecursionError from the encoder."""
    from reach_plugins.client.client import ReachClient
    from reach_plugins.registry import MemoryRegistry

    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(InvalidPayload, match="nested too deeply"):
        ReachClient(MemoryRegistry()).request("echo", {"deep": deep})
