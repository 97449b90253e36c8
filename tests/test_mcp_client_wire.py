"""The mcp adapter against a scripted MCP server with real-world wire quirks (tests/peers/mcp_wire_server.py)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from peer_servers import peer

from reach_plugins import ReachClient
from reach_plugins.model import AgentDescriptor
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
