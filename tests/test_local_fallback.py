"""Instant local fallback: under remote_first a call that reached no agent runs the local tool in the same call."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from llama_index.core.tools import FunctionTool
from servers import free_port

import reach_plugins.dify as dify
from reach_plugins import AgentDescriptor, Capability, ReachEnhancer
from reach_plugins.errors import NoHealthyAgent, RemoteError
from reach_plugins.frameworks.toolcalls import ToolCall
from reach_plugins.langchain import create_agent
from reach_plugins.llamaindex import enhance_tools
from reach_plugins.model import Instance
from reach_plugins.registry import MemoryRegistry
from reach_plugins.transport import MockTransport, Reply
from transports.direct import DirectTransport

QUERY_ORDER = Capability(name="query_order", description="Look up where an order is")


def dead_registry() -> MemoryRegistry:
    """One orders instance registered healthy at a port nobody listens on (connections are refused)."""
    registry = MemoryRegistry()
    asyncio.run(registry.register_agent(AgentDescriptor(name="orders", capabilities=[QUERY_ORDER])))
    dead = Instance(agent="orders", instance_id="orders-dead", endpoint=f"http://127.0.0.1:{free_port()}")
    asyncio.run(registry.register_instance(dead))
    return registry


@pytest.fixture
def enhancer(request: pytest.FixtureRequest) -> Iterator[ReachEnhancer]:
    options: dict[str, Any] = getattr(request, "param", {})
    with ReachEnhancer(registry=dead_registry(), transport=DirectTransport(), matcher=False, **options) as e:
        yield e


@pytest.mark.parametrize("enhancer", [{}, {"on_error": "raise"}], indirect=True)
def test_every_call_to_an_unreachable_agent_falls_back_at_once(enhancer: ReachEnhancer) -> None:
    """The first calls (before any breaker opens) already fall back; the record says nothing was delivered."""
    for _ in range(4):
        result = enhancer.reach(ToolCall("query_order", {"order_id": "A1"}))
        assert result.error is not None and "connect" in result.error.message
        assert result.fallback is not None and result.fallback.startswith("local tool ran: ")
        assert result.route is not None and not result.route.delivered


def test_no_fallback_without_a_local_tool_or_outside_remote_first() -> None:
    """A proxy call (no local tool) and remote_only report the failure instead of falling back."""
    with ReachEnhancer(registry=dead_registry(), transport=DirectTransport(), matcher=False) as e:
        proxy = e.reach(ToolCall("query_order", {"order_id": "A1"}, has_local=False))
    with ReachEnhancer(registry=dead_registry(), transport=DirectTransport(), matcher=False, policy="remote_only") as e:
        only = e.reach(ToolCall("query_order", {"order_id": "A1"}))
    for result in (proxy, only):
        assert not result.ok and result.fallback is None


def test_a_delivered_failure_does_not_fall_back() -> None:
    """An agent that saw the request and failed (HTTP 500) is not run again locally: it may have executed."""
    registry = dead_registry()
    failing = MockTransport(lambda call: Reply(status="fail", status_code=500))
    with ReachEnhancer(registry=registry, transport=failing, matcher=False) as e:
        result = e.reach(ToolCall("query_order", {"order_id": "A1"}))
    assert isinstance(result.error, RemoteError) and result.fallback is None
    assert result.route is not None and result.route.delivered


def test_no_healthy_agent_at_reach_time_falls_back(enhancer: ReachEnhancer) -> None:
    """A decision made while an agent looked healthy still falls back when none can take the call."""
    decision = enhancer.decide(ToolCall("query_order"))
    asyncio.run(enhancer.client.registry.deregister_instance("orders", "orders-dead"))
    result = enhancer.reach(ToolCall("query_order", {"order_id": "A1"}), decision)
    assert isinstance(result.error, NoHealthyAgent)
    assert result.route is not None and result.route.request_id is None and result.fallback is not None


class ScriptedModel(GenericFakeChatModel):
    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(**kwargs)


@tool
def query_order(order_id: str) -> str:
    """Look up where an order is (the local implementation)."""
    return f"local answer for {order_id}"


@pytest.mark.parametrize("enhancer", [{}, {"on_error": "raise"}], indirect=True)
async def test_langgraph_tool_call_falls_back_in_the_same_call(enhancer: ReachEnhancer) -> None:
    """invoke and ainvoke: the ToolMessage is the local answer; its artifact records the fallback."""
    for run in ("invoke", "ainvoke"):
        turns = [AIMessage("", tool_calls=[{"name": "query_order", "args": {"order_id": "A1"}, "id": "c1"}]), "ok"]
        agent = create_agent(ScriptedModel(messages=iter(turns)), [query_order], enhanced_by=enhancer)
        request = {"messages": [("user", "where is A1?")]}
        state = agent.invoke(request) if run == "invoke" else await agent.ainvoke(request)
        [message] = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        assert message.status == "success" and message.content == "local answer for A1"
        route = message.artifact["reach"]
        assert route["delivered"] is False and "local tool ran" in route["fallback"]


async def test_llamaindex_tool_falls_back_in_the_same_call(enhancer: ReachEnhancer) -> None:
    """ReachTool call and acall run the inner tool when the reach was not delivered."""

    def lookup(order_id: str) -> str:
        """Look up an order."""
        return f"local answer for {order_id}"

    [wrapped] = enhance_tools([FunctionTool.from_defaults(lookup, name="query_order")], enhancer)
    for output in (wrapped.call(order_id="A1"), await wrapped.acall(order_id="A1")):
        assert not output.is_error and output.content == "local answer for A1"


def test_dify_hook_lets_the_tool_run(enhancer: ReachEnhancer) -> None:
    """before_invoke returns None (run the Dify tool) when the reach was not delivered."""
    result = dify.before_invoke(
        "query_order", {"order_id": "A1"}, conversation_id="c", app_id="a", user_id="u", enhancer=enhancer
    )
    assert result is None


def test_mock_delivered_call_is_untouched() -> None:
    """A healthy agent answers as before: delivered, no fallback."""
    registry = dead_registry()
    with ReachEnhancer(registry=registry, transport=MockTransport(lambda call: {"ok": True}), matcher=False) as e:
        result = e.reach(ToolCall("query_order", {"order_id": "A1"}))
    assert result.ok and result.route is not None and result.route.delivered and result.fallback is None
