"""The gateway's MCP endpoint (Streamable HTTP, ``POST /mcp``): a tenant's reachable capabilities as MCP tools.

Claude Desktop, Cursor, langchain-mcp-adapters or Dify's MCP client connect
with the tenant's bearer token; ``tools/list`` lists what that tenant may
reach (capabilities by name, descriptions, ``params_schema`` as
``inputSchema``) and ``tools/call`` reaches the capability through the
gateway's forwarder (routing, retries, breakers). The MCP session is the
conversation: its id is the request's ``session_id``, so affinity keeps a
client on one agent instance. Answers are single JSON responses (no server
stream); ``DELETE /mcp`` ends a session.

Sessions are kept under their tenant's :class:`~reach_plugins.stores.keys.ScopedKey`
in an :class:`~reach_plugins.stores.budget.LruTable` within a
:class:`~reach_plugins.stores.budget.Budget` (entries and bytes): a session id
presented by another tenant is unknown (404), as is one pushed out by the bounds.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.responses import Response

from reach_plugins.errors import ReachError
from reach_plugins.model import ReachRequest
from reach_plugins.server.inbound import BodyPlaces, InputLimits
from reach_plugins.server.layer import JSON, Around, Authenticate, Inbound, ServerRoute, Stage
from reach_plugins.stores.budget import DEFAULT_BUDGET, Budget, LruTable
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.wire.headers import SOURCE
from reach_plugins.wire.redact import without_addresses

if TYPE_CHECKING:
    from reach_plugins.server.forwarder import Forwarder

VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""The handshake revisions served, newest first; an unknown one is answered with the newest."""
SESSION_HEADER = "mcp-session-id"
KIND = "mcp-session"
_SESSION_BYTES = 64
"""Estimated bytes of one session entry besides its key."""
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602


def _response(message: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    return Response(body, status, headers, media_type="application/json")


def _error(rpc_id: Any, code: int, message: str, status: int = 200) -> Response:
    return _response({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}, status)


def _refuse(exc: ReachError, stage: Stage) -> Response:
    """The server layer's refusals as JSON-RPC errors under the error's own status (401/403, 413/408, 400)."""
    return _error(None, PARSE_ERROR if stage == "parse" else INVALID_REQUEST, exc.message, exc.http_status)


def _result(rpc_id: Any, result: Mapping[str, Any], headers: dict[str, str] | None = None) -> Response:
    return _response({"jsonrpc": "2.0", "id": rpc_id, "result": result}, headers=headers)


class McpEndpoint:
    """MCP over Streamable HTTP in front of one gateway's :class:`~reach_plugins.server.forwarder.Forwarder`."""

    def __init__(self, forwarder: Forwarder, *, budget: Budget = DEFAULT_BUDGET) -> None:
        self.forwarder = forwarder
        self.sessions: LruTable[bool] = LruTable(budget, "MCP session")
        """The open MCP sessions, each under the key of the tenant that opened it."""

    def routes(
        self, caller: Authenticate, *, limits: InputLimits, large: BodyPlaces, around: Around
    ) -> list[ServerRoute]:
        """``POST /mcp`` (one JSON-RPC message) and ``GET``/``DELETE /mcp`` (no body), through the server layer."""
        return [
            ServerRoute(
                "/mcp",
                ("POST",),
                self.post,
                auth=caller,
                body=JSON,
                limits=limits,
                large=large,
                refuse=_refuse,
                around=around,
            ),
            ServerRoute("/mcp", ("GET", "DELETE"), self.end, auth=caller, refuse=_refuse, around=around),
        ]

    def _session(self, inbound: Inbound) -> tuple[str | None, Response | None]:
        """The caller's MCP session id, or the 404 when it names a session the caller's tenant did not open."""
        session = inbound.headers.get(SESSION_HEADER)
        if session is not None and self.sessions.get(ScopedKey.of(inbound.caller, KIND, session)) is None:
            return session, _error(None, INVALID_REQUEST, "unknown MCP session: initialize a new one", 404)
        return session, None

    async def end(self, inbound: Inbound) -> Response:
        """``DELETE /mcp`` ends a session; ``GET /mcp`` (a server stream) is not served."""
        if inbound.request.method == "GET":
            return Response(status_code=405, headers={"Allow": "POST, DELETE"})
        session, unknown = self._session(inbound)
        if unknown is not None:
            return unknown
        if session is not None:
            self.sessions.pop(ScopedKey.of(inbound.caller, KIND, session))
        return Response(status_code=200)

    async def post(self, inbound: Inbound) -> Response:
        """One JSON-RPC request or notification."""
        session, unknown = self._session(inbound)
        if unknown is not None:
            return unknown
        message = inbound.body
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return _error(None, INVALID_REQUEST, "expected one JSON-RPC request or notification", 400)
        if "id" not in message:
            return Response(status_code=202)
        raw_params = message.get("params")
        params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        client = inbound.request.client
        source = client.host if client else None
        return await self._dispatch(message["method"], message["id"], params, inbound.caller, session, source)

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
        self.sessions.put(ScopedKey.of(tenant, KIND, session), True, _SESSION_BYTES)
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "reach-gateway", "version": "1"},
        }
        return _result(rpc_id, result, {"Mcp-Session-Id": session})

    def tools(self, tenant: str | None, source: str | None) -> list[dict[str, Any]]:
        """The capabilities ``tenant`` may reach from ``source``, once each, as MCP tools."""
        tools: dict[str, dict[str, Any]] = {}
        for agent in self.forwarder.visible(tenant, source):
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
            response = await self.forwarder.run(reach)
        except ReachError as exc:
            text = without_addresses(exc.message)
            return _result(rpc_id, {"content": [{"type": "text", "text": text}], "isError": True})
        except ValueError as exc:
            return _error(rpc_id, INVALID_PARAMS, f"tools/call: {exc}")
        if response.status != "success":
            text = without_addresses(response.error.message) if response.error else f"the reach ended {response.status}"
            return _result(rpc_id, {"content": [{"type": "text", "text": text}], "isError": True})
        data = response.data
        reply = data.get("reply_content") if isinstance(data, Mapping) else None
        text = reply if isinstance(reply, str) and reply else json.dumps(data, ensure_ascii=False, default=str)
        result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
        if isinstance(data, Mapping):
            result["structuredContent"] = dict(data)
        return _result(rpc_id, result)
