"""End to end: two tenants naming one session id are two conversations, in the client and in a served graph."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

from reach_plugins import AgentDescriptor, ReachClient
from reach_plugins.agent import ReachAgent, add_langgraph
from reach_plugins.errors import SessionClosed
from reach_plugins.registry import MemoryRegistry
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.sessions import MemorySessions, session_key
from reach_plugins.transport import Call, MockTransport

ORDERS: dict[str, Any] = {
    "name": "orders",
    "endpoints": [f"http://127.0.0.1:{18300 + i}" for i in range(4)],
    "capabilities": ["query_order"],
}


def where(call: Call) -> dict[str, Any]:
    return {"instance": call.instance.instance_id}


async def test_two_tenants_with_one_session_id_never_share_a_pin_or_liveness() -> None:
    """acme's conversation s is pinned and closed apart from globex's s: globex keeps its instance and stays open."""
    registry = MemoryRegistry()
    await registry.register_agent(AgentDescriptor.model_validate(ORDERS))
    sessions = MemorySessions(budget=DEFAULT_BUDGET)
    client = ReachClient(registry, MockTransport(where), sessions=sessions)

    async def served(tenant: str) -> str:
        response = await client.reach("query_order", {}, session_id="s", tenant=tenant)
        instance: str = response.data["instance"]
        return instance

    globex = await served("globex")
    instances = sorted(registry.instances("orders"))
    elsewhere = next(instance for instance in instances if instance != globex)
    await sessions.claim_pin(session_key("acme", "s"), "orders", elsewhere)
    assert await served("acme") == elsewhere
    assert await served("globex") == globex
    pins = client.router.sessions
    acme_pins, globex_pins = pins.get(session_key("acme", "s")), pins.get(session_key("globex", "s"))
    assert acme_pins is not None and acme_pins.instances == {"orders": elsewhere}
    assert globex_pins is not None and globex_pins.instances == {"orders": globex}

    await sessions.close(session_key("acme", "s"))
    with pytest.raises(SessionClosed):
        await served("acme")
    assert await served("globex") == globex
    await client.aclose()


def reply(state: MessagesState) -> dict[str, Any]:
    """Say which turn of its thread this is."""
    return {"messages": [AIMessage(content=f"turn {len(state['messages']) // 2 + 1}")]}


async def test_a_served_graph_thread_is_its_tenants_own() -> None:
    """Tenant globex naming acme's session id starts a thread of its own instead of continuing acme's."""
    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    agent = ReachAgent("assistant", tokens="open")
    add_langgraph(agent, builder.compile(checkpointer=InMemorySaver()))

    async def chat(http: httpx.AsyncClient, tenant: str) -> str:
        body = {"request_id": "r", "capability": "chat", "payload": {"input": "hi"}, "session_id": "s1"}
        answer = (await http.post("/reach", json=body, headers={"X-Tenant": tenant})).json()
        content: str = answer["data"]["reply_content"]
        return content

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://127.0.0.1") as http:
        assert [await chat(http, "acme"), await chat(http, "acme")] == ["turn 1", "turn 2"]
        assert await chat(http, "globex") == "turn 1"
        assert await chat(http, "acme") == "turn 3"
