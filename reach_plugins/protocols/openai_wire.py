"""Chat-completions shapes shared by the blocking and the streaming side of the ``openai-compatible`` adapter."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from reach_plugins.protocols.base import mapping_at, payload_text

REQUEST_FIELDS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
"""The request fields of ``openai``'s ``CompletionCreateParams`` (besides model, messages, stream).

A payload that carries ``messages`` is a chat request already: all its fields
pass through untouched, known or not (a vendor's ``top_k`` too). A tool-call
style payload (``{"query": ..., "order_id": ...}``) keeps only these fields;
the rest is the user's content."""
META_FIELDS = ("id", "model", "created", "usage", "system_fingerprint", "service_tier")


def chat_messages(payload: Mapping[str, Any]) -> list[Any]:
    messages = payload.get("messages")
    if isinstance(messages, list) and messages:
        return messages
    text = payload_text(payload)
    if text is None:
        content = {key: value for key, value in payload.items() if key not in REQUEST_FIELDS}
        text = json.dumps(content, ensure_ascii=False)
    return [{"role": "user", "content": text}]


def request_body(payload: Mapping[str, Any], options: Mapping[str, Any], default_model: str, *, stream: bool) -> Any:
    """The chat-completions body; streaming asks for the usage chunk unless told otherwise."""
    if isinstance(payload.get("messages"), list) and payload["messages"]:
        body = dict(payload)
    else:
        body = {key: value for key, value in payload.items() if key in REQUEST_FIELDS}
        body["messages"] = chat_messages(payload)
    body["model"] = payload.get("model") or options.get("model") or default_model
    if stream:
        body["stream"] = True
        if "stream_options" not in body and options.get("stream_usage", True):
            body["stream_options"] = {"include_usage": True}
    else:
        body.pop("stream", None)
        body.pop("stream_options", None)
    return body


def text_of(value: Any) -> str | None:
    """A content field as text: a string, or the joined ``text`` of a list of parts."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [str(part["text"]) for part in value if isinstance(part, Mapping) and "text" in part]
        return "".join(parts) if parts else None
    return None


def parsed_arguments(arguments: Any) -> Any:
    """Whole JSON arguments as their value; anything else (not JSON) as it came."""
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            return json.loads(arguments)
    return arguments


def tool_calls_of(raw: Any) -> list[dict[str, Any]]:
    """Complete OpenAI tool calls as ``{"id", "name", "arguments"}``, arguments parsed when they are JSON."""
    calls: list[dict[str, Any]] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, Mapping):
            continue
        function = mapping_at(item, "function")
        call: dict[str, Any] = {
            "id": item.get("id"),
            "name": function.get("name"),
            "arguments": parsed_arguments(function.get("arguments")),
        }
        if "index" in item:
            call["index"] = item["index"]
        calls.append(call)
    return calls


def meta_of(body: Mapping[str, Any], choice: Mapping[str, Any] | None) -> dict[str, Any]:
    meta = {key: body[key] for key in META_FIELDS if key in body}
    if choice is not None:
        meta["finish_reason"] = choice.get("finish_reason")
    return meta


def first_choice(body: Any) -> Mapping[str, Any] | None:
    choices = body.get("choices") if isinstance(body, Mapping) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        return choices[0]
    return None
