"""A LlamaIndex FunctionAgent whose tool calls reach other agents through Reach.

LlamaIndex has no hook around tool calls, so ``enhance_agent`` wraps the
agent's tools (same metadata, so the model sees the same tools) and adds a
proxy tool for each capability named in ``expose`` that no local tool covers. One workflow ``Context``
is one conversation: its calls stay on one ``orders`` instance. A scripted
LLM stands in for a real one, so it runs offline with no API key.

    python examples/llamaindex_agent.py
"""

import asyncio
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ToolCallBlock
from llama_index.core.llms import ChatMessage, MessageRole
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.workflow import Context

from reach_plugins import ReachEnhancer
from reach_plugins.agent import BackgroundServer
from reach_plugins.demo.agents import inventory_agent, orders_agent
from reach_plugins.llamaindex import enhance_agent
from reach_plugins.registry import MemoryRegistry

warnings.filterwarnings("ignore", message="Skipping serialization")  # LlamaIndex notes its memory is not serialised

RULES: list[tuple[str, str, Callable[[re.Match[str]], dict[str, str]]]] = [
    (r"order (A\d+)", "lookup_order", lambda m: {"order_id": m.group(1)}),
    (r"SKU ([A-Z]-\d+)", "check_inventory", lambda m: {"sku": m.group(1)}),
]


def scripted(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
    """Call the tool the last question asks for; once it answered, repeat its answer."""
    if messages[-1].role == MessageRole.TOOL:
        return ChatMessage(role="assistant", content=f"Here is what I found: {messages[-1].content}")
    question = messages[-1].content or ""
    for pattern, tool, args in RULES:
        match = re.search(pattern, question)
        if match:
            call = ToolCallBlock(tool_call_id=f"call-{tool}", tool_name=tool, tool_kwargs=args(match))
            return ChatMessage(role="assistant", blocks=[call])
    return ChatMessage(role="assistant", content="I can look up orders and stock.")


def lookup_order(order_id: str) -> str:
    """Look up where a customer's order is and when it will arrive."""
    return f"(local fallback) order {order_id}: unknown"


async def main() -> None:
    registry = MemoryRegistry()
    servers = []
    for number, factory in enumerate([orders_agent, orders_agent, inventory_agent], start=1):
        served = factory()
        server = BackgroundServer(served.app).start()
        await served.register(registry, server.url, instance_id=f"{served.name}-{number}")
        servers.append(server)

    enhancer = ReachEnhancer(
        registry=registry, capability_map={"lookup_order": "query_order"}, expose=["check_inventory"]
    )
    agent = FunctionAgent(tools=[lookup_order], llm=MockFunctionCallingLLM(response_generator=scripted))
    enhance_agent(agent, enhancer)
    print(f"tools the model sees: {[tool.metadata.name for tool in await agent.get_tools('')]}")
    conversation = Context(agent)
    try:
        for question in ("Where is order A1001?", "Is SKU K-7 in stock?", "And order A1002?"):
            answer = await agent.run(question, ctx=conversation)
            print(f"> {question}\n  {answer}")
    finally:
        await enhancer.aclose()
        for server in servers:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
