"""``openai-compatible`` agents: a chat-completions request in, ``reply_content``/``tool_calls``/``raw_meta`` out.

The request's messages come from ``payload["messages"]`` (then every other
payload field passes through untouched); failing that, from the first text
field (``input``, ``query``, ``message``, ``prompt``, ``question``, ``text``)
as one user message, with the payload's chat-completions fields passed
through; failing that, the payload as JSON text. ``protocol_options``:
``path`` (default ``/chat/completions``), ``model``, ``stream_usage`` (default
true: a stream asks for its usage chunk), ``tool_call_fragments`` (default
false: a stream emits assembled tool calls only).

A refusal (``content: null, refusal: "..."``) is the model's answer, not a
broken reply: a ``fail`` of type ``refusal`` (:class:`~reach_plugins.errors.Refused`)
carrying the text, never retried and never counted against the breaker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reach_plugins.protocols.base import (
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
    reach_headers,
    success,
)
from reach_plugins.protocols.openai_stream import OpenAIStreamDecoder, refused
from reach_plugins.protocols.openai_wire import (
    first_choice,
    meta_of,
    reply_audio,
    request_body,
    text_of,
    tool_calls_of,
)
from reach_plugins.transport import Call, Reply


class OpenAIAdapter(NoDiscovery):
    """Client side of an OpenAI-compatible chat-completions endpoint."""

    protocol = "openai-compatible"

    def build(self, call: Call, *, stream: bool = False, discovered: Any = None) -> HttpRequest:
        options = call.agent.protocol_options
        body = request_body(call.request.payload, options, call.agent.name, stream=stream, media=call.request.media)
        accept = "text/event-stream" if stream else "application/json"
        url = endpoint_url(call, str(options.get("path", "/chat/completions")))
        return HttpRequest("POST", url, reach_headers(call, accept=accept), encode_json(body))

    def parse(self, call: Call, response: HttpResponse) -> Reply:
        if not 200 <= response.status < 300:
            return http_failure(call, response)
        body = decode_json(call, response.body)
        if isinstance(body, Mapping) and "error" in body:
            return failure(call, error_info(body["error"], "transient", "the agent replied with an error"))
        choice = first_choice(body)
        message = choice.get("message") if choice else None
        if choice is None or not isinstance(message, Mapping):
            raise invalid(call, "expected choices[0].message in a chat-completions reply")
        content = text_of(message.get("content"))
        tool_calls = tool_calls_of(message.get("tool_calls"))
        refusal = message.get("refusal")
        try:
            audio = reply_audio(message)
        except ValueError:
            raise invalid(call, "choices[0].message.audio.data is not base64") from None
        if not content and not tool_calls and not audio and isinstance(refusal, str) and refusal:
            return refused(call, refusal, meta_of(body, choice))
        if content is None and not tool_calls and not audio:
            raise invalid(call, "choices[0].message has neither 'content', 'tool_calls', 'audio' nor 'refusal'")
        return success(
            call,
            {"reply_content": content or "", "tool_calls": tool_calls, "raw_meta": meta_of(body, choice)},
            response.status,
            audio,
        )

    def decoder(self, call: Call) -> OpenAIStreamDecoder:
        return OpenAIStreamDecoder(call, fragments=bool(call.agent.protocol_options.get("tool_call_fragments")))
