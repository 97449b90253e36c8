"""What ``/mcp`` serves besides plain tools, pinned one behaviour at a time over real HTTP (uvicorn, real agents).

The agent is the conformance agent of ``tests/conformance/mcp_agents.py``
(everything-server features written as reach capabilities) plus one with a
``return_schema``; the gateway runs open in this process.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.gateway import create_app
from reach_plugins.gateway.mcp_stateless import STATELESS

sys.path.insert(0, str(Path(__file__).parent / "conformance"))
import mcp_agents

STREAM = {"Accept": "application/json, text/event-stream"}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "celsius": {"type": "number"}}}

typed = ReachAgent("typed", tokens="open")


@typed.capability("get_weather", return_schema=WEATHER, params_schema={"type": "object"})
def get_weather() -> dict[str, Any]:
    """The weather, as the return_schema says."""
    return {"city": "Lyon", "celsius": 21.5}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with BackgroundServer(mcp_agents.agent.app) as everything, BackgroundServer(typed.app) as weather:
        agents = [
            mcp_agents.agent.descriptor(everything.url).model_dump(mode="json", exclude_defaults=True),
            typed.descriptor(weather.url).model_dump(mode="json", exclude_defaults=True),
        ]
        config = tmp_path_factory.mktemp("mcp-features") / "agents.yaml"
        config.write_text(yaml.safe_dump({"agents": agents}))
        with BackgroundServer(create_app(config, allow_open=True), proxy_headers=False) as gateway:
            yield f"{gateway.url}/mcp"


def rpc(method: str, params: dict[str, Any] | None = None, rpc_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params or {}}


def session(url: str, capabilities: dict[str, Any] | None = None) -> dict[str, str]:
    """A new session's headers (the client declaring ``capabilities``)."""
    params = {"protocolVersion": "2025-11-25", "capabilities": capabilities or {}, "clientInfo": {"name": "t"}}
    answer = httpx.post(url, json=rpc("initialize", params), timeout=10)
    assert answer.status_code == 200, answer.text
    return {"Mcp-Session-Id": answer.headers["mcp-session-id"]}


def call(url: str, headers: dict[str, str], method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    answer = httpx.post(url, json=rpc(method, params), headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    message: dict[str, Any] = answer.json()
    return message


async def events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON messages of an SSE response (the priming event has no data and is skipped)."""
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line[6:].strip():
            yield json.loads(line[6:])


def test_a_host_or_origin_that_does_not_name_the_loopback_server_is_refused(url: str) -> None:
    """DNS rebinding: Host or Origin naming another address than this loopback server's gets 403, its own 200."""
    port = url.split(":")[2].split("/")[0]
    init = rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
    assert httpx.post(url, json=init, headers={"Host": f"127.0.0.2:{port}"}).status_code == 403
    assert httpx.post(url, json=init, headers={"Origin": f"http://127.0.0.2:{port}"}).status_code == 403
    assert httpx.post(url, json=init, headers={"Origin": f"http://localhost:{port}"}).status_code == 200


def test_a_string_reply_is_plain_text_and_media_pass_through(url: str) -> None:
    """A string is one text item, not JSON-quoted; an agent's image/audio/resource items arrive as they are."""
    headers = session(url)
    text = call(url, headers, "tools/call", {"name": "test_simple_text", "arguments": {}})["result"]
    assert text["content"] == [{"type": "text", "text": "This is a simple text response for testing."}]
    assert "structuredContent" not in text
    mixed = call(url, headers, "tools/call", {"name": "test_multiple_content_types", "arguments": {}})["result"]
    assert [item["type"] for item in mixed["content"]] == ["text", "image", "resource"]
    assert mixed["content"][1]["data"] == mcp_agents.IMAGE


def test_a_return_schema_is_the_output_schema_and_the_result_matches_it(url: str) -> None:
    """get_weather lists outputSchema = return_schema; its call carries structuredContent = the data."""
    headers = session(url)
    tools = {tool["name"]: tool for tool in call(url, headers, "tools/list")["result"]["tools"]}
    assert tools["get_weather"]["outputSchema"] == WEATHER
    assert "outputSchema" not in tools["test_simple_text"]
    result = call(url, headers, "tools/call", {"name": "get_weather", "arguments": {}})["result"]
    assert result["structuredContent"] == {"city": "Lyon", "celsius": 21.5}


def test_tagged_capabilities_are_resources_templates_and_prompts(url: str) -> None:
    """mcp:resource / mcp:resource-template / mcp:prompt capabilities are read and got; agents are card resources."""
    headers = session(url)
    listed = [r["uri"] for r in call(url, headers, "resources/list")["result"]["resources"]]
    assert "test://static-text" in listed and "reach://agents/everything" in listed
    assert "static_text" not in [t["name"] for t in call(url, headers, "tools/list")["result"]["tools"]]
    binary = call(url, headers, "resources/read", {"uri": "test://static-binary"})["result"]["contents"][0]
    assert binary == {"uri": "test://static-binary", "blob": mcp_agents.IMAGE, "mimeType": "image/png"}
    templated = call(url, headers, "resources/read", {"uri": "test://template/42/data"})["result"]["contents"][0]
    assert json.loads(templated["text"])["id"] == "42"
    card = call(url, headers, "resources/read", {"uri": "reach://agents/typed"})["result"]["contents"][0]
    assert [c["name"] for c in json.loads(card["text"])["capabilities"]] == ["get_weather"]
    missing = call(url, headers, "resources/read", {"uri": "test://nothing"})["error"]
    assert missing["code"] == -32002 and missing["data"] == {"uri": "test://nothing"}
    prompt = call(url, headers, "prompts/get", {"name": "test_prompt_with_arguments", "arguments": {"arg1": "a"}})
    assert prompt["error"]["code"] == -32602 and "arg2" in prompt["error"]["message"]
    got = call(
        url, headers, "prompts/get", {"name": "test_prompt_with_arguments", "arguments": {"arg1": "a", "arg2": "b"}}
    )
    assert got["result"]["messages"][0]["content"]["text"] == "Prompt with arguments: arg1='a', arg2='b'"


async def test_progress_and_logs_stream_before_the_result_and_obey_the_log_level(url: str) -> None:
    """A streaming agent's progress arrives with the client's token, before the result; setLevel drops info logs."""
    headers = session(url)
    params = {"name": "test_tool_with_progress", "arguments": {}, "_meta": {"progressToken": "p-1"}}
    async with (
        httpx.AsyncClient(headers={**STREAM, **headers}, timeout=10) as http,
        http.stream("POST", url, json=rpc("tools/call", params)) as answer,
    ):
        assert answer.headers["content-type"].startswith("text/event-stream")
        said = [message async for message in events(answer)]
    assert [m["params"]["progress"] for m in said[:-1]] == [0, 50, 100]
    assert {m["params"]["progressToken"] for m in said[:-1]} == {"p-1"}
    assert said[-1]["result"]["content"][0]["text"] == "progress reported"
    assert call(url, headers, "logging/setLevel", {"level": "error"})["result"] == {}
    async with (
        httpx.AsyncClient(headers={**STREAM, **headers}, timeout=10) as http,
        http.stream("POST", url, json=rpc("tools/call", {"name": "test_tool_with_logging"})) as answer,
    ):
        quiet = [message async for message in events(answer)]
    assert [m.get("method") for m in quiet] == [None]


async def test_an_agents_question_is_asked_of_the_client_and_the_answer_reaches_the_agent(url: str) -> None:
    """inputRequests from the agent become elicitation/create on the stream; the POSTed answer completes the call."""
    headers = session(url, {"elicitation": {}})
    async with httpx.AsyncClient(headers={**STREAM, **headers}, timeout=10) as http:
        params = {"name": "test_elicitation", "arguments": {"message": "yes?"}}
        async with http.stream("POST", url, json=rpc("tools/call", params)) as answer:
            stream = events(answer)
            question = await anext(stream)
            assert question["method"] == "elicitation/create" and question["params"]["message"] == "yes?"
            reply = {
                "jsonrpc": "2.0",
                "id": question["id"],
                "result": {"action": "accept", "content": {"response": "y"}},
            }
            assert (await http.post(url, json=reply)).status_code == 202
            result = await asyncio.wait_for(anext(stream), 10)
    assert result["result"]["content"][0]["text"] == 'User response: action=accept, content={"response":"y"}'


async def test_a_stream_handed_over_to_polling_is_resumed_with_last_event_id(url: str) -> None:
    """test_reconnection closes the POST stream mid-call (reach/poll); GET + Last-Event-ID gives the rest."""
    headers = session(url)
    async with httpx.AsyncClient(headers={**STREAM, **headers}, timeout=10) as http:
        async with http.stream("POST", url, json=rpc("tools/call", {"name": "test_reconnection"})) as answer:
            ids = [line[4:] async for line in answer.aiter_lines() if line.startswith("id: ")]
        async with http.stream("GET", url, headers={"Last-Event-ID": ids[-1]}) as resumed:
            assert resumed.status_code == 200
            rest = [message async for message in events(resumed)]
        assert (await http.get(url, headers={"Last-Event-ID": "unknown-1"})).status_code == 405
    assert len(ids) == 3  # priming, "Before disconnect", the poll
    assert rest[0]["params"]["data"] == "After reconnect"
    assert rest[-1]["result"]["content"][0]["text"] == "Reconnection test completed"


async def test_deleting_the_session_stops_its_running_call(url: str) -> None:
    """DELETE /mcp while a call waits for the client's answer: the call is cancelled, its stream cannot be resumed."""
    headers = session(url, {"elicitation": {}})
    async with httpx.AsyncClient(headers={**STREAM, **headers}, timeout=10) as http:
        params = {"name": "test_elicitation", "arguments": {"message": "wait"}}
        async with http.stream("POST", url, json=rpc("tools/call", params)) as answer:
            lines = answer.aiter_lines()
            ids: list[str] = []
            async for line in lines:
                ids += [line[4:]] if line.startswith("id: ") else []
                if line.startswith("data: ") and "elicitation/create" in line:
                    break
            assert (await http.delete(url)).status_code == 200
            rest = await asyncio.wait_for(_data_lines(lines), 5)
        assert rest == []
        assert (await http.get(url, headers={"Last-Event-ID": ids[-1]})).status_code == 404


async def _data_lines(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines if line.startswith("data: ")]


async def test_a_multi_round_agent_gets_its_request_state_back_each_round(url: str) -> None:
    """Session wire: the gateway asks round after round, handing the agent its requestState and the answers."""
    headers = session(url, {"elicitation": {}})
    answers = iter([{"name": "Alice"}, {"color": "blue"}])
    async with httpx.AsyncClient(headers={**STREAM, **headers}, timeout=10) as http:
        params = {"name": "test_input_required_result_multi_round", "arguments": {}}
        async with http.stream("POST", url, json=rpc("tools/call", params)) as answer:
            async for message in events(answer):
                if message.get("method") == "elicitation/create":
                    reply = {"action": "accept", "content": next(answers)}
                    await http.post(url, json={"jsonrpc": "2.0", "id": message["id"], "result": reply})
                elif "result" in message:
                    final = message["result"]
    assert final["content"][0]["text"] == "Alice likes blue."


def test_a_question_the_client_cannot_answer_ends_the_call_as_a_tool_error(url: str) -> None:
    """A client that declared no sampling capability is not asked; the call says which capability was missing."""
    headers = session(url)
    result = call(url, headers, "tools/call", {"name": "test_sampling", "arguments": {"prompt": "hi"}})["result"]
    assert result["isError"] is True and "'sampling'" in result["content"][0]["text"]


def stateless(method: str, params: dict[str, Any], capabilities: dict[str, Any] | None = None) -> tuple[dict, dict]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": STATELESS,
        "io.modelcontextprotocol/clientCapabilities": capabilities or {},
    }
    headers = {"MCP-Protocol-Version": STATELESS, "Mcp-Method": method}
    if "name" in params:
        headers["Mcp-Name"] = params["name"]
    return rpc(method, {**params, "_meta": meta}), headers


def test_the_stateless_wire_needs_no_initialize_and_signs_the_request_state(url: str) -> None:
    """2026-07-28: a call with its envelope is served; an agent's requestState comes back signed, a forged one is
    refused (-32602) before the agent sees it; an undeclared capability is -32021 with HTTP 400."""
    body, headers = stateless("tools/call", {"name": "test_simple_text", "arguments": {}})
    done = httpx.post(url, json=body, headers=headers).json()["result"]
    assert done["resultType"] == "complete" and done["content"][0]["text"].startswith("This is a simple")
    params = {"name": "test_input_required_result_request_state", "arguments": {}}
    body, headers = stateless("tools/call", params, {"elicitation": {}})
    asked = httpx.post(url, json=body, headers=headers).json()["result"]
    assert asked["resultType"] == "input_required" and asked["requestState"] != "request-state-nonce"
    back = {**params, "inputResponses": {"confirm": {"action": "accept", "content": {"ok": True}}}}
    body, headers = stateless("tools/call", {**back, "requestState": asked["requestState"]}, {"elicitation": {}})
    assert httpx.post(url, json=body, headers=headers).json()["result"]["content"][0]["text"].startswith("state-ok")
    body, headers = stateless("tools/call", {**back, "requestState": "request-state-nonce"}, {"elicitation": {}})
    forged = httpx.post(url, json=body, headers=headers)
    assert forged.status_code == 400 and forged.json()["error"]["code"] == -32602
    body, headers = stateless("tools/call", {"name": "test_missing_capability", "arguments": {}})
    missing = httpx.post(url, json=body, headers=headers)
    assert missing.status_code == 400 and missing.json()["error"]["data"] == {"requiredCapabilities": {"sampling": {}}}
