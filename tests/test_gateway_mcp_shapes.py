"""The pure shapes behind ``/mcp``: tool results, the stateless envelope, signed request state, param headers."""

from __future__ import annotations

from reach_plugins.gateway.mcp_calls import McpSession
from reach_plugins.gateway.mcp_catalog import Catalog, read_result
from reach_plugins.gateway.mcp_stateless import (
    STATELESS,
    Refusal,
    RequestStates,
    envelope,
    input_required,
    param_headers,
)
from reach_plugins.protocols.mcp_tools import tool_of, tool_result

META = {"io.modelcontextprotocol/protocolVersion": STATELESS, "io.modelcontextprotocol/clientCapabilities": {}}
HEADERS = {"mcp-protocol-version": STATELESS, "mcp-method": "tools/list"}


def test_a_reply_becomes_text_content_or_keeps_its_items() -> None:
    """Strings stay as written, mappings are JSON text unless they carry MCP items; structured only when promised."""
    assert tool_result('say "hi"', output_schema=False)["content"] == [{"type": "text", "text": 'say "hi"'}]
    assert tool_result({"a": 1}, output_schema=False) == {
        "content": [{"type": "text", "text": '{"a": 1}'}],
        "isError": False,
    }
    assert tool_result({"a": 1}, output_schema=True)["structuredContent"] == {"a": 1}
    image = {"type": "image", "data": "AA==", "mimeType": "image/png"}
    assert tool_result({"content": [image]}, output_schema=False)["content"] == [image]
    relayed = {"reply_content": "", "tool_calls": [], "raw_meta": {"mcp_session_id": "s-1"}}
    assert tool_result(relayed, output_schema=False)["content"] == [{"type": "text", "text": ""}]
    odd = {"content": [{"type": "video"}]}
    assert tool_result(odd, output_schema=False)["content"][0]["type"] == "text"


def test_only_an_object_return_schema_is_an_output_schema() -> None:
    """MCP's outputSchema must be an object schema: a string return_schema lists no outputSchema."""
    base = {"name": "x", "params_schema": None}
    assert "outputSchema" not in tool_of({**base, "return_schema": {"type": "string"}})
    assert tool_of({**base, "return_schema": {"type": "object"}})["outputSchema"] == {"type": "object"}


def test_the_envelope_is_checked_in_the_specs_order() -> None:
    """Missing _meta / keys -32602; header mismatch -32020 before an unsupported version -32022; removed 404."""
    assert isinstance(missing := envelope("tools/list", {}, HEADERS), Refusal) and missing.code == -32602
    other = {**META, "io.modelcontextprotocol/protocolVersion": "v9"}
    mismatch = envelope("tools/list", {"_meta": other}, HEADERS)
    assert isinstance(mismatch, Refusal) and mismatch.code == -32020
    unsupported = envelope("tools/list", {"_meta": other}, {**HEADERS, "mcp-protocol-version": "v9"})
    assert isinstance(unsupported, Refusal) and unsupported.code == -32022
    assert unsupported.data == {"supported": [STATELESS], "requested": "v9"}
    removed = envelope("ping", {"_meta": META}, {**HEADERS, "mcp-method": "ping"})
    assert isinstance(removed, Refusal) and (removed.code, removed.status) == (-32601, 404)
    served = envelope("tools/list", {"_meta": {**META, "io.modelcontextprotocol/logLevel": "info"}}, HEADERS)
    assert served == McpSession(capabilities=frozenset(), level="info")


def test_a_request_state_opens_only_as_signed() -> None:
    """The gateway's signature round-trips; an edited payload, another key's token or plain text do not open."""
    states = RequestStates()
    token = states.sign('{"round": 1}')
    assert states.open(token) == '{"round": 1}'
    _, body, mac = token.split(".")
    edited = body[:-2] + ("B" if body[-2] == "A" else "A") + body[-1]
    assert states.open(f"v1.{edited}.{mac}") is None
    assert RequestStates().open(token) is None
    assert states.open('{"round": 1}') is None


def test_questions_are_cut_to_the_declared_capabilities() -> None:
    """Only answerable questions go back; none answerable is -32021 naming what is missing."""
    asked = {"s": {"method": "sampling/createMessage"}, "e": {"method": "elicitation/create"}}
    shaped = input_required(asked, McpSession(capabilities=frozenset({"elicitation"})), None)
    assert shaped == {"resultType": "input_required", "inputRequests": {"e": asked["e"]}}
    refused = input_required(asked, McpSession(), None)
    assert isinstance(refused, Refusal) and refused.data == {
        "requiredCapabilities": {"elicitation": {}, "sampling": {}}
    }


def test_param_headers_decode_base64_and_must_match() -> None:
    """=?base64?..?= is decoded strictly; a literal is literal; missing, malformed or different is -32020."""
    schema = {"properties": {"region": {"type": "string", "x-mcp-header": "Region"}}}
    args = {"region": "Hello"}
    assert param_headers(schema, args, {"mcp-param-region": "=?base64?SGVsbG8=?="}) is None
    assert param_headers(schema, {"region": "=?base64?SGVsbG8="}, {"mcp-param-region": "=?base64?SGVsbG8="}) is None
    for header in ({}, {"mcp-param-region": "=?base64?SGVsbG8?="}, {"mcp-param-region": "Bye"}):
        refused = param_headers(schema, args, header)
        assert isinstance(refused, Refusal) and refused.code == -32020


def test_templates_match_whole_segments() -> None:
    """test://template/{id}/data matches one segment per variable, never across a slash."""
    capability = {"name": "t", "scope_tags": ["mcp:resource-template=test://template/{id}/data"]}
    catalog = Catalog.of([{"name": "a", "description": "", "capabilities": [capability]}])
    assert catalog.resolve("test://template/7/data") == (capability, {"id": "7"})
    assert catalog.resolve("test://template/7/8/data") is None
    assert read_result("u://x", "hi") == {"contents": [{"uri": "u://x", "mimeType": "text/plain", "text": "hi"}]}
