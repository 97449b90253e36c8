"""``langchain-mcp-adapters`` loads an MCP endpoint's tools into a LangGraph agent; run in ``.venv-mcp1``.

    .venv-mcp1/bin/python tests/peers/langchain_mcp_client.py URL TOKEN TOOL ARGS_JSON

A scripted chat model calls ``TOOL`` with ``ARGS_JSON`` once, then answers.
Prints ``{"tools": [...], "tool_messages": [...]}`` as JSON on stdout.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langgraph.prebuilt import create_react_agent


class ScriptedModel(GenericFakeChatModel):
    """GenericFakeChatModel cannot bind tools; the script already knows which tool to call."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


async def main(url: str, token: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    client = MultiServerMCPClient(
        {"reach": {"url": url, "transport": "streamable_http", "headers": {"Authorization": f"Bearer {token}"}}}
    )
    tools = await client.get_tools()
    script = iter(
        [AIMessage(content="", tool_calls=[{"name": tool, "args": arguments, "id": "call-1"}]), AIMessage("done")]
    )
    agent = create_react_agent(ScriptedModel(messages=script), tools)
    state = await agent.ainvoke({"messages": [("user", "go")]})
    results = [m.content for m in state["messages"] if isinstance(m, ToolMessage)]
    return {"tools": sorted(t.name for t in tools), "tool_messages": results}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))), default=str))
