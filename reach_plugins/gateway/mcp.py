"""The gateway's MCP endpoint (Streamable HTTP, ``POST /mcp``): a tenant's reachable capabilities as MCP tools.

Claude Desktop, Cursor, langchain-mcp-adapters or Dify's MCP client connect
with the tenant's bearer token; ``tools/list`` lists what that tenant may
reach (capabilities by name, descriptions, ``params_schema`` as
``inputSchema``) and ``tools/call`` reaches the capability through the
gateway's forwarder (routing, retries, breakers). The MCP session is the
conversation: its id is the request's ``session_id``, so affinity keeps a
client on one agent instance. Answers are single JSON responses (no server
stream); ``DELETE /mcp`` ends a session.
"""

from __future__ import annotations

import json
import secrets
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from reach_plugins.errors import Backpressure, ReachError
from reach_plugins.model import ReachRequest
from reach_plugins.server.inbound import loads, read_body
from reach_plugins.wire.headers import SOURCE

if TYPE_CHECKING:
    from reach_plugins.gateway.app import Gateway

VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""The handshake revisions served, newest first; an unknown one is answered with the newest."""
SESSION_HEADER = "mcp-session-id"
SESSIONS_KEPT = 10_000
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602


def _response(message: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    return Response(body, status, headers, media_type="application/json")


def _error(rpc_id: Any, code: int, message: str, status: int = 200) -> Response:
    return _response({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}, status)


def _result(rpc_id: Any, result: Mapping[str, Any], headers: dict[str, str] | None = None) -> Response:
    return _response({"jsonrpc": "2.0", "id": rpc_id, "result": result}, headers=headers)


class McpEndpoint:
    """MCP over Streamable HTTP in front of one :class:`~reach_plugins.gateway.app.Gateway`."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.sessions: OrderedDict[str, str | None] = OrderedDict()
        """MCP session id -> the tenant that opened it (bounded: the oldest session is dropped)."""

    async def handle(self, request: Request) -> Response:
        """One MCP message, counted in the gateway's in-flight requests (over ``max_inflight``: 429, come back)."""
        gateway = self.gateway
        gateway.inflight += 1
        try:
            if gateway.inflight > gateway.max_inflight:
                headers = {"Retry-After": f"{gateway.retry_after:g}"}
                return Response(status_code=Backpressure.http_status, headers=headers)
            answer = await self._handle(request)
        finally:
            gateway.inflight -= 1
        from reach_plugins.gateway.app import REQUESTS  # app.py mounts this module: import its names late

        gateway.metrics.inc(REQUESTS, {"endpoint": "mcp", "status": str(answer.status_code)})
        return answer

    async def _handle(self, request: Request) -> Response:
        try:
            tenant = self.gateway.access.authenticate(request.headers.get("authorization"), None)
        except ReachError as exc:
            return _error(None, INVALID_REQUEST, exc.message, exc.http_status)
        if request.method == "GET":
            return Response(status_code=405, headers={"Allow": "POST, DELETE"})
        session = request.headers.get(SESSION_HEADER)
        if session is not None and self.sessions.get(session, "-") != tenant:
            return _error(None, INVALID_REQUEST, "unknown MCP session: initialize a new one", 404)
        if request.method == "DELETE":
            self.sessions.pop(session or "", None)
            return Response(status_code=200)
        limits = self.gateway.limits
        try:
            raw = await read_body(
                request.stream(),
                request.headers,
                limit=limits.max_body,
                timeout=limits.body_timeout,
                large=self.gateway.large,
            )
        except ReachError as exc:
            return _error(None, INVALID_REQUEST, exc.message, exc.http_status)
        try:
            message = loads(raw, max_depth=limits.max_depth)
        except ReachError as exc:
            return _error(None, PARSE_ERROR, exc.message, exc.http_status)
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return _error(None, INVALID_REQUEST, "expected one JSON-RPC request or notification", 400)
        if "id" not in message:
            return Response(status_code=202)
        raw_params = message.get("params")
        params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        source = request.client.host if request.client else None
        return await self._dispatch(message["method"], message["id"], params, tenant, session, source)

    async def _dispatch(
        self,
        method: str,
        rpc_id: Any,
        params: dict[str, Any],
        tenant: str | None,
        session: str | None,
        source: str | None,
    ) -> Response:
        if method == "initialize":
            return self._initialize(rpc_id, params, tenant)
        if session is None:
            return _error(rpc_id, INVALID_REQUEST, "no Mcp-Session-Id: initialize first", 400)
        if method == "ping":
            return _result(rpc_id, {})
        if method == "tools/list":
            return _result(rpc_id, {"tools": self.tools(tenant, source)})
        if method == "tools/call":
            return await self._call(rpc_id, params, tenant, session, source)
        return _error(rpc_id, METHOD_NOT_FOUND, f"method {method!r} is not served; use tools/list or tools/call")

    def _initialize(self, rpc_id: Any, params: dict[str, Any], tenant: str | None) -> Response:
        asked = params.get("protocolVersion")
        version = asked if asked in VERSIONS else VERSIONS[0]
        session = secrets.token_hex(16)
        self.sessions[session] = tenant
        while len(self.sessions) > SESSIONS_KEPT:
            self.sessions.popitem(last=False)
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "reach-gateway", "version": "1"},
        }
        return _result(rpc_id, result, {"Mcp-Session-Id": session})

    def tools(self, tenant: str | None, source: str | None) -> list[dict[str, Any]]:
        """The capabilities ``tenant`` may reach from ``source``, once each, as MCP tools."""
        tools: dict[str, dict[str, Any]] = {}
        for agent in self.gateway.forwarder.visible(tenant, source):
            for capability in agent["capabilities"]:
                schema = capability["params_schema"] or {"type": "object"}
                description = capability["description"] or f"Reach the capability {capability['name']}."
                tools.setdefault(
                    capability["name"], {"name": capability["name"], "description": description, "inputSchema": schema}
                )
        return [tools[name] for name in sorted(tools)]

    async def _call(
        self, rpc_id: Any, params: dict[str, Any], tenant: str | None, session: str, source: str | None
    ) -> Response:
        name, arguments = params.get("name"), params.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return _error(rpc_id, INVALID_PARAMS, "tools/call needs 'name' (a string) and 'arguments' (an object)")
        try:
            metadata = {SOURCE: source} if source else {}
            reach = ReachRequest(
                capability=name, payload=arguments, tenant=tenant, session_id=session, metadata=metadata
            )
            response = await self.gateway.forwarder.run(reach)
        except ReachError as exc:
            return _result(rpc_id, {"content": [{"type": "text", "text": exc.message}], "isError": True})
        except ValueError as exc:
            return _error(rpc_id, INVALID_PARAMS, f"tools/call: {exc}")
        if response.status != "success":
            text = response.error.message if response.error else f"the reach ended {response.status}"
            return _result(rpc_id, {"content": [{"type": "text", "text": text}], "isError": True})
        data = response.data
        reply = data.get("reply_content") if isinstance(data, Mapping) else None
        text = reply if isinstance(reply, str) and reply else json.dumps(data, ensure_ascii=False, default=str)
        result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
        if isinstance(data, Mapping):
            result["structuredContent"] = dict(data)
        return _result(rpc_id, result)
