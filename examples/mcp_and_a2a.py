"""A LangGraph agent reaching an MCP server and an A2A agent through one ReachEnhancer, offline.

Two peers, two protocols, one line in the agent (``enhanced_by=...``):

* an MCP server (Streamable HTTP): here a Reach gateway's ``/mcp`` in front of
  the inventory agent — any MCP server is reached the same way. Its tools are
  read with ``tools/list`` into the registry as capabilities; each
  conversation gets its own MCP session;
* an A2A agent: the knowledge agent, which answers A2A (every ReachAgent
  publishes an agent card and serves ``SendMessage``). A2A peers carry no Reach
  token, so this one agent is served in the named open mode (``tokens="open"``,
  which warns at start); the inventory agent behind the gateway verifies the
  gateway's tokens.

A scripted chat model stands in for an LLM, so it runs with no API key.

    python examples/mcp_and_a2a.py
"""

import asyncio
import tempfile
from pathlib import Path

from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from reach_plugins import AgentDescriptor, ReachEnhancer
from reach_plugins.agent import BackgroundServer
from reach_plugins.demo.agents import inventory_agent, knowledge_agent
from reach_plugins.demo.model import Rule, ScriptedChatModel
from reach_plugins.gateway import create_app
from reach_plugins.langchain import create_agent
from reach_plugins.protocols.mcp_tools import register_mcp_agent
from reach_plugins.registry import MemoryRegistry
from transports.direct import DirectTransport

RULES = [
    Rule(r"SKU ([A-Z]-\d+)", "check_stock", lambda m: {"sku": m.group(1)}),
    Rule(r"return policy", "search_knowledge", lambda m: {"query": "return policy"}),
]


@tool
def check_stock(sku: str) -> str:
    """Check how many units of a product are in stock."""
    return f"(local fallback) stock of {sku}: unknown"


async def main() -> None:
    inventory, knowledge = inventory_agent(), knowledge_agent(tokens="open")
    with tempfile.TemporaryDirectory() as folder:
        behind_gateway = MemoryRegistry()
        config = Path(folder) / "gateway.yaml"
        config.write_text("agents: []\n")  # no tenants: this demo gateway is open on purpose (allow_open)
        with (
            BackgroundServer(inventory.app) as stock_server,
            BackgroundServer(knowledge.app) as kb_server,
            BackgroundServer(create_app(config, registry=behind_gateway, allow_open=True)) as gateway,
        ):
            await inventory.register(behind_gateway, stock_server.url)
            registry = MemoryRegistry()
            async with DirectTransport() as transport:
                mcp = AgentDescriptor(name="stock-tools", protocol="mcp", endpoints=[f"{gateway.url}/mcp"])
                mcp = await register_mcp_agent(registry, mcp, transport)
            print(f"MCP tools as capabilities: {[c.name for c in mcp.capabilities]}")
            await registry.register_agent(
                AgentDescriptor(
                    name="kb-a2a", protocol="a2a", endpoints=[kb_server.url], capabilities=["search_knowledge"]
                )
            )
            enhancer = ReachEnhancer(
                registry=registry, capability_map={"check_stock": "check_inventory"}, expose=["search_knowledge"]
            )
            desk = create_agent(
                ScriptedChatModel(rules=RULES), [check_stock], enhanced_by=enhancer, checkpointer=InMemorySaver()
            )
            config_ = {"configurable": {"thread_id": "conv-7"}}
            try:
                for text in ("Is SKU K-7 in stock?", "What is your return policy?"):
                    state = await desk.ainvoke({"messages": [("user", text)]}, config_)
                    reached = state["messages"][-2]
                    route = (reached.artifact or {}).get("reach") or {}
                    print(f"> {text}\n  {state['messages'][-1].content}")
                    print(f"  via {reached.name} -> {route.get('capability')} on agent {route.get('agent')}")
            finally:
                await enhancer.aclose()


if __name__ == "__main__":
    asyncio.run(main())
