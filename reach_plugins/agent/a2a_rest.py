"""The HTTP+JSON binding of the A2A server, under ``/a2a/rest``: the same operations as JSON-RPC, by path.

``POST /message:send`` / ``/message:stream``, ``GET /tasks/{id}``,
``GET /tasks`` (ListTasks, its fields as query parameters), ``POST
/tasks/{id}:cancel``, ``GET|POST /tasks/{id}:subscribe``. A stream is
Server-Sent Events whose data are the StreamResponse objects; an error is
AIP-193 JSON (``{"error": {code, status, message, details: [ErrorInfo]}}``)
under the error's HTTP status. Push-notification configs answer
PushNotificationNotSupported, as the card declares no push.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from reach_plugins.agent.a2a import A2AServer, check_version, refused_method
from reach_plugins.agent.a2a_rpc import INVALID_PARAMS, METHOD_NOT_FOUND, RpcError, layer_error, proto_names
from reach_plugins.errors import ReachError
from reach_plugins.server.layer import Inbound, Stage
from reach_plugins.wire.sse import encode_sse

_TASK = re.compile(r"tasks/(?P<id>[^/:]+)(?P<verb>:cancel|:subscribe|/pushNotificationConfigs(?:/[^/]+)?)?")
_NUMBERS = ("pageSize", "historyLength")


def problem(exc: RpcError, status: int | None = None) -> Response:
    """An A2A error as AIP-193 JSON under its HTTP status (or ``status``)."""
    code = status or exc.http_status
    error = {"code": code, "status": exc.status_name, "message": exc.message, "details": exc.details()}
    return JSONResponse({"error": error}, status_code=code)


def _query(query: Mapping[str, str]) -> dict[str, Any]:
    """ListTasks / GetTask fields from the query string (numbers and booleans read as such)."""
    found: dict[str, Any] = proto_names(dict(query))
    for name in _NUMBERS:
        if name in found:
            if not found[name].isdigit():
                raise RpcError(INVALID_PARAMS, f"{name} must be a non-negative integer")
            found[name] = int(found[name])
    if "includeArtifacts" in found:
        found["includeArtifacts"] = found["includeArtifacts"].lower() == "true"
    return found


class RestRoutes:
    """The handlers of the ``/a2a/rest`` routes: the two that send a message (a JSON body) and the rest."""

    def __init__(self, server: A2AServer) -> None:
        self.server = server

    def refuse(self, exc: ReachError, stage: Stage) -> Response:
        """The server layer's refusals in AIP-193 form, under the error's own status (401/403, 413/408, 415)."""
        return problem(layer_error(exc, stage), exc.http_status)

    async def send(self, inbound: Inbound) -> Response:
        return await self._message(inbound, stream=False)

    async def stream(self, inbound: Inbound) -> Response:
        return await self._message(inbound, stream=True)

    async def _message(self, inbound: Inbound, *, stream: bool) -> Response:
        try:
            check_version(inbound.headers)
            if not isinstance(inbound.body, Mapping):
                raise RpcError(INVALID_PARAMS, "the body must be a JSON object")
            result = await self.server.send(proto_names(inbound.body), inbound, "1.0", stream=stream)
        except RpcError as exc:
            return problem(exc)
        return self._answer(result)

    async def tasks(self, inbound: Inbound) -> Response:
        """Every operation but sending a message (none takes a body): by path and method."""
        path = inbound.request.path_params["path"]
        try:
            check_version(inbound.headers)
            query = _query(inbound.request.query_params)
            if path == "tasks" and inbound.request.method == "GET":
                return JSONResponse(self.server.list_tasks(query, inbound, "1.0"))
            if path == "extendedAgentCard":
                raise refused_method("GetExtendedAgentCard")
            result = await self._task(path, inbound.request.method, query, inbound)
        except RpcError as exc:
            return problem(exc)
        return self._answer(result)

    async def _task(
        self, path: str, method: str, query: dict[str, Any], inbound: Inbound
    ) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
        found = _TASK.fullmatch(path)
        if found is None:
            raise RpcError(METHOD_NOT_FOUND, f"no A2A operation at /a2a/rest/{path}")
        params, verb = {**query, "id": found["id"]}, found["verb"] or ""
        if verb.startswith("/pushNotificationConfigs"):
            raise refused_method("CreateTaskPushNotificationConfig")
        if verb == ":subscribe":
            return await self.server.subscribe(params, inbound, "1.0")
        if verb == ":cancel" and method == "POST":
            return await self.server.cancel(params, inbound, "1.0")
        if verb == "" and method == "GET":
            return self.server.get(params, inbound, "1.0")
        raise RpcError(METHOD_NOT_FOUND, f"{method} /a2a/rest/{path} is not an A2A operation")

    @staticmethod
    def _answer(result: dict[str, Any] | AsyncIterator[dict[str, Any]]) -> Response:
        if isinstance(result, AsyncIterator):
            return StreamingResponse(
                _events(result), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        return JSONResponse(result)


async def _events(items: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for item in items:
        yield encode_sse(json.dumps(item, ensure_ascii=False))
