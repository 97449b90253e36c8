"""A stateful MCP server (Streamable HTTP) built with the official ``mcp`` SDK, run by the tests in the peers' venv.

    .venv-peers/bin/python tests/peers/mcp_server.py PORT        # POST/GET/DELETE http://127.0.0.1:PORT/mcp

Tools: ``add_numbers`` (structured output), ``remember_item`` (a list kept per
MCP session: it shows whether a conversation kept its session) and
``fail_tool`` (a tool error). ``GET /sessions`` counts the sessions opened.
"""

from __future__ import annotations

import collections
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse

server = MCPServer("peer-tools")
REMEMBERED: dict[str, list[str]] = collections.defaultdict(list)


class Sum(BaseModel):
    total: int


@server.tool()
def add_numbers(a: int, b: int) -> Sum:
    """Add two whole numbers."""
    return Sum(total=a + b)


@server.tool()
def remember_item(item: str, ctx: Context) -> str:
    """Remember an item for this session and list what was remembered so far."""
    kept = REMEMBERED[(ctx.headers or {}).get("mcp-session-id", "none")]
    kept.append(item)
    return ", ".join(kept)


@server.tool()
def fail_tool(reason: str) -> str:
    """Always fail with the given reason."""
    raise ValueError(reason)


@server.custom_route("/sessions", methods=["GET"])
async def sessions(request: Request) -> JSONResponse:
    return JSONResponse({"sessions": len(REMEMBERED)})


if __name__ == "__main__":
    port = int(sys.argv[1])
    uvicorn.run(server.streamable_http_app(host="127.0.0.1"), host="127.0.0.1", port=port, log_level="warning")
