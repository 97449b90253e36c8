"""Chat-completions shapes shared by the blocking and the streaming side of the ``openai-compatible`` adapter."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from reach_plugins.media import MediaPart
from reach_plugins.protocols.base import mapping_at, payload_text

AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}
"""Media types chat completions take inline as ``input_audio``, and the ``format`` each is sent as."""

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


def content_part(part: MediaPart) -> dict[str, Any]:
    """A media part as a chat content part: ``image_url`` (its URL or a ``data:`` URL), ``input_audio`` (wav and
    mp3 bytes), else ``file`` (``file_data`` as a ``data:`` URL)."""
    if part.media_type.startswith("image/"):
        return {"type": "image_url", "image_url": {"url": part.data_url()}}
    audio = AUDIO_FORMATS.get(part.media_type)
    if audio is not None and part.data is not None:
        return {"type": "input_audio", "input_audio": {"data": base64.b64encode(part.data).decode(), "format": audio}}
    file: dict[str, Any] = {"file_data": part.data_url()}
    return {"type": "file", "file": file | ({"filename": part.name} if part.name else {})}


def with_media(messages: list[Any], media: Sequence[MediaPart]) -> list[Any]:
    """``messages`` with ``media`` as content parts of the last user message (after its text)."""
    if not media:
        return messages
    at = next((i for i in range(len(messages) - 1, -1, -1) if _role(messages[i]) == "user"), None)
    if at is None:
        return [*messages, {"role": "user", "content": [content_part(part) for part in media]}]
    message = dict(messages[at])
    content = message.get("content")
    text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
    message["content"] = text + [content_part(part) for part in media]
    return [*messages[:at], message, *messages[at + 1 :]]


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


def reply_audio(message: Mapping[str, Any]) -> list[MediaPart]:
    """A reply message's ``audio`` (base64 ``data``) as a media part; its transcript stays text. ``ValueError``
    when ``data`` is not base64."""
    audio = mapping_at(message, "audio")
    data = audio.get("data")
    if not isinstance(data, str):
        return []
    kind = str(audio.get("format") or "wav")
    media_type = f"audio/{'mpeg' if kind == 'mp3' else kind}"
    return [MediaPart(media_type=media_type, data=base64.b64decode(data, validate=True))]


def request_body(
    payload: Mapping[str, Any],
    options: Mapping[str, Any],
    default_model: str,
    *,
    stream: bool,
    media: Sequence[MediaPart] = (),
) -> Any:
    """The chat-completions body (``media`` as content parts of the user's message); streaming asks for the usage
    chunk unless told otherwise."""
    if isinstance(payload.get("messages"), list) and payload["messages"]:
        body = dict(payload)
        body["messages"] = with_media(list(payload["messages"]), media)
    else:
        body = {key: value for key, value in payload.items() if key in REQUEST_FIELDS}
        body["messages"] = with_media(chat_messages(payload), media)
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
