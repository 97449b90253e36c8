"""The JSON-RPC binding of the A2A server: one route (``/a2a`` and ``/a2a/``) that reads the envelope strictly,
checks ``A2A-Version`` and runs the operation asked, answering a stream as Server-Sent Events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from reach_plugins.agent.a2a import OPERATIONS, A2AServer, check_version, refused_method
from reach_plugins.agent.a2a_rpc import RpcError, answer, failure, layer_error, read_call, request_id
from reach_plugins.errors import ReachError
from reach_plugins.server.layer import Inbound, Stage
from reach_plugins.wire.sse import encode_sse


class JsonRpcRoute:
    """``POST /a2a``: JSON-RPC 2.0 in either dialect's method names, answered in the dialect asked."""

    def __init__(self, server: A2AServer) -> None:
        self.server = server

    def refuse(self, exc: ReachError, stage: Stage) -> Response:
        """The server layer's refusals as JSON-RPC errors under the error's own status (401/403, 413/408, 415)."""
        return JSONResponse(failure(None, layer_error(exc, stage)), status_code=exc.http_status)

    async def __call__(self, inbound: Inbound) -> Response:
        body = inbound.body
        try:
            call = read_call(body)
            check_version(inbound.headers)
            result = await self.run(call.method, call.params, inbound)
        except RpcError as exc:
            return JSONResponse(failure(request_id(body), exc))
        if isinstance(result, AsyncIterator):
            return StreamingResponse(
                self._events(call.id, result), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        return JSONResponse(answer(call.id, result))

    async def run(
        self, method: str, params: Mapping[str, Any], inbound: Inbound
    ) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
        """The operation ``method`` names: its result, or the items of its stream."""
        if method not in OPERATIONS:
            raise refused_method(method)
        dialect, kind = OPERATIONS[method]
        server = self.server
        if kind == "get":
            return server.get(params, inbound, dialect)
        if kind == "list":
            return server.list_tasks(params, inbound, dialect)
        if kind == "cancel":
            return await server.cancel(params, inbound, dialect)
        if kind == "subscribe":
            return await server.subscribe(params, inbound, dialect)
        return await server.send(params, inbound, dialect, stream=kind == "stream")

    @staticmethod
    async def _events(rpc_id: Any, items: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
        async for item in items:
            yield encode_sse(json.dumps(answer(rpc_id, item), ensure_ascii=False))
