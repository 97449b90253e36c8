"""Dify's missing ``tool.before_invoke`` hook, called the way the Reach plugins for Dify call it.

Dify runs a tool with ``session.tool.invoke(...)``; the Reach agent strategy
asks :func:`before_invoke` first. A result means an agent answered (Dify's own
tool is skipped); ``None`` means Dify runs its tool. The conversation id keeps
a conversation on one instance, and a closed conversation is refused. No Dify
is needed to run this; ``examples/dify_plugin/`` holds the installable plugins.

    python examples/dify_before_invoke.py
"""

import asyncio

from reach_plugins import ReachEnhancer
from reach_plugins.agent import BackgroundServer
from reach_plugins.demo.agents import orders_agent
from reach_plugins.dify import before_invoke, close_conversation, configure
from reach_plugins.registry import MemoryRegistry


def dify_tool_call(tool: str, parameters: dict[str, str], conversation: str) -> str:
    """What a hooked ``session.tool.invoke`` does: ask the hook, fall back to Dify's own tool."""
    result = before_invoke(tool, parameters, conversation_id=conversation, app_id="app-cs", user_id="end-user-7")
    if result is None:
        return f"Dify ran its own {tool!r} tool"
    where = f" [{result.route.instance}]" if result.route else ""
    return f"{'reached' if result.ok else 'refused'}{where}: {result.content}"


async def register_orders(registry: MemoryRegistry) -> list[BackgroundServer]:
    servers = []
    for number in (1, 2):
        agent = orders_agent()
        server = BackgroundServer(agent.app).start()
        await agent.register(registry, server.url, instance_id=f"orders-{number}")
        servers.append(server)
    return servers


def main() -> None:
    registry = MemoryRegistry()
    servers = asyncio.run(register_orders(registry))
    enhancer = ReachEnhancer(registry=registry, matcher=False)
    configure(enhancer)
    try:
        print(dify_tool_call("query_order", {"order_id": "A1001"}, "dify-conv-1"))
        print(dify_tool_call("query_order", {"order_id": "A1002"}, "dify-conv-1"))
        print(dify_tool_call("current_time", {"timezone": "Asia/Shanghai"}, "dify-conv-1"))
        close_conversation("dify-conv-1")
        print(dify_tool_call("query_order", {"order_id": "A1001"}, "dify-conv-1"))
    finally:
        configure(None)
        enhancer.close()
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
