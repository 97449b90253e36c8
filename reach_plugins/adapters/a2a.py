"""``a2a`` agents (A2A 0.3, JSON-RPC binding): ``message/send`` and ``message/stream``.

The JSON-RPC URL comes from the agent card at ``/.well-known/agent-card.json``
(read once per endpoint), or from ``protocol_options.url``. Replies — a
``Message`` or a ``Task`` — are normalised to ``reply_content`` (the text
parts), ``tool_calls`` (always empty) and ``raw_meta`` (ids, state, data parts).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin

from reach_plugins.adapters.base import (
    TEXT_FIELDS,
    EndsOnce,
    HttpRequest,
    HttpResponse,
    decode_json,
    encode_json,
    endpoint_url,
    failure,
    http_failure,
    invalid,
    list_at,
    mapping_at,
    payload_text,
    reach_headers,
    success,
)
from reach_plugins.adapters.sse import SseEvent
from reach_plugins.model import ErrorInfo
from reach_plugins.transport import Call, Reply, StreamEvent

CARD_PATH = "/.well-known/agent-card.json"
FAILED_STATES = frozenset({"failed", "rejected", "canceled"})
FINAL_STATES = FAILED_STATES | {"completed", "input-required", "auth-required"}
INTERNAL_ERROR = -32603


def message_parts(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A text part for the user's text, a data part for everything else in the payload."""
    text = payload_text(payload)
    source = next((name for name in TEXT_FIELDS if isinstance(payload.get(name), str)), "messages")
    parts: list[dict[str, Any]] = [{"kind": "text", "text": text}] if text is not None else []
    rest = {key: value for key, value in payload.items() if key != source}
    if rest or not parts:
        parts.append({"kind": "data", "data": rest})
    return parts


def _parts(container: Any) -> list[Mapping[str, Any]]:
    parts = container.get("parts") if isinstance(container, Mapping) else None
    return [part for part in parts if isinstance(part, Mapping)] if isinstance(parts, list) else []


def _texts(parts: list[Mapping[str, Any]]) -> str:
    return "".join(str(part.get("text", "")) for part in parts if part.get("kind") == "text")


def _data(parts: list[Mapping[str, Any]]) -> list[Any]:
    return [part.get("data") for part in parts if part.get("kind") == "data"]


def _task_parts(task: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    parts = [part for artifact in list_at(task, "artifacts") for part in _parts(artifact)]
    return parts or _parts(mapping_at(task, "status").get("message"))


def _state(item: Mapping[str, Any]) -> str:
    return str(mapping_at(item, "status").get("state", ""))


def _rpc_error(raw: Any) -> ErrorInfo:
    code = raw.get("code") if isinstance(raw, Mapping) else None
    message = raw.get("message") if isinstance(raw, Mapping) else None
    kind = "transient" if code == INTERNAL_ERROR else "business"
    return ErrorInfo(type=kind, message=f"A2A error {code}: {message or 'no message'}")


class A2AAdapter:
    """Client side of an A2A agent."""

    protocol = "a2a"

    def discovery(self, call: Call) -> HttpRequest | None:
        if "url" in call.agent.protocol_options:
            return None
        path = str(call.agent.protocol_options.get("card_path", CARD_PATH))
        return HttpRequest("GET", endpoint_url(call, path), {"Accept": "application/json"})

    def discovered(self, call: Call, response: HttpResponse) -> Any:
        if response.status != 200:
            raise invalid(call, f"no agent card: HTTP {response.status} at {CARD_PATH}")
        card = decode_json(call, response.body)
        if not isinstance(card, Mapping) or not isinstance(card.get("url"), str):
            raise invalid(call, "the agent card has no 'url'")
        return urljoin(call.instance.endpoint.rstrip("/") + "/", card["url"])

    def build(self, call: Call, *, stream: bool = False, discovered: Any = None) -> HttpRequest:
        request = call.request
        message: dict[str, Any] = {
            "kind": "message",
            "role": "user",
            "messageId": request.request_id,
            "parts": message_parts(request.payload),
        }
        if request.session_id:
            message["contextId"] = request.session_id
        body = {
            "jsonrpc": "2.0",
            "id": request.request_id,
            "method": "message/stream" if stream else "message/send",
            "params": {
                "message": message,
                "configuration": {"blocking": True},
                "metadata": {"reach.capability": request.capability, "reach.action": request.action},
            },
        }
        url = discovered or endpoint_url(call, str(call.agent.protocol_options.get("url", "/")))
        accept = "text/event-stream" if stream else "application/json"
        return HttpRequest("POST", url, reach_headers(call, accept=accept), encode_json(body))

    def parse(self, call: Call, response: HttpResponse) -> Reply:
        if not 200 <= response.status < 300:
            return http_failure(call, response)
        body = decode_json(call, response.body)
        if not isinstance(body, Mapping) or not ("result" in body or "error" in body):
            raise invalid(call, "expected a JSON-RPC response with 'result' or 'error'")
        if "error" in body:
            return failure(call, _rpc_error(body["error"]), response.status)
        result = body["result"]
        kind = result.get("kind") if isinstance(result, Mapping) else None
        if kind == "message":
            parts = _parts(result)
            meta = {"kind": "message", "message_id": result.get("messageId"), "context_id": result.get("contextId")}
            return success(call, self._normalised(parts, meta), response.status)
        if kind == "task":
            state, parts = _state(result), _task_parts(result)
            if state in FAILED_STATES:
                return failure(call, ErrorInfo(type="business", message=_texts(parts) or f"A2A task {state}"))
            meta = {"kind": "task", "task_id": result.get("id"), "context_id": result.get("contextId"), "state": state}
            return success(call, self._normalised(parts, meta), response.status)
        raise invalid(call, f"expected a Message or a Task result, got kind {kind!r}")

    @staticmethod
    def _normalised(parts: list[Mapping[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
        data = _data(parts)
        if data:
            meta["data"] = data
        return {"reply_content": _texts(parts), "tool_calls": [], "raw_meta": meta}

    def decoder(self, call: Call) -> A2AStreamDecoder:
        return A2AStreamDecoder(call)


class A2AStreamDecoder(EndsOnce):
    """``message/stream`` events (message, task, status-update, artifact-update) into stream events."""

    def feed(self, event: SseEvent) -> list[StreamEvent]:
        if self._done:
            return []
        try:
            body = json.loads(event.data)
        except ValueError:
            raise invalid(self._call, f"a stream event is not JSON ({event.data[:80]!r})") from None
        if isinstance(body, Mapping) and "error" in body:
            return self._finish(StreamEvent("error", error=_rpc_error(body["error"])))
        result = body.get("result") if isinstance(body, Mapping) else None
        if not isinstance(result, Mapping):
            raise invalid(self._call, "a stream event has no 'result'")
        kind = result.get("kind")
        if kind == "artifact-update":
            parts = _parts(result.get("artifact"))
            meta = {"kind": kind, "task_id": result.get("taskId"), "last_chunk": result.get("lastChunk")}
            return [StreamEvent("data", A2AAdapter._normalised(parts, meta))] if parts else []
        if kind == "message":
            data = A2AAdapter._normalised(_parts(result), {"kind": kind, "message_id": result.get("messageId")})
            return [StreamEvent("data", data), *self._finish(StreamEvent("end"))]
        state = _state(result)
        if state in FAILED_STATES:
            text = _texts(_parts(mapping_at(result, "status").get("message"))) or f"A2A task {state}"
            return self._finish(StreamEvent("error", error=ErrorInfo(type="business", message=text)))
        if state in FINAL_STATES or result.get("final") is True:
            return self._finish(StreamEvent("end"))
        return []

    def _cut(self) -> str:
        return f"the A2A stream from instance {self._call.instance.instance_id} was cut"
