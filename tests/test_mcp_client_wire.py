"""The mcp adapter against a scripted MCP server with real-world wire quirks (tests/peers/mcp_wire_server.py)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from peer_servers import peer
from servers import wait_until

from reach_plugins import ReachClient
from reach_plugins.model import AgentDescriptor
from reach_plugins.protocols.mcp import McpAdapter
from reach_plugins.protocols.mcp_sessions import McpSessions
from reach_plugins.protocols.mcp_stream import answering_elicitation
from reach_plugins.protocols.mcp_tools import register_mcp_agent
from reach_plugins.registry.memory import MemoryRegistry
from transports.direct import DirectTransport

PYTHON = Path(sys.executable)


@pytest.fixture(scope="module")
def wire_server() -> Iterator[str]:
    with peer("mcp_wire_server.py", "/counts", python=PYTHON) as url:
        yield url


@pytest.fixture
async def client(wire_server: str) -> AsyncIterator[ReachClient]:
    registry, transport = MemoryRegistry(), DirectTransport()
    agent = AgentDescriptor(name="wire", protocol="mcp", endpoints=[f"{wire_server}/mcp"])
    await asyncio.wait_for(register_mcp_agent(registry, agent, transport), 10)
    async with ReachClient(registry=registry, transport=transport) as reach:
        yield reach


def counts(url: str) -> dict[str, int]:
    seen: dict[str, int] = httpx.get(f"{url}/counts").json()
    return seen


async def test_initialized_answered_200_with_json_is_sent_once(wire_server: str, client: ReachClient) -> None:
    """A server answering notifications/initialized with 200 + JSON: the handshake ends, the notification is not
    resent (it was, forever, when only 202 or an empty body counted)."""
    before = counts(wire_server).get("notifications/initialized", 0)
    reply = await asyncio.wait_for(client.reach("show", {}, session_id="hand-1"), 10)
    assert reply.status == "success", reply.error
    assert counts(wire_server)["notifications/initialized"] - before == 1


async def test_non_text_content_and_structured_content_are_kept(client: ReachClient) -> None:
    """An SSE reply opening with a priming event (id, retry, empty data) and a progress notification: the result
    is read, with its image, audio and resource items kept beside the text."""
    reply = await asyncio.wait_for(client.reach("show", {}, session_id="content-1"), 10)
    assert reply.status == "success", reply.error
    assert reply.data["reply_content"] == "a pixel"
    assert [item["type"] for item in reply.data["content"]] == ["text", "image", "audio", "resource"]
    assert reply.data["content"][1]["mimeType"] == "image/png"
    assert reply.data["content"][3]["resource"]["text"] == "hi"
    assert reply.data["structured_content"] == {"total": 3}


async def test_output_schema_is_kept_in_the_registry(wire_server: str) -> None:
    """tools/list's outputSchema becomes the capability's return_schema (over structured_content)."""
    agent = AgentDescriptor(name="wire", protocol="mcp", endpoints=[f"{wire_server}/mcp"])
    async with DirectTransport() as transport:
        described = await asyncio.wait_for(register_mcp_agent(MemoryRegistry(), agent, transport), 10)
    schema = described.capabilities[0].return_schema
    assert schema is not None
    assert schema["properties"]["structured_content"]["required"] == ["total"]
    assert schema["required"] == ["structured_content"]


async def test_progress_notifications_are_stream_events(client: ReachClient) -> None:
    """A streamed tool call asks for progress; the server's notifications/progress arrive as data events first."""
    events = [event async for event in client.stream("show", {}, session_id="progress-1")]
    assert [event.kind for event in events] == ["data", "data", "end"]
    assert events[0].data == {"progress": {"progress": 1, "total": 2, "message": "half"}}
    assert events[1].data["reply_content"] == "a pixel"


async def test_elicitation_is_answered_by_the_callers_hook(client: ReachClient) -> None:
    """The server's elicitation/create on the call's stream goes to the caller's hook; its answer goes back."""
    asked: list[str] = []

    def answer(params: Mapping[str, Any]) -> dict[str, Any]:
        asked.append(params["message"])
        return {"action": "accept", "content": {"name": "Ada"}}

    with answering_elicitation(answer):
        reply = await asyncio.wait_for(client.reach("ask", {}, session_id="ask-1"), 10)
    assert reply.status == "success", reply.error
    assert reply.data["reply_content"] == "hello Ada"
    assert asked == ["Your name?"]


async def test_elicitation_without_a_hook_fails_naming_it(wire_server: str, client: ReachClient) -> None:
    """Nobody to answer: the server is told no at once (no wait for the timeout) and the call fails saying how to
    answer."""
    reply = await asyncio.wait_for(client.reach("ask", {}, session_id="ask-2", timeout_ms=8000), 5)
    assert reply.status == "fail"
    assert reply.error is not None and reply.error.type == "business"
    assert "Your name?" in reply.error.message and "answering_elicitation" in reply.error.message
    wait_until(lambda: counts(wire_server).get("answer:error", 0) >= 1, 5, "the refusal reaching the server")


async def test_a_stream_closed_before_its_answer_is_resumed_with_last_event_id(
    wire_server: str, client: ReachClient
) -> None:
    """The server closes the call's stream after a priming event: the client reconnects with GET and Last-Event-ID,
    not sooner than the stream's retry time, and gets the answer there."""
    reply = await asyncio.wait_for(client.reach("resume", {}, session_id="resume-1"), 10)
    assert reply.status == "success", reply.error
    assert reply.data["reply_content"] == "resumed"
    resumes = [entry for entry in httpx.get(f"{wire_server}/counts").json()["resumes"] if entry["last_event_id"]]
    assert [entry["last_event_id"] for entry in resumes] == ["r-1"]  # other GETs: the elicitation tests' side stream
    assert resumes[0]["after"] >= 0.2


async def test_closing_a_conversation_and_the_transport_deletes_their_mcp_sessions(wire_server: str) -> None:
    """close_session DELETEs that conversation's MCP session at once; aclose DELETEs the rest (the listing's)."""
    registry, transport = MemoryRegistry(), DirectTransport()
    agent = AgentDescriptor(name="wire", protocol="mcp", endpoints=[f"{wire_server}/mcp"])
    before = counts(wire_server).get("DELETE", 0)
    async with ReachClient(registry=registry, transport=transport, sessions="memory://") as client:
        await asyncio.wait_for(register_mcp_agent(registry, agent, transport), 10)
        reply = await asyncio.wait_for(client.reach("show", {}, session_id="bye-1"), 10)
        assert reply.status == "success", reply.error
        await client.close_session("bye-1")
        assert counts(wire_server)["DELETE"] - before == 1
    assert counts(wire_server)["DELETE"] - before == 2


async def test_input_required_is_answered_and_resent_with_the_state_echoed(
    wire_server: str, client: ReachClient
) -> None:
    """An input_required result (SEP-2322): the hook answers, the call is resent once with the answers, the exact
    requestState and a new JSON-RPC id."""
    with answering_elicitation(lambda asked: {"action": "accept", "content": {"ok": True}}):
        reply = await asyncio.wait_for(client.reach("confirm", {}, session_id="mrtr-1"), 10)
    assert reply.status == "success", reply.error
    assert reply.data["reply_content"] == "confirmed True"
    first, resent = httpx.get(f"{wire_server}/counts").json()["rounds"][-2:]
    assert resent["state"] == '{"opaque": 1}'
    assert resent["answers"] == {"sure": {"action": "accept", "content": {"ok": True}}}
    assert resent["id"] != first["id"]


async def test_the_stateless_wire_discovers_retries_the_named_version_and_needs_no_session(wire_server: str) -> None:
    """protocol_options.version 2026-07-28: server/discover (refused once as unsupported, naming the version: asked
    again), then calls carrying the _meta envelope and no initialize."""
    registry, transport = MemoryRegistry(), DirectTransport()
    agent = AgentDescriptor(
        name="wire", protocol="mcp", endpoints=[f"{wire_server}/mcp"], protocol_options={"version": "2026-07-28"}
    )
    before = counts(wire_server)
    async with ReachClient(registry=registry, transport=transport) as reach:
        await asyncio.wait_for(register_mcp_agent(registry, agent, transport), 10)
        reply = await asyncio.wait_for(reach.reach("show", {}, session_id="stateless-1"), 10)
    assert reply.status == "success", reply.error
    after = counts(wire_server)
    assert after.get("initialize", 0) == before.get("initialize", 0)
    assert after["stateless:tools/call"] - before.get("stateless:tools/call", 0) == 1
    assert httpx.get(f"{wire_server}/counts").json()["discoveries"][0] == "2026-07-28"


async def test_a_session_pushed_out_of_the_table_is_deleted_at_the_next_handshake(wire_server: str) -> None:
    """With room for two sessions, a third conversation pushes the oldest out: its DELETE goes with the next
    handshake request to that server (it was dropped silently before)."""
    registry, transport = MemoryRegistry(), DirectTransport()
    agent = AgentDescriptor(name="wire", protocol="mcp", endpoints=[f"{wire_server}/mcp"])
    async with ReachClient(registry=registry, transport=transport) as reach:
        await asyncio.wait_for(register_mcp_agent(registry, agent, transport), 10)
        adapter = transport._adapter("mcp")
        assert isinstance(adapter, McpAdapter)
        adapter.sessions = McpSessions(2)
        before = counts(wire_server).get("DELETE", 0)
        for conversation in ("lru-1", "lru-2", "lru-3"):
            reply = await asyncio.wait_for(reach.reach("show", {}, session_id=conversation), 10)
            assert reply.status == "success", reply.error
        # lru-3's session pushed lru-1's out: the rest of lru-3's handshake DELETEd it, and only it
        assert counts(wire_server)["DELETE"] - before == 1
