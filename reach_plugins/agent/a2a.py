"""Every :class:`~reach_plugins.agent.ReachAgent` answers A2A too, so a stock A2A client reaches it.

``GET /.well-known/agent-card.json`` publishes a 1.x card (JSON-RPC 1.0 and
0.3 interfaces at ``/a2a``, plus the 0.3 ``url``) whose skills are the
agent's capabilities. Its URLs are the agent's own (``public_url``, else the
endpoint it is served or registered at, else the address the server is bound
to), never the caller's ``Host`` header, which anyone may forge. ``POST /a2a`` answers ``SendMessage`` /
``SendStreamingMessage`` / ``GetTask`` / ``CancelTask`` (and 0.3's
``message/send`` / ``message/stream`` / ``tasks/get`` / ``tasks/cancel``), in
the dialect of the method asked.

The answered tasks are kept in an :class:`~reach_plugins.stores.budget.LruTable`
within a :class:`~reach_plugins.stores.budget.Budget` (entries and bytes, the
least recently read out first), each under its creator's tenant
(:class:`~reach_plugins.stores.keys.ScopedKey`): ``GetTask`` by another tenant,
or by a caller without the tenant, finds nothing. A task whose result alone is
over the byte bound is answered but not kept (``GetTask`` then says "no task"),
so no task can hold more than its share.

A message runs one capability through :meth:`ReachAgent.handle` (so its
checks, idempotency and tokens apply): the one named by the
``reach.capability`` metadata, else the agent's only one. Data parts are the
payload; a text part fills the first required string parameter the data left
out. A success is a completed task with the result as its artifact; a business
error, or a handler that raised, a failed task whose status message says why. Tasks finish before the
answer, so ``CancelTask`` answers "not cancelable" (-32002) for a known task.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError
from starlette.responses import JSONResponse, Response, StreamingResponse

from reach_plugins.errors import BusinessError, EntryTooLarge, HandlerFailed, ReachError
from reach_plugins.protocols.a2a_wire import METHODS, Dialect, data_parts, parts_of, texts
from reach_plugins.server.layer import Inbound, Stage
from reach_plugins.stores.budget import DEFAULT_BUDGET, Budget, LruTable, json_size
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.wire.body import WireBody, invalid
from reach_plugins.wire.sse import encode_sse

if TYPE_CHECKING:
    from reach_plugins.agent.face import Handling

CARD_PATH = "/.well-known/agent-card.json"
RPC_PATH = "/a2a"
KIND = "a2a-task"
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = -32700, -32600, -32601, -32602, -32603
TASK_NOT_FOUND, NOT_CANCELABLE = -32001, -32002
_METHOD: dict[str, tuple[Dialect, str]] = {
    method: (dialect, kind) for dialect, methods in METHODS.items() for kind, method in methods.items()
}


class RpcError(Exception):
    """A JSON-RPC error answer."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _state(state: str, dialect: Dialect) -> str:
    return state if dialect == "0.3" else "TASK_STATE_" + state.upper().replace("-", "_")


def _parts(data: Any, dialect: Dialect) -> list[dict[str, Any]]:
    """A result as parts: its text (a string, ``reply_content``, else the JSON), and a data part if structured."""
    text = data if isinstance(data, str) else data.get("reply_content") if isinstance(data, Mapping) else None
    if not isinstance(text, str):
        text = json.dumps(data, ensure_ascii=False, default=str)
    parts: list[dict[str, Any]] = [{"text": text}]
    if not isinstance(data, str) and data is not None:
        parts.append({"data": data})
    if dialect == "0.3":
        return [{"kind": "text" if "text" in part else "data", **part} for part in parts]
    return parts


def _message(text: str, task_id: str, context_id: str, dialect: Dialect) -> dict[str, Any]:
    message: dict[str, Any] = {"messageId": f"{task_id}-status", "taskId": task_id, "contextId": context_id}
    if dialect == "0.3":
        return {**message, "kind": "message", "role": "agent", "parts": [{"kind": "text", "text": text}]}
    return {**message, "role": "ROLE_AGENT", "parts": [{"text": text}]}


@dataclass(frozen=True, slots=True)
class Finished:
    """A task this agent answered (its tasks finish before the answer): what ``GetTask`` reads back."""

    id: str
    context_id: str
    capability: str
    state: Literal["completed", "failed"]
    result: Any = None
    reason: str | None = None
    """Why a failed task failed (its status message)."""

    def artifact(self, dialect: Dialect) -> dict[str, Any]:
        return {"artifactId": f"{self.id}-result", "name": self.capability, "parts": _parts(self.result, dialect)}

    def status(self, dialect: Dialect) -> dict[str, Any]:
        status: dict[str, Any] = {"state": _state(self.state, dialect)}
        if self.reason is not None:
            status["message"] = _message(self.reason, self.id, self.context_id, dialect)
        return status

    def shaped(self, dialect: Dialect) -> dict[str, Any]:
        """The task in ``dialect`` (0.3 names its kind)."""
        task: dict[str, Any] = {"id": self.id, "contextId": self.context_id, "status": self.status(dialect)}
        if self.state == "completed":
            task["artifacts"] = [self.artifact(dialect)]
        return {"kind": "task", **task} if dialect == "0.3" else task


def _tenant(inbound: Inbound) -> str | None:
    """Whose task: the verified token's tenant, else (tokens off) the ``X-Tenant`` the agent serves it as."""
    claims = inbound.caller
    return claims.tenant if claims is not None else inbound.headers.get("x-tenant")


def _bound(scope: Mapping[str, Any]) -> str:
    """The base URL of the address this connection reached (the ASGI ``server``), or ``""`` if it has none."""
    server = scope.get("server")
    if not server or server[1] is None:
        return str(scope.get("root_path", ""))
    host, port = server
    host = f"[{host}]" if ":" in host else host
    return f"{scope.get('scheme', 'http')}://{host}:{port}{scope.get('root_path', '')}"


class A2AServer:
    """The A2A face of one agent: its card, its JSON-RPC endpoint and the tasks it answered."""

    def __init__(self, agent: Handling, *, budget: Budget = DEFAULT_BUDGET) -> None:
        self.agent = agent
        self.tasks: LruTable[Finished] = LruTable(budget, "A2A task")
        """The tasks answered, by their tenant's key; within ``budget``, the least recently used dropped."""

    def card(self, base: str) -> dict[str, Any]:
        url = base.rstrip("/") + RPC_PATH
        skills = [
            {"id": c.name, "name": c.name, "description": c.description or c.name, "tags": c.scope_tags or [c.name]}
            for c in self.agent.capabilities
        ]
        return {
            "name": self.agent.name,
            "description": self.agent.description or f"Reach agent {self.agent.name}",
            "version": "1.0.0",
            "supportedInterfaces": [
                {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
                {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            ],
            "capabilities": {"streaming": True},
            "defaultInputModes": ["text", "application/json"],
            "defaultOutputModes": ["text", "application/json"],
            "skills": skills,
            "url": url,
            "protocolVersion": "0.3.0",
            "preferredTransport": "JSONRPC",
        }

    async def card_route(self, inbound: Inbound) -> Response:
        """The card, at the agent's own URL: never built from the caller's ``Host`` header (anyone can forge it)."""
        return JSONResponse(self.card(self.agent.public_url or _bound(inbound.request.scope)))

    def refuse(self, exc: ReachError, stage: Stage) -> Response:
        """The server layer's refusals as JSON-RPC errors under the error's own status (401/403, 413/408, 400)."""
        return self._error(None, PARSE_ERROR if stage == "parse" else INVALID_REQUEST, exc.message, exc.http_status)

    async def rpc_route(self, inbound: Inbound) -> Response:
        body = inbound.body
        if not isinstance(body, dict) or not isinstance(body.get("method"), str):
            return self._error(None, INVALID_REQUEST, "expected a JSON-RPC request")
        rpc_id, method = body.get("id"), body["method"]
        raw_params = body.get("params")
        params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        if method not in _METHOD:
            return self._error(rpc_id, METHOD_NOT_FOUND, f"method {method!r} is not served")
        dialect, kind = _METHOD[method]
        try:
            if kind == "get":
                task = self._known(params, inbound)
                return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "result": task.shaped(dialect)})
            if kind == "cancel":
                self._known(params, inbound)
                raise RpcError(NOT_CANCELABLE, "the task has finished: it can no longer be cancelled")
            task = await self._run(params, inbound)
        except RpcError as exc:
            return self._error(rpc_id, exc.code, exc.message)
        if kind == "send":
            return self._result(rpc_id, task.shaped(dialect), dialect, "task")
        return StreamingResponse(self._events(rpc_id, task, dialect), media_type="text/event-stream")

    def _known(self, params: Mapping[str, Any], inbound: Inbound) -> Finished:
        """The caller's tenant's task named by ``params.id`` (another tenant's is "no task", as an unknown one)."""
        task_id = params.get("id")
        task = self.tasks.get(ScopedKey.of(_tenant(inbound), KIND, task_id)) if isinstance(task_id, str) else None
        if task is None:
            raise RpcError(TASK_NOT_FOUND, f"no task {task_id!r}")
        return task

    def _payload(self, params: Mapping[str, Any]) -> tuple[str, dict[str, Any], Mapping[str, Any]]:
        """(capability, payload, message) of a send request."""
        message = params.get("message")
        if not isinstance(message, Mapping):
            raise RpcError(INVALID_PARAMS, "params.message is required")
        metadata = {**_mapping(message.get("metadata")), **_mapping(params.get("metadata"))}
        offered = self.agent.capabilities
        name = metadata.get("reach.capability") or (offered[0].name if len(offered) == 1 else None)
        capability = next((c for c in offered if c.name == name), None)
        if capability is None:
            names = ", ".join(c.name for c in offered)
            raise RpcError(INVALID_PARAMS, f"name the skill in metadata 'reach.capability': one of {names}")
        parts = parts_of(message)
        payload: dict[str, Any] = {}
        for value in data_parts(parts):
            if isinstance(value, Mapping):
                payload.update(value)
        text = texts(parts)
        slot = next((n for n in self._text_slots(capability.name) if n not in payload), None)
        if text and slot:
            payload[slot] = text
        return capability.name, payload, message

    def _text_slots(self, name: str) -> list[str]:
        """Where a text part may go: the required string parameters of the schema, else of the handler's signature."""
        handler = self.agent.handler(name)
        schema = handler.capability.params_schema
        if schema is not None:
            properties = schema.get("properties", {})
            return [n for n in schema.get("required", []) if properties.get(n, {}).get("type") == "string"]
        parameters = handler.signature.parameters.values()
        return [p.name for p in parameters if p.name != "ctx" and p.default is inspect.Parameter.empty]

    async def _run(self, params: Mapping[str, Any], inbound: Inbound) -> Finished:
        name, payload, message = self._payload(params)
        given = message.get("contextId")
        context_id = given if isinstance(given, str) and given else uuid.uuid4().hex
        task_id = uuid.uuid4().hex
        request_id = str(message.get("messageId") or task_id)
        try:
            body = WireBody(request_id=request_id, capability=name, payload=payload, session_id=context_id)
        except ValidationError as exc:
            raise RpcError(INVALID_PARAMS, invalid(exc, "message").message) from None
        outcome = await self.agent.handle(body, inbound.headers, inbound.caller)
        error = _mapping(outcome.body.get("error"))
        if outcome.body.get("status") == "success":
            task = Finished(task_id, context_id, name, "completed", result=outcome.body.get("data"))
        elif error.get("type") in (BusinessError.code, HandlerFailed.code):  # it ran: a failed task, never re-run
            task = Finished(task_id, context_id, name, "failed", reason=str(error.get("message") or "failed"))
        else:
            code = INVALID_PARAMS if 400 <= outcome.status < 500 else INTERNAL
            raise RpcError(code, str(error.get("message") or f"the agent answered HTTP {outcome.status}"))
        size = 96 + len(context_id) + len(task.reason or "") + json_size(task.result)
        with contextlib.suppress(EntryTooLarge):  # too large alone: answered, not kept (see the module docstring)
            self.tasks.put(ScopedKey.of(_tenant(inbound), KIND, task_id), task, size)
        return task

    async def _events(self, rpc_id: Any, task: Finished, dialect: Dialect) -> AsyncIterator[bytes]:
        """A finished task as a stream: the task submitted, its artifact, then its final status."""
        ids = {"taskId": task.id, "contextId": task.context_id}
        submitted = {"id": task.id, "contextId": task.context_id, "status": {"state": _state("submitted", dialect)}}
        events: list[tuple[str, dict[str, Any]]] = [("task", submitted)]
        if task.state == "completed":
            events.append(("artifactUpdate", {**ids, "artifact": task.artifact(dialect), "lastChunk": True}))
        events.append(("statusUpdate", {**ids, "status": task.status(dialect), "final": True}))
        for kind, item in events:
            yield encode_sse(json.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": self._wrap(item, kind, dialect)}))

    @staticmethod
    def _wrap(item: dict[str, Any], kind: str, dialect: Dialect) -> dict[str, Any]:
        if dialect == "1.0":
            item = {key: value for key, value in item.items() if key not in ("kind", "final")}
            return {kind: item}
        names = {"task": "task", "artifactUpdate": "artifact-update", "statusUpdate": "status-update"}
        return {**item, "kind": names[kind]}

    def _result(self, rpc_id: Any, item: dict[str, Any], dialect: Dialect, kind: str) -> Response:
        return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "result": self._wrap(item, kind, dialect)})

    @staticmethod
    def _error(rpc_id: Any, code: int, message: str, status: int = 200) -> Response:
        body = {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}
        return JSONResponse(body, status_code=status)
