"""The ``reach`` protocol (DESIGN.md section 4): ``POST /reach`` and ``POST /reach/stream`` (SSE).

Stream frames are ``event: data`` (a JSON chunk), a media part as
``event: media`` / ``media.chunk`` / ``media.end`` (:mod:`reach_plugins.wire.media_stream`),
``event: end`` and ``event: error`` (``{"type", "message"}``); a stream that
closes without ``end`` was cut.
"""

from __future__ import annotations

import json
from typing import Any

from reach_plugins.errors import InvalidResponse, MediaTooLarge
from reach_plugins.protocols.base import (
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
    reach_headers,
    reply_media,
    success,
)
from reach_plugins.transport import Call, Reply, StreamEvent
from reach_plugins.wire.media_stream import MEDIA_EVENTS, MediaAssembler
from reach_plugins.wire.sse import SseEvent


def reach_body(call: Call) -> dict[str, Any]:
    """The wire body of DESIGN.md section 4; ``deadline_ms`` is the remaining budget, as in ``X-Reach-Deadline``;
    ``media`` (base64 parts) only when the request carries some."""
    request = call.request
    body: dict[str, Any] = {
        "request_id": request.request_id,
        "capability": request.capability,
        "action": request.action,
        "payload": request.payload,
        "session_id": request.session_id,
        "tenant": request.tenant,
        "idempotency_key": request.idempotency_key,
        "deadline_ms": max(0, int(call.timeout * 1000)),
    }
    if request.media:
        body["media"] = [part.to_wire() for part in request.media]
    return body


class ReachAdapter(NoDiscovery):
    """Client side of the reach wire protocol."""

    protocol = "reach"

    def build(self, call: Call, *, stream: bool = False, discovered: Any = None) -> HttpRequest:
        path = "/reach/stream" if stream else "/reach"
        accept = "text/event-stream" if stream else "application/json"
        body = encode_json(reach_body(call))
        return HttpRequest("POST", endpoint_url(call, path), reach_headers(call, accept=accept), body)

    def parse(self, call: Call, response: HttpResponse) -> Reply:
        if not 200 <= response.status < 300:
            return http_failure(call, response)
        body = decode_json(call, response.body)
        if not isinstance(body, dict) or body.get("status") not in ("success", "fail"):
            raise invalid(call, 'expected {"status": "success"|"fail", "data", "error"}')
        if body["status"] == "fail":
            info = error_info(body.get("error"), "transient", "the agent replied fail without an error")
            return failure(call, info, response.status, info.retry_after)
        return success(call, body.get("data"), response.status, reply_media(call, body.get("media")))

    def decoder(self, call: Call) -> ReachStreamDecoder:
        return ReachStreamDecoder(call)


class ReachStreamDecoder(EndsOnce):
    """``data`` / ``media`` (in chunks) / ``end`` / ``error`` SSE frames into stream events.

    Media parts are reassembled within the capability's ``max_media_bytes`` (:func:`reply_limit`): a part past
    it ends the stream with a ``media_too_large`` error, a chunk out of sequence is an invalid response.
    """

    def __init__(self, call: Call) -> None:
        super().__init__(call)
        limit = call.media_limit
        self._media = MediaAssembler(limit=limit, capability=call.request.capability)

    def feed(self, event: SseEvent) -> list[StreamEvent]:
        if self._done:
            return []
        try:
            if event.event in MEDIA_EVENTS:
                part = self._media.feed_sse(event.event, event.data)
                return [] if part is None else [StreamEvent("media", media=part)]
            if self._media.open:
                raise InvalidResponse(f"an {event.event!r} event came inside a media part")
        except MediaTooLarge as exc:
            return self._finish(StreamEvent.failed(exc))
        except InvalidResponse as exc:
            raise invalid(self._call, exc.message) from None
        if event.event == "end":
            return self._finish(StreamEvent("end"))
        try:
            value = json.loads(event.data) if event.data else None
        except ValueError:
            raise invalid(self._call, f"a stream frame is not JSON ({event.data[:80]!r})") from None
        if event.event == "error":
            return self._finish(StreamEvent("error", error=error_info(value, "transient", "the agent's stream failed")))
        return [StreamEvent("data", value)]
