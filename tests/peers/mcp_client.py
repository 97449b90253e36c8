"""The official ``mcp`` client (Streamable HTTP) against an MCP endpoint, run by the tests in the peers' venv.

    .venv-peers/bin/python tests/peers/mcp_client.py URL TOKEN CALLS_JSON

Opens one session with ``Authorization: Bearer TOKEN``, lists the tools, makes
each call of ``CALLS_JSON`` (``[[name, arguments], ...]``) in that session
and prints ``{"tools": [...], "results": [...]}`` as JSON on stdout.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url: str, token: str, calls: list[list[Any]]) -> dict[str, Any]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        streamable_http_client(url, http_client=http) as (read, write, *_),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = await session.list_tools()
        results = []
        for name, arguments in calls:
            result = await session.call_tool(name, arguments)
            results.append(result.model_dump(mode="json", by_alias=True, exclude_none=True))
        tools = [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in listed.tools]
        return {"tools": tools, "results": results}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))))
