"""The mcp adapter against a real MCP server built with the official ``mcp`` SDK (tests/peers/mcp_server.py).

Its tools are discovered with ``tools/list`` into a registry, then reached by
capability; the server keeps state per MCP session, so a conversation that
lost its session would be seen.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from peer_servers import peer
from servers import free_port

from reach_plugins import ReachClient
from reach_plugins.model import AgentDescriptor
from reach_plugins.protocols.mcp_tools import capability_name, register_mcp_agent
from reach_plugins.registry.memory import MemoryRegistry
from transports.direct import DirectTransport


@pytest.fixture(scope="module")
def mcp_peer() -> Iterator[str]:
    with peer("mcp_server.py", "/sessions") as url:
        yield url


@pytest.fixture
async def registered(mcp_peer: str) -> AsyncIterator[tuple[ReachClient, AgentDescriptor]]:
    registry, transport = MemoryRegistry(), DirectTransport()
    agent = AgentDescriptor(name="tools", protocol="mcp", endpoints=[f"{mcp_peer}/mcp"])
    described = await register_mcp_agent(registry, agent, transport)
    client = ReachClient(registry=registry, transport=transport)
    yield client, described
    await client.aclose()


def sessions(url: str) -> int:
    count: int = httpx.get(f"{url}/sessions").json()["sessions"]
    return count


async def test_tools_become_capabilities_with_their_schemas(registered: tuple[ReachClient, AgentDescriptor]) -> None:
    """tools/list fills the registry: names, descriptions and input schemas kept; hints decide retryable."""
    _, agent = registered
    by_name = {capability.name: capability for capability in agent.capabilities}
    assert sorted(by_name) == ["add_numbers", "fail_tool", "remember_item"]
    assert by_name["add_numbers"].description == "Add two whole numbers."
    assert by_name["add_numbers"].params_schema is not None
    assert by_name["add_numbers"].params_schema["required"] == ["a", "b"]
    assert not by_name["fail_tool"].retryable


async def test_a_tool_is_reached_by_capability(registered: tuple[ReachClient, AgentDescriptor]) -> None:
    """A call goes out as tools/call; structured content and text come back normalised."""
    client, _ = registered
    response = await client.reach("add_numbers", {"a": 2, "b": 3}, session_id=f"s-{uuid.uuid4().hex[:6]}")
    assert response.status == "success", response.error
    assert response.data["structured_content"] == {"total": 5}
    assert '"total": 5' in response.data["reply_content"]


async def test_one_mcp_session_per_conversation(registered: tuple[ReachClient, AgentDescriptor], mcp_peer: str) -> None:
    """Calls of one conversation share an MCP session (the server's per-session state grows); another has its own."""
    client, _ = registered
    one, two = f"s-{uuid.uuid4().hex[:6]}", f"s-{uuid.uuid4().hex[:6]}"
    before = sessions(mcp_peer)
    first = await client.reach("remember_item", {"item": "tea"}, session_id=one)
    second = await client.reach("remember_item", {"item": "cups"}, session_id=one)
    other = await client.reach("remember_item", {"item": "kettle"}, session_id=two)
    assert [r.data["reply_content"] for r in (first, second, other)] == ["tea", "tea, cups", "kettle"]
    assert first.data["raw_meta"]["mcp_session_id"] == second.data["raw_meta"]["mcp_session_id"]
    assert first.data["raw_meta"]["mcp_session_id"] != other.data["raw_meta"]["mcp_session_id"]
    assert sessions(mcp_peer) - before == 2


async def test_a_tool_error_is_a_business_failure(registered: tuple[ReachClient, AgentDescriptor]) -> None:
    """isError: true is a business failure with the tool's text, not retried."""
    client, _ = registered
    response = await client.reach("fail_tool", {"reason": "nope"})
    assert response.status == "fail"
    assert response.error is not None
    assert (response.error.type, response.error.message) == ("business", "Error executing tool fail_tool")


def test_tool_names_become_capability_names() -> None:
    """camelCase and odd characters become a lowercase capability name; nothing usable gives None."""
    assert [capability_name(name) for name in ("getWeather", "add-numbers", "a b", "___")] == [
        "get_weather",
        "add-numbers",
        "a_b",
        None,
    ]


async def test_a_restarted_server_gets_a_new_session_and_the_call_succeeds() -> None:
    """The server restarted and forgot the session (404): the tool did not run, so the call is retried on a new one."""
    port, conversation, registry = free_port(), f"s-{uuid.uuid4().hex[:6]}", MemoryRegistry()
    with peer("mcp_server.py", "/sessions", port=port) as url:
        agent = AgentDescriptor(name="tools", protocol="mcp", endpoints=[f"{url}/mcp"])
        async with DirectTransport() as transport, ReachClient(registry=registry, transport=transport) as client:
            await register_mcp_agent(registry, agent, transport)
            before = await client.reach("remember_item", {"item": "tea"}, session_id=conversation)
    with peer("mcp_server.py", "/sessions", port=port):
        # a new client: no pooled connection to the old process (what a stale one does is the transport's business)
        async with ReachClient(registry=registry, transport=DirectTransport()) as client:
            after = await client.reach("remember_item", {"item": "cups"}, session_id=conversation)
    assert (before.status, after.status) == ("success", "success"), after.error
    assert after.data["reply_content"] == "cups"
    assert after.data["raw_meta"]["mcp_session_id"] != before.data["raw_meta"]["mcp_session_id"]


async def test_concurrent_first_calls_of_a_conversation_share_one_initialised_session(
    registered: tuple[ReachClient, AgentDescriptor], mcp_peer: str
) -> None:
    """Ten calls racing to open one conversation's session all succeed, and only one session is kept for it."""
    client, _ = registered
    conversation = f"s-{uuid.uuid4().hex[:6]}"
    answers = await asyncio.gather(
        *(client.reach("remember_item", {"item": f"i{n}"}, session_id=conversation) for n in range(10))
    )
    assert [a.status for a in answers] == ["success"] * 10, [a.error for a in answers]
    final = await client.reach("remember_item", {"item": "last"}, session_id=conversation)
    assert len(final.data["reply_content"].split(", ")) == 11
    assert {a.data["raw_meta"]["mcp_session_id"] for a in [*answers, final]} == {
        final.data["raw_meta"]["mcp_session_id"]
    }
