"""GatewayTransport: reach agents through a Reach gateway, which routes, injects credentials and retries.

The call travels as the gateway's wire body (the reach body plus ``intent``,
``priority``, ``scope_tags``) with the core's headers: ``traceparent``,
``Idempotency-Key``, ``X-Tenant``, ``X-Reach-Deadline`` (the attempt's
budget), ``X-Reach-Hops`` (the chain *before* this hop: the gateway adds the
hop it routes to) and the instance this client picked (``X-Reach-Prefer``; a
broadcast copy's pin as ``X-Reach-Target``). The gateway owns retries
(``owns_retries``), so the client's core sends each request once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Mapping
from typing import Any

import aiohttp

from reach_plugins.errors import WIRE_CODES, ConfigError, DeadlineExceeded, InvalidResponse, RemoteError, RequestError
from reach_plugins.model import ErrorInfo
from reach_plugins.protocols import HttpRequest, SseDecoder, decoded
from reach_plugins.protocols.base import reply_media
from reach_plugins.protocols.reach import ReachStreamDecoder
from reach_plugins.telemetry.spans import note_http_request, note_http_status
from reach_plugins.transport import BaseTransport, Call, EventStream, Reply, StreamEvent
from reach_plugins.wire.body import MAX_REPLY, REFUSED, check_headers, refusal
from reach_plugins.wire.headers import (
    HEADER_AUTHORIZATION,
    HEADER_DEADLINE,
    HEADER_HOPS,
    HEADER_PREFER,
    HEADER_TARGET,
    TARGET,
)
from transports.direct.boundary import FOREIGN, TrackedBody, mapped, read_capped
from transports.direct.transport import CONNECT_SHARE


def wire_body(call: Call) -> dict[str, Any]:
    """The body the gateway expects for ``call``."""
    request = call.request
    body: dict[str, Any] = {
        "request_id": request.request_id,
        "capability": request.capability,
        "payload": request.payload,
        "deadline_ms": max(0, int(call.timeout * 1000)),
        "priority": request.priority,
    }
    optional = {
        "action": request.action,
        "session_id": request.session_id,
        "tenant": request.tenant,
        "idempotency_key": request.idempotency_key,
        "intent": request.intent,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    if request.scope_tags:
        body["scope_tags"] = request.scope_tags
    if request.media:
        body["media"] = [part.to_wire() for part in request.media]
    return body


def wire_headers(call: Call, token: str | None, *, accept: str = "application/json") -> dict[str, str]:
    """The core's propagation headers, with this hop's budget, the chain so far, and the picked instance."""
    headers = {"Content-Type": "application/json", "Accept": accept, **call.headers}
    remaining = int(call.timeout * 1000)
    given = headers.get(HEADER_DEADLINE)
    headers[HEADER_DEADLINE] = str(max(0, min(remaining, int(given)) if given and given.isdigit() else remaining))
    hops = call.request.hops
    if hops:
        headers[HEADER_HOPS] = ",".join(str(hop) for hop in hops)
    else:
        headers.pop(HEADER_HOPS, None)
    picked = f"{call.agent.name}/{call.instance.instance_id}"
    headers[HEADER_PREFER] = picked
    target = call.request.metadata.get(TARGET)
    if target is not None:
        headers[HEADER_TARGET] = target
    if token:
        headers[HEADER_AUTHORIZATION] = f"Bearer {token}"
    return headers


def _error(raw: Any, status: int) -> ErrorInfo:
    if isinstance(raw, Mapping):
        kind = raw.get("type")
        message = raw.get("message")
        retry_after = raw.get("retry_after")
        return ErrorInfo(
            type=kind if isinstance(kind, str) and kind in WIRE_CODES else RemoteError.code,
            message=str(message) if message else f"the gateway answered HTTP {status}",
            retry_after=float(retry_after) if isinstance(retry_after, int | float) else None,
        )
    kind = RemoteError.code if status >= 500 or status == 429 else RequestError.code
    return ErrorInfo(type=kind, message=f"HTTP {status}")


def parse_reply(call: Call, status: int, body: bytes) -> Reply:
    """The gateway's answer as a Reply: who served it, how many attempts it took; a refusal is raised."""
    try:
        decoded = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        decoded = None
    if not isinstance(decoded, dict):
        if status >= 400:
            return Reply(status="fail", error=_error(None, status), status_code=status)
        raise InvalidResponse(f"the gateway at {call.instance.endpoint} answered HTTP {status} without a JSON body")
    kind = decoded.get("status")
    attempts = decoded.get("attempts")
    common: dict[str, Any] = {
        "agent": decoded.get("agent") or call.agent.name,
        "instance": decoded.get("instance") or call.instance.instance_id,
        "attempts": attempts if isinstance(attempts, int) and attempts > 0 else 1,
    }
    if status == 200 and kind == "success":
        media = reply_media(call, decoded.get("media"))
        return Reply(status="success", data=decoded.get("data"), media=media, **common)
    error = _error(decoded.get("error"), status)
    if decoded.get(REFUSED) is True:
        raise refusal(error.type, error.message, error.retry_after)
    if kind == "timeout" and error.type == RemoteError.code:
        error = error.model_copy(update={"type": DeadlineExceeded.code})
    data = decoded.get("data")
    return Reply(status="fail", data=data, error=error, status_code=status, retry_after=error.retry_after, **common)


async def _read(pending: Awaitable[bytes], request: HttpRequest) -> bytes:
    try:
        return await pending
    except FOREIGN as exc:
        raise mapped(exc, request) from exc


class GatewayTransport(BaseTransport):
    """Send each call to the gateway at ``url`` (``http://host:port``), authenticated with ``token``."""

    owns_retries = True

    def __init__(
        self, url: str, *, token: str | None = None, max_conns: int = 100, connect_timeout: float = 3.0
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"the gateway URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.hop: str | None = self.url
        self._token = token
        self._max_conns = max_conns
        self._connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_conns, keepalive_timeout=90.0)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self._session

    def _request(self, call: Call, path: str, accept: str) -> HttpRequest:
        body = json.dumps(wire_body(call), separators=(",", ":"), ensure_ascii=False).encode()
        headers = wire_headers(call, self._token, accept=accept)
        check_headers(headers)
        return HttpRequest("POST", f"{self.url}{path}", headers, body)

    def _limits(self, total: float | None) -> aiohttp.ClientTimeout:
        """The connect ends before the attempt's own timers, so a hung connect is a ConnectError (not delivered)."""
        connect = self._connect_timeout if total is None else min(self._connect_timeout, total * CONNECT_SHARE)
        return aiohttp.ClientTimeout(total=total, sock_connect=connect)

    async def send(self, call: Call) -> Reply:
        request = self._request(call, "/v1/reach", "application/json")
        body = TrackedBody(request.body or b"")
        note_http_request(call.span, request.method, request.url)
        try:
            async with self._client().post(
                request.url, data=body, headers=request.headers, timeout=self._limits(call.timeout)
            ) as response:
                note_http_status(call.span, response.status)
                raw = await read_capped(response, MAX_REPLY)
        except FOREIGN as exc:
            raise mapped(exc, request, written=body.written) from exc
        return parse_reply(call, response.status, raw)

    async def stream(self, call: Call) -> EventStream:
        """SSE from ``/v1/reach/stream``; a refusal before the stream starts is one ``error`` event."""
        request = self._request(call, "/v1/reach/stream", "text/event-stream")
        note_http_request(call.span, request.method, request.url)
        try:
            async with asyncio.timeout(call.timeout):
                response = await self._client().post(
                    request.url, data=request.body, headers=request.headers, timeout=self._limits(None)
                )
        except FOREIGN as exc:
            raise mapped(exc, request) from exc
        note_http_status(call.span, response.status)
        try:
            if not response.content_type.startswith("text/event-stream"):
                reply = parse_reply(call, response.status, await _read(read_capped(response, MAX_REPLY), request))
                yield StreamEvent("error", error=reply.error) if reply.error else StreamEvent("data", reply.data)
                return
            decoder, sse = ReachStreamDecoder(call), SseDecoder()
            while True:
                chunk = await _read(response.content.readany(), request)
                for event in decoded(decoder, sse.feed(chunk) if chunk else (), closing=not chunk):
                    yield event
                    if event.last:
                        return
                if not chunk:
                    return
        finally:
            response.close()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
