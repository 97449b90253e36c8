"""Multi-agent chains over real agent-SDK HTTP servers: front desk -> order agent (LangGraph) -> inventory.

Every agent runs its own uvicorn server on 127.0.0.1 and reaches the next one
through DirectTransport, as separate processes would; they share one
in-memory registry (standing in for etcd) and one tracer provider (standing in
for a collector), so the hop chain and the trace can be checked end to end.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reach_plugins import Capability, ReachEnhancer
from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext
from reach_plugins.agent.langgraph import serve_graph
from reach_plugins.frameworks.toolcalls import ServeSpec
from reach_plugins.langchain import create_agent
from reach_plugins.registry import MemoryRegistry
from reach_plugins.stores.sessions import session_key
from transports.direct import DirectTransport


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that accepts tools (langchain_core's fakes refuse bind_tools)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(**kwargs)


def calls(name: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"{name}-1"}])


def model(*messages: AIMessage | str) -> ScriptedModel:
    return ScriptedModel(messages=iter(messages))


HANDLE_ORDER = Capability(name="handle_order", description="Answer any question about a customer's order")
APPLY_COUPON = Capability(name="apply_coupon", description="Apply a discount coupon to an order")


class World:
    """The shared registry and trace collector, and everything started on them (stopped at the end)."""

    def __init__(self) -> None:
        self.registry = MemoryRegistry()
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.enhancers: list[ReachEnhancer] = []
        self.servers: list[BackgroundServer] = []
        self.inventory_seen: list[ReachContext] = []

    def enhancer(self, **options: Any) -> ReachEnhancer:
        enhancer = ReachEnhancer(
            registry=self.registry,
            transport=DirectTransport(),
            tracer_provider=self.provider,
            expose=lambda capability: True,
            **options,
        )
        self.enhancers.append(enhancer)
        return enhancer

    def serve_inventory(self) -> None:
        """A plain function agent: how many units of a SKU are in stock."""
        agent = ReachAgent("inventory", tracer_provider=self.provider)

        @agent.capability("check_inventory", description="How many units of a product are in stock")
        def check_inventory(sku: str, ctx: ReachContext) -> dict[str, Any]:
            self.inventory_seen.append(ctx)
            return {"sku": sku, "in_stock": 3}

        server = BackgroundServer(agent.app)
        agent.register_on_startup(self.registry, server.url)
        self.servers.append(server.start())

    def close(self) -> None:
        for enhancer in self.enhancers:
            enhancer.close()
        for server in self.servers:
            server.stop()
        self.provider.shutdown()


@pytest.fixture
def world() -> Iterator[World]:
    world = World()
    yield world
    world.close()


def test_three_agents_carry_hops_session_and_one_trace(world: World) -> None:
    """front desk -> order agent -> inventory: the chain, the conversation and the trace cross both hops."""
    world.serve_inventory()
    orders = world.enhancer(auto_register=True, serve_as=ServeSpec("order-agent", [HANDLE_ORDER]))
    create_agent(
        model(calls("check_inventory", sku="S-1"), "Order A1 ships tomorrow; 3 in stock."), [], enhanced_by=orders
    )
    desk = create_agent(
        model(calls("handle_order", message="Where is order A1?"), "Your order ships tomorrow."),
        [],
        checkpointer=InMemorySaver(),
        enhanced_by=world.enhancer(),
    )

    state = desk.invoke({"messages": [("user", "where is my order A1?")]}, {"configurable": {"thread_id": "conv-1"}})

    reply = next(m for m in state["messages"] if isinstance(m, ToolMessage))
    assert reply.status == "success" and reply.content == "Order A1 ships tomorrow; 3 in stock."
    assert reply.artifact["reach"]["agent"] == "order-agent"
    assert state["messages"][-1].content == "Your order ships tomorrow."
    (seen,) = world.inventory_seen
    assert seen.hops == ("order-agent/handle_order", "inventory/check_inventory")
    assert seen.session_id == "conv-1"
    spans = world.exporter.get_finished_spans()
    names = {span.name for span in spans}
    assert {"execute_tool handle_order", "reach.agent handle_order", "execute_tool check_inventory"} <= names
    assert "reach.agent check_inventory" in names
    assert len({span.context.trace_id for span in spans}) == 1


def test_a_cycle_stops_on_the_first_repeat(world: World) -> None:
    """order -> coupon -> order again is refused with LoopDetected before the second order call is sent.

    The order agent is served by ``auto_register``, the coupon agent by the agent SDK's ``serve_graph``.
    """
    order_graph = create_agent(
        model(calls("apply_coupon", message="Apply SAVE10 to A1"), "Could not apply the coupon."),
        [],
        checkpointer=InMemorySaver(),
        enhanced_by=world.enhancer(auto_register=True, serve_as=ServeSpec("order-agent", [HANDLE_ORDER])),
    )
    coupons = world.enhancer(serve_as=ServeSpec("coupon-agent", [APPLY_COUPON]))
    coupon_graph = create_agent(
        model(calls("handle_order", message="Is A1 eligible?"), "Cannot check eligibility."),
        [],
        checkpointer=InMemorySaver(),
        enhanced_by=coupons,
    )
    served = serve_graph(coupon_graph, "coupon-agent", [APPLY_COUPON], registry=world.registry)
    coupons.adopt(served)
    assert [i.endpoint for i in world.registry.instances("coupon-agent").values()] == [served.url]
    desk = create_agent(
        model(calls("handle_order", message="Use SAVE10 on A1"), "Sorry, the coupon failed."),
        [],
        enhanced_by=world.enhancer(),
    )

    state = desk.invoke({"messages": [("user", "use SAVE10 on A1")]}, {"configurable": {"thread_id": "conv-2"}})

    assert state["messages"][-1].content == "Sorry, the coupon failed."
    served_thread = session_key(None, "conv-2").encode()  # serve_graph keeps the tenant's conversation as the thread
    coupon_turn = coupon_graph.get_state({"configurable": {"thread_id": served_thread}}).values["messages"]
    refused = next(m for m in coupon_turn if isinstance(m, ToolMessage))
    assert refused.status == "error" and "loop detected" in str(refused.content)
    assert "order-agent/handle_order -> coupon-agent/apply_coupon -> order-agent/handle_order" in str(refused.content)
    order_turn = order_graph.get_state({"configurable": {"thread_id": served_thread}}).values["messages"]
    assert [m.content for m in order_turn if m.type == "human"] == ["Use SAVE10 on A1"]
