"""A LangGraph agent whose tool calls reach other agents: one changed line, ``enhanced_by=ReachEnhancer(...)``.

The front desk has two local tools; the enhancer sends each call to the agent
that offers the capability the tool maps to, keeps the conversation (the
LangGraph ``thread_id``) on one instance, and offers ``search_knowledge`` as a
proxy tool because ``expose`` names it and no local tool covers it. A scripted
chat model stands in for an LLM, so it runs offline with no API key.

    python examples/langgraph_agent.py
"""

import asyncio

from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from reach_plugins import ReachEnhancer
from reach_plugins.agent import BackgroundServer
from reach_plugins.demo.agents import inventory_agent, knowledge_agent, orders_agent
from reach_plugins.demo.model import Rule, ScriptedChatModel
from reach_plugins.langchain import create_agent
from reach_plugins.registry import MemoryRegistry

RULES = [
    Rule(r"order (A\d+)", "lookup_order_status", lambda m: {"order_id": m.group(1)}),
    Rule(r"SKU ([A-Z]-\d+)", "check_stock", lambda m: {"sku": m.group(1)}),
    Rule(r"return policy", "search_knowledge", lambda m: {"query": "return policy"}),
]


@tool
def lookup_order_status(order_id: str) -> str:
    """Look up where a customer's order is and when it will arrive."""
    return f"(local fallback) order {order_id}: unknown"


@tool
def check_stock(sku: str) -> str:
    """Check how many units of a product are in stock."""
    return f"(local fallback) stock of {sku}: unknown"


async def main() -> None:
    registry = MemoryRegistry()
    servers = []
    for number, factory in enumerate([orders_agent, orders_agent, inventory_agent, knowledge_agent], start=1):
        agent = factory()
        server = BackgroundServer(agent.app).start()
        await agent.register(registry, server.url, instance_id=f"{agent.name}-{number}")
        servers.append(server)

    enhancer = ReachEnhancer(
        registry=registry,
        capability_map={"lookup_order_status": "query_order", "check_stock": "check_inventory"},
        expose=["search_knowledge"],
    )
    desk = create_agent(
        ScriptedChatModel(rules=RULES),
        [lookup_order_status, check_stock],
        enhanced_by=enhancer,
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "conv-42"}}
    try:
        for text in (
            "Where is order A1001?",
            "Is SKU K-7 in stock?",
            "And order A1002?",
            "What is your return policy?",
        ):
            state = await desk.ainvoke({"messages": [("user", text)]}, config)
            reached = state["messages"][-2]
            route = (reached.artifact or {}).get("reach") or {}
            print(f"> {text}\n  {state['messages'][-1].content}")
            print(f"  via {reached.name} -> {route.get('capability')} on {route.get('instance')}")
    finally:
        await enhancer.aclose()
        for server in servers:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
