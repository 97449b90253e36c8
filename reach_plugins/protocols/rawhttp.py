"""``raw-http`` agents: any JSON-over-HTTP API, described by a request template and a response mapping.

``protocol_options`` (all optional)::

    method: POST                        # GET sends the rendered template as query parameters
    path: /api/chat
    request_template: {question: "${payload.query}", uid: "${request.session_id}"}   # default: the payload
    response_mapping: {reply_content: data.message.content, tool_calls: data.tool_calls}
    success_path: code                  # with success_value (default 0): anything else is a business error
    success_value: 0
    error_path: msg                     # where the error message is

With a ``response_mapping`` the reply is normalised to ``reply_content``,
``tool_calls`` and ``raw_meta`` (the rest of the body, or the ``raw_meta``
path); without one the body is the reply data as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reach_plugins.errors import ConfigError, InvalidPayload
from reach_plugins.model import ErrorInfo
from reach_plugins.protocols.base import (
    HttpRequest,
    HttpResponse,
    NoDiscovery,
    StreamDecoder,
    decode_json,
    encode_json,
    endpoint_url,
    failure,
    http_failure,
    invalid,
    reach_headers,
    success,
)
from reach_plugins.protocols.paths import lookup, render, without
from reach_plugins.transport import Call, Reply

MAPPING_KEYS = frozenset({"reply_content", "tool_calls", "raw_meta"})
_ABSENT = object()


def _template_context(call: Call) -> dict[str, Any]:
    request = call.request
    return {
        "payload": request.payload,
        "request": {
            "request_id": request.request_id,
            "capability": request.capability,
            "action": request.action,
            "session_id": request.session_id,
            "tenant": request.tenant,
            "idempotency_key": request.idempotency_key,
        },
    }


class RawHttpAdapter(NoDiscovery):
    """Client side of an arbitrary JSON API; non-streaming (a stream is the one reply)."""

    protocol = "raw-http"

    def build(self, call: Call, *, stream: bool = False, discovered: Any = None) -> HttpRequest:
        options = call.agent.protocol_options
        template = options.get("request_template")
        try:
            body = call.request.payload if template is None else render(template, _template_context(call))
        except KeyError as exc:
            raise InvalidPayload(
                f"agent {call.agent.name!r} request_template needs {exc.args[0]!r}, which the request does not have"
            ) from None
        method = str(options.get("method", "POST")).upper()
        url = endpoint_url(call, str(options.get("path", "/")))
        headers = reach_headers(call)
        if method == "GET":
            params = {str(key): str(value) for key, value in dict(body).items()} if isinstance(body, Mapping) else {}
            return HttpRequest("GET", url, headers, params=params)
        return HttpRequest(method, url, headers, encode_json(body))

    def parse(self, call: Call, response: HttpResponse) -> Reply:
        if not 200 <= response.status < 300:
            return http_failure(call, response)
        body = decode_json(call, response.body)
        options = call.agent.protocol_options
        refused = self._refusal(body, options)
        if refused is not None:
            return failure(call, refused, response.status)
        mapping = options.get("response_mapping")
        if mapping is None:
            return success(call, body, response.status)
        return success(call, self._normalise(call, body, mapping), response.status)

    def _refusal(self, body: Any, options: Mapping[str, Any]) -> ErrorInfo | None:
        path = options.get("success_path")
        if path is None:
            return None
        expected = options.get("success_value", 0)
        value = lookup(body, str(path), _ABSENT)
        if value == expected:
            return None
        message = lookup(body, str(options.get("error_path", "message")), None)
        text = str(message) if message else f"{path} is {value!r}, not {expected!r}"
        return ErrorInfo(type="business", message=text)

    def _normalise(self, call: Call, body: Any, mapping: Any) -> dict[str, Any]:
        if not isinstance(mapping, Mapping) or "reply_content" not in mapping or not set(mapping) <= MAPPING_KEYS:
            raise ConfigError(
                f"agent {call.agent.name!r}: response_mapping must map 'reply_content' (and optionally "
                f"'tool_calls', 'raw_meta') to JSON paths, got {mapping!r}"
            )
        try:
            reply = lookup(body, str(mapping["reply_content"]))
        except KeyError:
            raise invalid(call, f"no value at {mapping['reply_content']!r} (response_mapping.reply_content)") from None
        tool_calls = lookup(body, str(mapping["tool_calls"]), []) if "tool_calls" in mapping else []
        if "raw_meta" in mapping:
            meta = lookup(body, str(mapping["raw_meta"]), {})
        else:
            meta = without(body, [str(mapping[key]) for key in ("reply_content", "tool_calls") if key in mapping])
        return {"reply_content": reply, "tool_calls": tool_calls, "raw_meta": meta}

    def decoder(self, call: Call) -> StreamDecoder | None:
        return None
