"""One ``tools/call`` through the forwarder, as the messages ``/mcp`` sends back: notifications, questions, result.

The capability is reached as a stream, so a streaming agent's progress shows
while it runs. A chunk the agent yields that is an MCP notification
(``{"method": "notifications/progress" | "notifications/message", "params":
...}``) is relayed to the client (progress only when the client gave a
``progressToken``, log messages only at or above the session's
``logging/setLevel``); a ``reach/poll`` chunk hands the client over to
polling (:mod:`~reach_plugins.gateway.mcp_replay`); the other chunks are the
result (strings joined, one chunk as it is, several as a list).

An agent that needs the client's input (elicitation, sampling, roots) answers
with ``{"inputRequests": {KEY: {"method": ..., "params": ...}}}``, the shape of
MCP's multi-round-trip results. The gateway asks the client each question on
the response stream, waits for the answers (POSTed back to ``/mcp``), and
reaches the capability again with ``inputResponses`` (``{KEY: result}``) added
to the arguments; the agent itself stays stateless. A question the client did
not declare the capability for is not asked: the call ends with a tool error
naming it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reach_plugins.errors import ReachError
from reach_plugins.gateway.mcp_replay import POLL
from reach_plugins.media import MediaPart
from reach_plugins.model import ReachRequest
from reach_plugins.protocols.mcp_tools import tool_result
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.wire.headers import SOURCE
from reach_plugins.wire.redact import without_addresses

if TYPE_CHECKING:
    from reach_plugins.server.forwarder import Forwarder
    from reach_plugins.telemetry.metrics import ReachMetrics

LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""MCP log levels, least severe first."""
NEEDS = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling", "roots/list": "roots"}
"""Server-to-client requests and the client capability each one needs."""
MAX_ROUNDS = 8
"""Rounds of questions one call may ask before it ends as a tool error (an agent that never stops asking)."""
ANSWER_SECONDS = 300.0
"""How long the gateway waits for the client to answer one question."""


@dataclass(frozen=True, slots=True)
class McpSession:
    """What the gateway keeps of one MCP session: the client's declared capabilities and its log level."""

    capabilities: frozenset[str] = frozenset()
    level: str | None = "debug"
    """Log messages below it are not relayed; ``None``: none are (the stateless wire's default)."""


class Questions:
    """Server-to-client requests awaiting the client's answer, keyed by the tenant's session key and request id."""

    def __init__(self) -> None:
        self._waiting: dict[tuple[ScopedKey, str], asyncio.Future[dict[str, Any]]] = {}

    def ask(self, session: ScopedKey) -> tuple[str, asyncio.Future[dict[str, Any]]]:
        rpc_id = f"reach-{secrets.token_hex(8)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[(session, rpc_id)] = future
        return rpc_id, future

    def forget(self, session: ScopedKey, rpc_id: str) -> None:
        self._waiting.pop((session, rpc_id), None)

    def answer(self, session: ScopedKey, message: Mapping[str, Any]) -> bool:
        """Hand the client's JSON-RPC response to the call that asked; False when nobody of this session asked."""
        future = self._waiting.pop((session, str(message.get("id"))), None)
        if future is None or future.done():
            return False
        future.set_result(dict(message))
        return True


def _notification(chunk: Any, progress: Any, level: str | None) -> dict[str, Any] | None:
    """The notification to relay for an agent's chunk (``{}`` to drop it), or None when it is part of the result."""
    if not isinstance(chunk, Mapping) or not str(chunk.get("method", "")).startswith("notifications/"):
        return None
    raw = chunk.get("params")
    params = dict(raw) if isinstance(raw, Mapping) else {}
    if chunk["method"] == "notifications/progress":
        if progress is None:
            return {}
        params["progressToken"] = progress
    if chunk["method"] == "notifications/message":
        said = str(params.get("level", "info"))
        if level not in LEVELS or said not in LEVELS or LEVELS.index(said) < LEVELS.index(level):
            return {}
    return {"jsonrpc": "2.0", "method": chunk["method"], "params": params}


def _joined(chunks: list[Any]) -> Any:
    if len(chunks) == 1:
        return chunks[0]
    if chunks and all(isinstance(chunk, str) for chunk in chunks):
        return "".join(chunks)
    return chunks


def _failed(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": without_addresses(text)}], "isError": True}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One ``tools/call`` as the gateway runs it."""

    rpc_id: Any
    name: str
    arguments: dict[str, Any]
    tenant: str | None
    session: str | None
    source: str | None
    progress: Any = None
    output_schema: bool = False

    def request(self, arguments: dict[str, Any]) -> ReachRequest:
        metadata = {SOURCE: self.source} if self.source else {}
        return ReachRequest(
            capability=self.name,
            payload=arguments,
            tenant=self.tenant,
            session_id=self.session,
            metadata=metadata,
        )


async def run_call(
    forwarder: Forwarder,
    call: ToolCall,
    state: McpSession,
    questions: Questions | None,
    key: ScopedKey | None,
    hand_back: Callable[[Any, Mapping[str, Any]], dict[str, Any]] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC messages of one call, the response last.

    Without ``questions`` (a JSON answer, no stream) nothing can be asked of the client. With ``hand_back`` (the
    stateless wire) the agent's questions are not asked: ``hand_back(rpc_id, reply)`` is the response that
    returns them.
    """
    arguments = call.arguments
    for _ in range(MAX_ROUNDS):
        chunks: list[Any] = []
        media: list[MediaPart] = []
        try:
            async with aclosing(forwarder.stream(call.request(arguments))) as events:
                async for event in events:
                    if event.kind == "error":
                        why = event.error.message if event.error else "the reach failed"
                        yield _response(call.rpc_id, _failed(why))
                        return
                    if event.media is not None:
                        media.append(event.media)
                    if event.kind != "data":
                        continue
                    if isinstance(event.data, Mapping) and event.data.get("method") == POLL:
                        if questions is not None:
                            yield dict(event.data)
                        continue
                    note = _notification(event.data, call.progress, state.level)
                    if note is None:
                        chunks.append(event.data)
                    elif note:
                        yield note
        except ReachError as exc:
            yield _response(call.rpc_id, _failed(exc.message))
            return
        data = _joined(chunks)
        asked = data.get("inputRequests") if isinstance(data, Mapping) else None
        if not isinstance(asked, Mapping) or not asked:
            yield _response(call.rpc_id, tool_result(data, output_schema=call.output_schema, media=media))
            return
        if hand_back is not None:
            yield hand_back(call.rpc_id, data)
            return
        answers: dict[str, Any] = {}
        problems: list[str] = []
        async for message in _ask(asked, state, questions, key, answers, problems):
            yield message
        if problems:
            yield _response(call.rpc_id, _failed(f"{call.name!r} needs input the client could not give: {problems[0]}"))
            return
        carried = {"requestState": data["requestState"]} if isinstance(data.get("requestState"), str) else {}
        arguments = {**call.arguments, "inputResponses": answers, **carried}
    yield _response(call.rpc_id, _failed(f"{call.name!r} asked for input more than {MAX_ROUNDS} times"))


async def measured(
    messages: AsyncIterator[dict[str, Any]], tool: str, metrics: ReachMetrics
) -> AsyncIterator[dict[str, Any]]:
    """The messages of one ``tools/call`` of ``tool``, counted as the dashboard charts them: the tool route (a tool
    is a capability by its exact name here), its ``gen_ai.execute_tool.duration`` and a cancellation (the
    session closed while it ran)."""
    metrics.tool_route(tool, "exact", remote=True)
    started, error = time.perf_counter(), None
    try:
        async for message in messages:
            result = message.get("result")
            if "id" in message and isinstance(result, Mapping) and result.get("isError"):
                error = "tool_error"
            yield message
    except asyncio.CancelledError:
        error = "cancelled"
        metrics.cancellation(tool)
        raise
    finally:
        metrics.tool_call(tool, time.perf_counter() - started, error)


async def _ask(
    asked: Mapping[str, Any],
    state: McpSession,
    questions: Questions | None,
    key: ScopedKey | None,
    answers: dict[str, Any],
    problems: list[str],
) -> AsyncIterator[dict[str, Any]]:
    """Send each question and put each answer's result in ``answers``; on the first one that cannot be asked or
    answered, stop with the reason in ``problems``."""
    for name, question in asked.items():
        method = question.get("method") if isinstance(question, Mapping) else None
        needed = NEEDS.get(str(method))
        if needed is None or needed not in state.capabilities:
            problems.append(f"the client did not declare the {needed or method!r} capability")
            return
        if questions is None or key is None:
            problems.append("questions need a session and a response stream (Accept: text/event-stream)")
            return
        rpc_id, future = questions.ask(key)
        params = question.get("params")
        yield {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params if isinstance(params, dict) else {}}
        try:
            reply = await asyncio.wait_for(future, ANSWER_SECONDS)
        except TimeoutError:
            problems.append(f"no answer to {method} within {ANSWER_SECONDS:.0f} s")
            return
        finally:
            questions.forget(key, rpc_id)
        if "result" not in reply:
            problems.append(f"{method} failed: {reply.get('error')}")
            return
        answers[str(name)] = reply["result"]


def _response(rpc_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "result": result}
