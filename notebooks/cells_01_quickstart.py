"""Cells of ``01_quickstart.ipynb``: a LangGraph agent reaching other agents through ReachEnhancer."""

CELLS: list[tuple[str, str]] = [
    (
        "md",
        """
# Quickstart: a LangGraph agent that reaches other agents

A customer-service **front desk** is a LangGraph agent with a few local tools.
Behind it, four agents run on this machine: two `orders` instances,
`inventory` and `knowledge`, each served over HTTP by the agent SDK and
registered in the **embedded default registry** (in memory, no server).

`ReachEnhancer` is the one changed line: every tool call an agent can serve is
sent to it by capability, with session affinity, retries and failover.

Runs offline with a scripted chat model: no API key.
""",
    ),
    (
        "code",
        """
import json

from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from reach_plugins import ReachEnhancer
from reach_plugins.agent import BackgroundServer
from reach_plugins.demo.agents import inventory_agent, knowledge_agent, orders_agent
from reach_plugins.demo.model import Rule, ScriptedChatModel
from reach_plugins.langchain import create_agent
from reach_plugins.registry import MemoryRegistry

registry = MemoryRegistry()
instances = {}
for instance_id, factory in [
    ("orders-1", orders_agent),
    ("orders-2", orders_agent),
    ("inventory-1", inventory_agent),
    ("knowledge-1", knowledge_agent),
]:
    agent = factory()
    server = BackgroundServer(agent.app).start()
    instances[instance_id] = (server, await agent.register(registry, server.url, instance_id=instance_id))
    print(f"{instance_id:<12} {server.url}  offers {[c.name for c in agent.capabilities]}")
""",
    ),
    (
        "md",
        """
## The front desk

Its local tools have their own names, so `capability_map` says which
capability each one stands for (`explain` says why a tool routes, or stays
local: a local tool runs locally unless the map, its exact name or an opt-in
`match="semantic", min_similarity=...` says otherwise). The enhancer offers a
proxy tool for a capability no local tool covers when `expose` names it
(`search_knowledge`; none by default, so the model never sees a tool nobody chose).
""",
    ),
    (
        "code",
        """
@tool
def lookup_order_status(order_id: str) -> str:
    \"\"\"Look up where a customer's order is and when it will arrive.\"\"\"
    return f"(local fallback) order {order_id}: status unknown"


@tool
def check_stock(sku: str) -> str:
    \"\"\"Check how many units of a product are in stock.\"\"\"
    return f"(local fallback) stock of {sku}: unknown"


enhancer = ReachEnhancer(
    registry=registry,
    capability_map={"lookup_order_status": "query_order", "check_stock": "check_inventory"},
    expose=["search_knowledge"],
)
for local in (lookup_order_status, check_stock):
    resolution = enhancer.explain(local.name, local.description)
    print(f"{local.name:<20} -> {resolution.capability:<16} ({resolution.rule}: {resolution.detail})")
print("proxy tools:", [spec.name for spec in enhancer.tools([lookup_order_status.name, check_stock.name])])

rules = [
    Rule(r"order (A\\d+)", "lookup_order_status", lambda m: {"order_id": m.group(1)}),
    Rule(r"SKU ([A-Z]-\\d+)", "check_stock", lambda m: {"sku": m.group(1)}),
    Rule(r"return policy", "search_knowledge", lambda m: {"query": "return policy"}),
]
desk = create_agent(
    ScriptedChatModel(rules=rules),
    [lookup_order_status, check_stock],
    enhanced_by=enhancer,
    checkpointer=InMemorySaver(),
)
""",
    ),
    (
        "code",
        """
conversation = {"configurable": {"thread_id": "conv-42"}}
routes = []


async def ask(text: str) -> None:
    state = await desk.ainvoke({"messages": [("user", text)]}, conversation)
    tool_message = state["messages"][-2]
    route = (tool_message.artifact or {}).get("reach") or {}
    routes.append(route)
    print(f"> {text}\\n  {state['messages'][-1].content}")
    restored = "  (context restored on another instance)" if route.get("context_restore") else ""
    print(f"  {tool_message.name} -> {route.get('capability')} on {route.get('instance')}{restored}")


await ask("Where is order A1001?")
await ask("Is SKU K-7 in stock?")
await ask("What is your return policy?")
""",
    ),
    (
        "md",
        """
## Kill the instance holding the conversation

The `orders` instance that served this conversation stops: no goodbye, its
heartbeats just end. The next order question fails over to the other
instance, and the response says the conversation's context was restored
there (`context_restore`).
""",
    ),
    (
        "code",
        """
pinned = routes[0]["instance"]
server, registration = instances[pinned]
await registration.halt()
server.stop()
print("killed", pinned)
await ask("And order A1002?")
""",
    ),
    (
        "code",
        """
await enhancer.aclose()
for instance_id, (server, registration) in instances.items():
    if instance_id != pinned:
        await registration.stop()
        server.stop()
summary = {
    "routes": [(r["capability"], r["instance"]) for r in routes],
    "killed": pinned,
    "context_restore": routes[-1]["context_restore"],
}
print("SUMMARY", json.dumps(summary))
""",
    ),
]
