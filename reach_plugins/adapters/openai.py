"""``openai-compatible`` agents: a chat-completions request in, ``reply_content``/``tool_calls``/``raw_meta`` out.

The request's messages come from ``payload["messages"]``; failing that, from
the first text field (``input``, ``query``, ``message``, ``prompt``,
``question``, ``text``) as one user message; failing that, the payload as JSON
text. ``protocol_options``: ``path`` (default ``/chat/completions``), ``model``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from reach_plugins.adapters.base import (
    EndsOnce,
    HttpRequest,
    HttpResponse,
    NoDiscovery,
    decode_json,
    encode_json,
    endpoint_url,
    error_info,
    failure,
    http_failure,
    invalid,
    mapping_at,
    payload_text,
    reach_headers,
    success,
)
from reach_plugins.adapters.sse import SseEvent
from reach_plugins.transport import Call, Reply, StreamEvent

PASSTHROUGH = ("tools", "tool_choice", "temperature", "top_p", "max_tokens", "stop", "response_format", "seed", "user")


def chat_messages(payload: Mapping[str, Any]) -> list[Any]:
    messages = payload.get("messages")
    if isinstance(messages, list) and messages:
        return messages
    text = payload_text(payload)
    if text is None:
        text = json.dumps(dict(payload), ensure_ascii=False)
    return [{"role": "user", "content": text}]


def text_of(value: Any) -> str | None:
    """A content field as text: a string, or the joined ``text`` of a list of parts."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [str(part["text"]) for part in value if isinstance(part, Mapping) and "text" in part]
        return "".join(parts) if parts else None
    return None


def tool_calls_of(raw: Any) -> list[dict[str, Any]]:
    """OpenAI tool calls as ``{"id", "name", "arguments"}``, arguments parsed when they are JSON."""
    calls: list[dict[str, Any]] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, Mapping):
            continue
        function = mapping_at(item, "function")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments)
        call: dict[str, Any] = {"id": item.get("id"), "name": function.get("name"), "arguments": arguments}
        if "index" in item:
            call["index"] = item["index"]
        calls.append(call)
    return calls


def _meta(body: Mapping[str, Any], choice: Mapping[str, Any]) -> dict[str, Any]:
    meta = {key: body[key] for key in ("id", "model", "created", "usage", "system_fingerprint") if key in body}
    meta["finish_reason"] = choice.get("finish_reason")
    return meta


def _first_choice(body: Any) -> Mapping[str, Any] | None:
    choices = body.get("choices") if isinstance(body, Mapping) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        return choices[0]
    return None


class OpenAIAdapter(NoDiscovery):
    """Client side of an OpenAI-compatible chat-completions endpoint."""

    protocol = "openai-compatible"

    def build(self, call: Call, *, stream: bool = False, discovered: Any = None) -> HttpRequest:
        options = call.agent.protocol_options
        payload = call.request.payload
        body: dict[str, Any] = {
            "model": payload.get("model") or options.get("model") or call.agent.name,
            "messages": chat_messages(payload),
        }
        body.update({key: payload[key] for key in PASSTHROUGH if key in payload})
        if stream:
            body["stream"] = True
        accept = "text/event-stream" if stream else "application/json"
        url = endpoint_url(call, str(options.get("path", "/chat/completions")))
        return HttpRequest("POST", url, reach_headers(call, accept=accept), encode_json(body))

    def parse(self, call: Call, response: HttpResponse) -> Reply:
        if not 200 <= response.status < 300:
            return http_failure(call, response)
        body = decode_json(call, response.body)
        if isinstance(body, Mapping) and "error" in body:
            return failure(call, error_info(body["error"], "transient", "the agent replied with an error"))
        choice = _first_choice(body)
        message = choice.get("message") if choice else None
        if choice is None or not isinstance(message, Mapping):
            raise invalid(call, "expected choices[0].message in a chat-completions reply")
        content = text_of(message.get("content"))
        tool_calls = tool_calls_of(message.get("tool_calls"))
        if content is None and not tool_calls:
            raise invalid(call, "choices[0].message has neither 'content' nor 'tool_calls'")
        return success(
            call,
            {"reply_content": content or "", "tool_calls": tool_calls, "raw_meta": _meta(body, choice)},
            response.status,
        )

    def decoder(self, call: Call) -> OpenAIStreamDecoder:
        return OpenAIStreamDecoder(call)


class OpenAIStreamDecoder(EndsOnce):
    """``data: {chunk}`` frames into ``reply_content``/``tool_calls`` deltas; ``data: [DONE]`` ends."""

    def __init__(self, call: Call) -> None:
        super().__init__(call)
        self._finished = False

    def feed(self, event: SseEvent) -> list[StreamEvent]:
        if self._done:
            return []
        if event.data.strip() == "[DONE]":
            return self._finish(StreamEvent("end"))
        try:
            chunk = json.loads(event.data)
        except ValueError:
            raise invalid(self._call, f"a stream chunk is not JSON ({event.data[:80]!r})") from None
        if isinstance(chunk, Mapping) and "error" in chunk:
            failed = error_info(chunk["error"], "transient", "the agent's stream failed")
            return self._finish(StreamEvent("error", error=failed))
        choice = _first_choice(chunk)
        if choice is None:
            return []
        delta = mapping_at(choice, "delta")
        content = text_of(delta.get("content"))
        tool_calls = tool_calls_of(delta.get("tool_calls"))
        if choice.get("finish_reason"):
            self._finished = True
        if not content and not tool_calls and not choice.get("finish_reason"):
            return []
        data = {"reply_content": content or "", "tool_calls": tool_calls, "raw_meta": _meta(chunk, choice)}
        return [StreamEvent("data", data)]

    def _on_close(self) -> StreamEvent:
        """A stream whose last chunk had a ``finish_reason`` is complete even without ``[DONE]``."""
        return StreamEvent("end") if self._finished else super()._on_close()

    def _cut(self) -> str:
        return f"the stream from instance {self._call.instance.instance_id} ended before [DONE]"
