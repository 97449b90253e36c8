"""The agent the Python peers proxy to: one aiohttp.web process speaking OpenAI chat completions and MCP.

LiteLLM's proxy forwards ``POST /v1/chat/completions`` to an OpenAI-compatible
server and ContextForge forwards ``tools/call`` to an MCP server; neither
speaks Reach, so ``bench_hops.py`` starts this echo agent for them and
measures each peer against a raw POST to the same endpoint here. The MCP side
is stateless Streamable HTTP answering JSON (``initialize``, ``tools/list``,
``tools/call``); no model runs, so the figures are the hop alone.

    .venv/bin/python benchmarks/peer_agent.py PORT
"""

from __future__ import annotations

import sys
from typing import Any

from aiohttp import web

TOOL = {
    "name": "echo",
    "description": "Echo the order id back.",
    "inputSchema": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
}


async def chat(request: web.Request) -> web.Response:
    """An OpenAI chat completion whose answer is the last message's content."""
    body = await request.json()
    text = body["messages"][-1]["content"]
    message = {"role": "assistant", "content": text}
    return web.json_response(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "echo"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


def mcp_result(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The JSON-RPC result of one MCP method (``initialize``, ``tools/list``, ``tools/call``, ``ping``)."""
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "bench-echo", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call":
        order = params.get("arguments", {}).get("order_id", "")
        return {"content": [{"type": "text", "text": order}], "structuredContent": {"order_id": order}}
    return {}


async def mcp(request: web.Request) -> web.Response:
    """Streamable HTTP without sessions: a request gets its JSON answer, a notification 202."""
    message = await request.json()
    if "id" not in message:
        return web.Response(status=202)
    result = mcp_result(message["method"], message.get("params") or {})
    return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})


async def not_streamed(_: web.Request) -> web.Response:
    """No server-initiated stream (GET) and no session to delete: 405, as Streamable HTTP allows."""
    return web.Response(status=405)


def app() -> web.Application:
    application = web.Application()
    application.router.add_post("/v1/chat/completions", chat)
    application.router.add_post("/mcp", mcp)
    application.router.add_route("GET", "/mcp", not_streamed)
    application.router.add_route("DELETE", "/mcp", not_streamed)
    return application


if __name__ == "__main__":
    web.run_app(app(), host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
