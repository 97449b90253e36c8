"""The gateway's MCP endpoint (Streamable HTTP, ``/mcp``): a tenant's reachable capabilities as MCP tools and more.

Claude Desktop, Cursor, langchain-mcp-adapters or Dify's MCP client connect
with the tenant's bearer token; ``tools/list`` lists what that tenant may
reach (capabilities by name, descriptions, ``params_schema`` as
``inputSchema``) and ``tools/call`` reaches the capability through the
gateway's forwarder (routing, retries, breakers), answered on an SSE stream
when the client accepts one (progress, log messages and questions to the
client go there: :mod:`~reach_plugins.gateway.mcp_calls`). Resources, resource
templates, prompts and completions come from tagged capabilities
(:mod:`~reach_plugins.gateway.mcp_catalog`). The MCP session is the
conversation: its id is the request's ``session_id``, so affinity keeps a
client on one agent instance; ``DELETE /mcp`` ends a session. Requests
without a session speak the stateless 2026-07-28 wire
(:mod:`~reach_plugins.gateway.mcp_stateless`).

Every request is first checked for DNS rebinding
(:mod:`~reach_plugins.gateway.mcp_origin`).

Sessions are kept under their tenant's :class:`~reach_plugins.stores.keys.ScopedKey`
in an :class:`~reach_plugins.stores.budget.LruTable` within a
:class:`~reach_plugins.stores.budget.Budget` (entries and bytes): a session id
presented by another tenant is unknown (404), as is one pushed out by the bounds.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.responses import Response, StreamingResponse

from reach_plugins.errors import EntryTooLarge, ReachError
from reach_plugins.gateway.mcp_calls import LEVELS, McpSession, Questions, ToolCall, measured, run_call
from reach_plugins.gateway.mcp_catalog import Catalog, card_result, prompt_result, read_result
from reach_plugins.gateway.mcp_origin import foreign
from reach_plugins.gateway.mcp_replay import Replay
from reach_plugins.gateway.mcp_stateless import (
    ERROR_STATUS,
    SERVER_INFO,
    Refusal,
    RequestStates,
    decorated,
    discover,
    envelope,
    input_required,
    is_stateless,
    param_headers,
)
from reach_plugins.model import ReachRequest
from reach_plugins.protocols.mcp_tools import tool_of
from reach_plugins.server.inbound import BodyPlaces, InputLimits
from reach_plugins.server.layer import JSON, Around, Authenticate, Inbound, ServerRoute, Stage
from reach_plugins.stores.budget import DEFAULT_BUDGET, Budget, LruTable
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.wire.headers import SOURCE
from reach_plugins.wire.redact import without_addresses

if TYPE_CHECKING:
    from reach_plugins.server.forwarder import Forwarder
    from reach_plugins.telemetry.metrics import ReachMetrics

VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
"""The handshake revisions served, newest first; an unknown one is answered with the newest."""
SESSION_HEADER = "mcp-session-id"
KIND = "mcp-session"
STREAM_KIND = "mcp-stream"
_STREAM_BYTES = 4096
"""Bytes a running response stream is counted at; once done, at what it recorded (capped by MAX_REPLAY_BYTES)."""
_SESSION_BYTES = 64
"""Estimated bytes of one session entry besides its key."""
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
RESOURCE_NOT_FOUND, INTERNAL_ERROR = -32002, -32603
CAPABILITIES = {
    "tools": {"listChanged": False},
    "resources": {"subscribe": True, "listChanged": False},
    "prompts": {"listChanged": False},
    "logging": {},
    "completions": {},
}


def _response(message: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    return Response(body, status, headers, media_type="application/json")


def _error(rpc_id: Any, code: int, message: str, status: int = 200) -> Response:
    return _response(_fault(rpc_id, code, message), status)


def _refuse(exc: ReachError, stage: Stage) -> Response:
    """The server layer's refusals as JSON-RPC errors under the error's own status (401/403, 413/408, 400)."""
    return _error(None, PARSE_ERROR if stage == "parse" else INVALID_REQUEST, exc.message, exc.http_status)


def _streams(inbound: Inbound) -> bool:
    """The client takes an SSE response stream (every Streamable HTTP client does; a bare JSON POST does not)."""
    return "text/event-stream" in inbound.headers.get("accept", "")


def _sse(frames: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(frames, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _primed(replay: Replay, *, until_poll: bool) -> AsyncIterator[bytes]:
    """A response stream: the priming event (an id, ``retry``, no data), then the replay's frames."""
    yield replay.priming()
    async for frame in replay.follow(-1, until_poll=until_poll):
        yield frame


async def _one(message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield message


def _ok(rpc_id: Any, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": dict(result)}


def _fault(rpc_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}


async def _after(first: dict[str, Any], rest: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    yield first
    async for message in rest:
        yield message


async def _decorated(method: str, messages: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    """The stateless wire's shape on the response (notifications and errors pass as they are)."""
    async for message in messages:
        if isinstance(message.get("result"), dict) and "id" in message and "method" not in message:
            message = {**message, "result": decorated(method, message["result"])}
        yield message


@dataclass(frozen=True, slots=True)
class _Asked:
    """Who asked what, through which wire: the request, its session (none on the stateless wire), its view."""

    inbound: Inbound
    session: str | None
    key: ScopedKey | None
    state: McpSession
    stateless: bool

    @property
    def tenant(self) -> str | None:
        tenant: str | None = self.inbound.caller
        return tenant

    @property
    def source(self) -> str | None:
        client = self.inbound.request.client
        return str(client.host) if client else None

    @property
    def streaming(self) -> bool:
        return _streams(self.inbound)


class McpEndpoint:
    """MCP over Streamable HTTP in front of one gateway's :class:`~reach_plugins.server.forwarder.Forwarder`."""

    def __init__(
        self, forwarder: Forwarder, *, budget: Budget = DEFAULT_BUDGET, metrics: ReachMetrics | None = None
    ) -> None:
        self.forwarder = forwarder
        self.metrics = metrics
        """Where tool calls and closed sessions are counted (the gateway's ``/metrics``), if anywhere."""
        self.sessions: LruTable[McpSession] = LruTable(budget, "MCP session")
        """The open MCP sessions, each under the key of the tenant that opened it."""
        self.questions = Questions()
        self.states = RequestStates()
        self.replays: LruTable[Replay] = LruTable(budget, "MCP response stream")
        """Each session's response streams, kept for ``GET`` + ``Last-Event-ID`` (mcp_replay)."""

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
        """``DELETE /mcp`` ends a session; ``GET /mcp`` resumes a response stream (``Last-Event-ID``); the
        standalone server stream is not served (405)."""
        if (why := foreign(inbound)) is not None:
            return _error(None, INVALID_REQUEST, why, 403)
        session, unknown = self._session(inbound)
        if unknown is not None:
            return unknown
        if inbound.request.method == "GET":
            resumed = self._resume(inbound, session) if session is not None else None
            return resumed or Response(status_code=405, headers={"Allow": "POST, DELETE"})
        if session is not None and self.sessions.pop(ScopedKey.of(inbound.caller, KIND, session)) is not None:
            if self.metrics is not None:
                self.metrics.session_closed()
            self._close_calls(ScopedKey.of(inbound.caller, STREAM_KIND, f"{session}/"))
        return Response(status_code=200)

    def _close_calls(self, prefix: ScopedKey) -> None:
        """A closed session stops its calls still running (the agent sees the caller go away)."""
        for key in self.replays:
            if key.tenant == prefix.tenant and key.kind == prefix.kind and key.id.startswith(prefix.id):
                replay = self.replays.pop(key)
                if replay is not None and replay.task is not None:
                    replay.task.cancel()

    async def post(self, inbound: Inbound) -> Response:
        """One JSON-RPC request, notification or response (the client's answer to a question)."""
        if (why := foreign(inbound)) is not None:
            return _error(None, INVALID_REQUEST, why, 403)
        session, unknown = self._session(inbound)
        if unknown is not None:
            return unknown
        message = inbound.body
        if isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message):
            if session is not None:
                self.questions.answer(ScopedKey.of(inbound.caller, KIND, session), message)
            return Response(status_code=202)
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return _error(None, INVALID_REQUEST, "expected one JSON-RPC request or notification", 400)
        if "id" not in message:
            return Response(status_code=202)
        raw_params = message.get("params")
        params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        method, rpc_id = message["method"], message["id"]
        if session is not None:
            key = ScopedKey.of(inbound.caller, KIND, session)
            asked = _Asked(inbound, session, key, self.sessions.get(key) or McpSession(), stateless=False)
        elif method == "initialize" and not is_stateless(params):
            return self._initialize(rpc_id, params, inbound.caller)
        else:
            state = envelope(method, params, inbound.headers)
            if isinstance(state, Refusal):
                return _response({"jsonrpc": "2.0", "id": rpc_id, "error": state.error()}, state.status)
            asked = _Asked(inbound, None, None, state, stateless=True)
        answer = await self._dispatch(method, rpc_id, params, asked)
        if isinstance(answer, Refusal):
            return _response({"jsonrpc": "2.0", "id": rpc_id, "error": answer.error()}, answer.status)
        messages = _one(answer) if isinstance(answer, dict) else answer
        if asked.stateless:
            messages = _decorated(method, messages)
            first = await anext(messages)
            code = first.get("error", {}).get("code") if "method" not in first else None
            if code in ERROR_STATUS:
                return _response(first, ERROR_STATUS[code])
            messages = _after(first, messages)
        if asked.streaming:
            return self._stream(messages, asked, keep=not isinstance(answer, dict))
        said = [message async for message in messages]
        return _response(said[-1])

    async def _dispatch(
        self, method: str, rpc_id: Any, params: dict[str, Any], asked: _Asked
    ) -> dict[str, Any] | AsyncIterator[dict[str, Any]] | Refusal:
        """The answer to one request: a message, the messages of a call, or a refusal of the stateless wire."""
        if method == "ping":
            return _ok(rpc_id, {})
        if method == "logging/setLevel":
            return self._set_level(rpc_id, params, asked)
        if method in ("resources/subscribe", "resources/unsubscribe"):
            return _ok(rpc_id, {})
        if method == "server/discover":
            return _ok(rpc_id, discover())
        catalog = Catalog.of(self.forwarder.visible(asked.tenant, asked.source))
        if method == "tools/call":
            return self._call(rpc_id, params, asked, catalog)
        if method == "tools/list":
            return _ok(rpc_id, {"tools": catalog.tool_list()})
        if method == "resources/list":
            return _ok(rpc_id, {"resources": catalog.resource_list()})
        if method == "resources/templates/list":
            return _ok(rpc_id, {"resourceTemplates": catalog.template_list()})
        if method == "prompts/list":
            return _ok(rpc_id, {"prompts": catalog.prompt_list()})
        if method == "resources/read":
            return await self._read(rpc_id, params, catalog, asked)
        if method == "prompts/get":
            return await self._prompt(rpc_id, params, catalog, asked)
        if method == "completion/complete":
            return self._complete(rpc_id, params, catalog)
        return _fault(rpc_id, METHOD_NOT_FOUND, f"method {method!r} is not served by the reach gateway")

    def _stream(self, messages: AsyncIterator[dict[str, Any]], asked: _Asked, *, keep: bool) -> Response:
        """The answer as a response stream; a call's, on the session wire, is kept so ``GET`` can resume it."""
        replay = Replay().start(messages)
        if asked.session is None or not keep:
            return _sse(_primed(replay, until_poll=False))
        key = ScopedKey.of(asked.tenant, STREAM_KIND, f"{asked.session}/{replay.stream}")
        self.replays.put(key, replay, _STREAM_BYTES)
        if replay.task is not None:
            replay.task.add_done_callback(lambda _: self._weigh(key, replay))
        return _sse(_primed(replay, until_poll=True))

    def _weigh(self, key: ScopedKey, replay: Replay) -> None:
        """A finished stream counts in the budget with the bytes it recorded (dropped when over the bound)."""
        if self.replays.peek(key) is not replay:
            return
        try:
            self.replays.put(key, replay, replay.size)
        except EntryTooLarge:
            self.replays.pop(key)

    def _resume(self, inbound: Inbound, session: str) -> Response | None:
        """``GET`` with ``Last-Event-ID``: the rest of the response stream it names, or None when none is kept."""
        last = inbound.headers.get("last-event-id", "")
        stream = last.rpartition("-")[0]
        replay = self.replays.get(ScopedKey.of(inbound.caller, STREAM_KIND, f"{session}/{stream}"))
        after = replay.resume_from(last) if replay is not None else None
        if replay is None or after is None:
            return None
        return _sse(replay.follow(after, until_poll=False))

    def _initialize(self, rpc_id: Any, params: dict[str, Any], tenant: str | None) -> Response:
        asked = params.get("protocolVersion")
        version = asked if asked in VERSIONS else VERSIONS[0]
        declared = params.get("capabilities")
        session = secrets.token_hex(16)
        state = McpSession(capabilities=frozenset(declared) if isinstance(declared, dict) else frozenset())
        self.sessions.put(ScopedKey.of(tenant, KIND, session), state, _SESSION_BYTES)
        result = {"protocolVersion": version, "capabilities": CAPABILITIES, "serverInfo": SERVER_INFO}
        return _response(_ok(rpc_id, result), headers={"Mcp-Session-Id": session})

    def _set_level(self, rpc_id: Any, params: dict[str, Any], asked: _Asked) -> dict[str, Any]:
        level = params.get("level")
        if level not in LEVELS or asked.key is None:
            return _fault(rpc_id, INVALID_PARAMS, f"logging/setLevel needs 'level', one of {list(LEVELS)}")
        self.sessions.put(asked.key, McpSession(asked.state.capabilities, str(level)), _SESSION_BYTES)
        return _ok(rpc_id, {})

    def _answers(self, params: dict[str, Any], asked: _Asked) -> dict[str, Any] | Refusal:
        """What a stateless request brings back for the agent's questions: ``inputResponses`` and the
        ``requestState`` the gateway signed (refused when it did not sign it)."""
        if not asked.stateless:
            return {}
        brought: dict[str, Any] = {}
        responses = params.get("inputResponses")
        if responses is not None:
            if not isinstance(responses, dict) or not all(isinstance(v, dict) for v in responses.values()):
                return Refusal(INVALID_PARAMS, "inputResponses must map each question's key to its result object")
            brought["inputResponses"] = responses
        if "requestState" in params:
            opened = self.states.open(params["requestState"])
            if opened is None:
                return Refusal(
                    INVALID_PARAMS, "Invalid or expired requestState", data={"reason": "invalid_request_state"}
                )
            brought["requestState"] = opened
        return brought

    def _hand_back(self, asked: _Asked) -> Callable[[Any, Mapping[str, Any]], dict[str, Any]]:
        """How the stateless wire returns an agent's questions: an ``input_required`` result, or -32021."""

        def hand_back(rpc_id: Any, reply: Mapping[str, Any]) -> dict[str, Any]:
            state = reply.get("requestState")
            signed = self.states.sign(str(state)) if state is not None else None
            shaped = input_required(reply["inputRequests"], asked.state, signed)
            if isinstance(shaped, Refusal):
                return {"jsonrpc": "2.0", "id": rpc_id, "error": shaped.error()}
            return _ok(rpc_id, shaped)

        return hand_back

    def _call(
        self, rpc_id: Any, params: dict[str, Any], asked: _Asked, catalog: Catalog
    ) -> AsyncIterator[dict[str, Any]] | dict[str, Any] | Refusal:
        name, arguments = params.get("name"), params.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return _fault(rpc_id, INVALID_PARAMS, "tools/call needs 'name' (a string) and 'arguments' (an object)")
        brought = self._answers(params, asked)
        if isinstance(brought, Refusal):
            return brought
        tool = catalog.tools.get(name)
        if asked.stateless and tool is not None:
            mismatch = param_headers(tool.get("params_schema"), arguments, asked.inbound.headers)
            if mismatch is not None:
                return mismatch
        meta = params.get("_meta")
        call = ToolCall(
            rpc_id=rpc_id,
            name=name,
            arguments={**arguments, **brought},
            tenant=asked.tenant,
            session=asked.session,
            source=asked.source,
            progress=meta.get("progressToken") if isinstance(meta, dict) else None,
            output_schema=tool is not None and "outputSchema" in tool_of(tool),
        )
        try:
            call.request(call.arguments)
        except ValueError as exc:
            return _fault(rpc_id, INVALID_PARAMS, f"tools/call: {exc}")
        live = asked.streaming and not asked.stateless
        questions, key = (self.questions, asked.key) if live else (None, None)
        hand_back = self._hand_back(asked) if asked.stateless else None
        messages = run_call(self.forwarder, call, asked.state, questions, key, hand_back)
        return messages if self.metrics is None else measured(messages, name, self.metrics)

    async def _reach(self, asked: _Asked, capability: str, payload: dict[str, Any]) -> tuple[Any, str | None]:
        """Reach ``capability`` for a read or a prompt: its data, or why it failed."""
        metadata = {SOURCE: asked.source} if asked.source else {}
        request = ReachRequest(
            capability=capability, payload=payload, tenant=asked.tenant, session_id=asked.session, metadata=metadata
        )
        try:
            response = await self.forwarder.run(request)
        except ReachError as exc:
            return None, without_addresses(exc.message)
        if response.status != "success":
            failed = response.error.message if response.error else f"the reach ended {response.status}"
            return None, without_addresses(failed)
        return response.data, None

    async def _read(self, rpc_id: Any, params: dict[str, Any], catalog: Catalog, asked: _Asked) -> dict[str, Any]:
        uri = params.get("uri")
        if not isinstance(uri, str):
            return _fault(rpc_id, INVALID_PARAMS, "resources/read needs 'uri' (a string)")
        if uri in catalog.cards:
            return _ok(rpc_id, card_result(uri, catalog.cards[uri]))
        found = catalog.resolve(uri)
        if found is None:
            code = INVALID_PARAMS if asked.stateless else RESOURCE_NOT_FOUND
            error = {"code": code, "message": f"no resource {uri!r}; resources/list names them", "data": {"uri": uri}}
            return {"jsonrpc": "2.0", "id": rpc_id, "error": error}
        capability, payload = found
        data, failed = await self._reach(asked, capability["name"], dict(payload))
        if failed is not None:
            return _fault(rpc_id, INTERNAL_ERROR, f"reading {uri!r} failed: {failed}")
        return _ok(rpc_id, read_result(uri, data))

    async def _prompt(
        self, rpc_id: Any, params: dict[str, Any], catalog: Catalog, asked: _Asked
    ) -> dict[str, Any] | Refusal:
        name, arguments = params.get("name"), params.get("arguments") or {}
        capability = catalog.prompts.get(name) if isinstance(name, str) else None
        if capability is None or not isinstance(arguments, dict):
            return _fault(rpc_id, INVALID_PARAMS, f"no prompt {name!r} (prompts/list names them; arguments: an object)")
        missing = [arg for arg in catalog.required(capability) if arg not in arguments]
        if missing:
            return _fault(rpc_id, INVALID_PARAMS, f"prompt {name!r} needs the arguments {missing}")
        brought = self._answers(params, asked)
        if isinstance(brought, Refusal):
            return brought
        data, failed = await self._reach(asked, capability["name"], {**arguments, **brought})
        if failed is not None:
            return _fault(rpc_id, INTERNAL_ERROR, f"prompt {name!r} failed: {failed}")
        if asked.stateless and isinstance(data, Mapping) and isinstance(data.get("inputRequests"), Mapping):
            return self._hand_back(asked)(rpc_id, data)
        return _ok(rpc_id, prompt_result(capability, data))

    def _complete(self, rpc_id: Any, params: dict[str, Any], catalog: Catalog) -> dict[str, Any]:
        ref, argument = params.get("ref"), params.get("argument")
        if not isinstance(ref, dict) or not isinstance(argument, dict) or not isinstance(argument.get("name"), str):
            return _fault(rpc_id, INVALID_PARAMS, "completion/complete needs 'ref' and 'argument' ({name, value})")
        values = catalog.complete(ref, argument["name"], str(argument.get("value", "")))
        return _ok(rpc_id, {"completion": {"values": values, "total": len(values), "hasMore": False}})
