"""LangChain's retry middleware over Reach: retry what may pass next time, tell the model a refusal at once.

With ``on_error="raise"`` a failed reach raises its :mod:`reach_plugins.errors`
class. ``ToolRetryMiddleware(retry_on=errors.is_retryable)`` then retries a
failure the handler marked ``Retryable`` (a flaky database) but not a
``BusinessError`` (an order that does not exist) nor a ``HandlerFailed`` (a
handler that raised anything else: it ran, and may have acted): those reach
``ToolErrorMiddleware``, which ``reach_error_message`` turns into a message the
model can act on. The agent counts what it actually ran.

    python examples/langgraph_retry.py
"""

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from langchain.agents.middleware import ToolErrorMiddleware, ToolRetryMiddleware
from langchain_core.tools import tool

from reach_plugins import ReachEnhancer
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.demo.model import Rule, ScriptedChatModel
from reach_plugins.errors import BusinessError, Retryable, is_retryable
from reach_plugins.langchain import create_agent, reach_error_message

AGENTS_YAML = """
agents:
  - name: orders
    endpoint: {url}
    capabilities: [query_order]
    retry: {{max_attempts: 1}}    # one layer retries: here LangChain's middleware, not the Reach core
"""
RULES = [Rule(r"order (A\d+)", "query_order", lambda m: {"order_id": m.group(1)})]
ran: list[str] = []
"""Every order id the agent's handler ran for, in order."""


def flaky_orders() -> ReachAgent:
    """An orders agent whose first two runs fail (marked retryable), that knows no order A9 and breaks on A7."""
    agent = ReachAgent("orders")

    @agent.capability("query_order", description="Look up where an order is")
    def query_order(order_id: str) -> dict[str, Any]:
        ran.append(order_id)
        if order_id == "A9":
            raise BusinessError("there is no order A9; order ids look like A1001")
        if order_id == "A7":
            raise KeyError("carrier")  # a bug: answered as handler_failed with an error id, never run again
        if len(ran) <= 2:
            raise Retryable("the orders database dropped the connection")  # safe to run again: retried
        return {"order_id": order_id, "status": "shipped", "items": ["kettle"], "eta": "2026-12-03"}

    return agent


@tool
def query_order(order_id: str) -> str:
    """Look up where an order is."""
    raise AssertionError("the local tool is never run: the agent serves it")


async def main() -> None:
    with BackgroundServer(flaky_orders().app) as server, tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "agents.yaml"
        config.write_text(AGENTS_YAML.format(url=server.url))
        async with ReachEnhancer(registry=f"file://{config}", on_error="raise", policy="remote_only") as enhancer:
            desk = create_agent(
                ScriptedChatModel(rules=RULES),
                [query_order],
                middleware=[
                    ToolErrorMiddleware(on_error=reach_error_message),
                    ToolRetryMiddleware(max_retries=2, retry_on=is_retryable, on_failure="error", initial_delay=0.01),
                ],
                enhanced_by=enhancer,
            )
            for text in ("Where is order A1001?", "Where is order A9?", "Where is order A7?"):
                ran.clear()
                state = await desk.ainvoke({"messages": [("user", text)]})
                tool_message = state["messages"][-2]
                print(f"> {text}\n  tool said ({tool_message.status}): {tool_message.content}")
                print(f"  the agent ran it {len(ran)} time(s)")


if __name__ == "__main__":
    asyncio.run(main())
