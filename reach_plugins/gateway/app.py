"""The gateway's Starlette app: ``POST /v1/reach``, ``/v1/reach/stream`` (SSE), ``GET /v1/agents``, health, metrics.

Every request is authenticated (bearer token -> tenant), parsed strictly, and
run through the :class:`~reach_plugins.server.forwarder.Forwarder` under a
server span that continues the caller's trace. Refusals are 4xx JSON naming
the problem (429 + ``Retry-After`` to slow down, 503/504 when nobody could
serve in time); a routed outcome is 200 with the response body, whatever its
status. More than ``max_inflight`` concurrent requests get an explicit
backpressure answer.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, TracerProvider
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from reach_plugins.errors import Backpressure, BodyTimeout, BodyTooLarge, ConfigError, RateLimited, ReachError
from reach_plugins.gateway.mcp import McpEndpoint
from reach_plugins.model import ErrorInfo, ReachRequest, ReachResponse
from reach_plugins.protocols import encode_sse
from reach_plugins.security.issuer import TokenIssuer
from reach_plugins.server.access import Access
from reach_plugins.server.forwarder import Forwarder
from reach_plugins.server.inbound import (
    InputLimits,
    loads,
    read_body,
    require_json,
    single_headers,
)
from reach_plugins.server.issuer_routes import issuer_routes
from reach_plugins.telemetry.prometheus import CONTENT_TYPE, Metrics
from reach_plugins.telemetry.spans import (
    ATTR_AGENT,
    ATTR_CAPABILITY,
    ATTR_INSTANCE,
    ATTR_REQUEST_ID,
    ATTR_STATUS,
    ATTR_TENANT,
    extract_context,
    get_tracer,
    spans_are_noop,
)
from reach_plugins.transport import EventStream, StreamEvent
from reach_plugins.wire.body import (
    error_body,
    parse_body,
    response_body,
    to_request,
)
from reach_plugins.wire.headers import HEADER_TRACEPARENT

log = logging.getLogger("reach_plugins.gateway")

REQUESTS = "reach_gateway_requests_total"
LATENCY = "reach_gateway_request_seconds"
INFLIGHT = "reach_gateway_inflight"
REFUSED = "reach_gateway_refused_total"


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def _headers(request: Request) -> dict[str, str]:
    """The request's headers as a plain dict, computed once; ``RequestError`` if an auth header comes twice."""
    cached: dict[str, str] | None = request.scope.get("reach.headers")
    if cached is None:
        cached = request.scope["reach.headers"] = single_headers(request.scope["headers"])
    return cached


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(_dumps(body), status, headers, media_type="application/json")


class _Stream:
    """What one stream request holds until its ASGI call ends: a place in flight, the span, the agent's events."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.span: Span | None = None
        self.events: EventStream | None = None
        self.status = "fail"
        self.handed_over = False
        self._released = False

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            if self.events is not None:
                await self.events.aclose()
        finally:
            if self.span is not None:
                self.span.end()
            self.gateway.inflight -= 1
            if self.span is not None:
                self.gateway.metrics.inc(REQUESTS, {"endpoint": "stream", "status": self.status})


class _Released(StreamingResponse):
    """A streaming answer that runs ``release`` once its ASGI call ends, even if the body was never iterated."""

    def __init__(self, frames: AsyncIterator[bytes], release: Callable[[], Awaitable[None]]) -> None:
        super().__init__(frames, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


class Gateway:
    """The gateway's state: who may call (``access``), how requests run (``forwarder``), what it counted."""

    def __init__(
        self,
        forwarder: Forwarder,
        access: Access,
        *,
        max_inflight: int = 1024,
        tracer_provider: TracerProvider | None = None,
        retry_after: float = 1.0,
        metrics: Metrics | None = None,
        limits: InputLimits | None = None,
        issuer: TokenIssuer | None = None,
        worker: int | None = None,
    ) -> None:
        if max_inflight < 1:
            raise ConfigError(f"max_inflight must be at least 1, got {max_inflight}")
        self.forwarder = forwarder
        self.access = access
        self.max_inflight = max_inflight
        self.retry_after = retry_after
        self.limits = limits or InputLimits()
        self.large = self.limits.places()
        """Places for bodies over 64 KiB, shared by every endpoint of this gateway."""
        self.issuer = issuer
        """The token issuer role (DESIGN.md 11.4): ``POST /v1/tokens`` and the JWKS, when given."""
        self.worker = worker
        """This process's number under ``reach gateway --workers N`` (shown by /healthz), else None."""
        self.inflight = 0
        self.draining = False
        self._tracer_provider = tracer_provider
        self._tracer = get_tracer(tracer_provider)
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.declare(REQUESTS, "counter", "Requests by endpoint and outcome.")
        self.metrics.declare(LATENCY, "histogram", "Time to answer, by endpoint.")
        self.metrics.declare(INFLIGHT, "gauge", "Requests being served now.")
        self.metrics.declare(REFUSED, "counter", "Requests refused before routing, by error type.")

    # ------------------------------------------------------------------ request handling

    def _gate(self, request: Request) -> tuple[dict[str, str], str | None]:
        """Before a byte of the body is read: concurrency bound, one value per auth header, a valid token, JSON."""
        if self.inflight > self.max_inflight:
            raise Backpressure(
                f"the gateway is serving {self.max_inflight} requests, its limit; retry after {self.retry_after:g}s",
                retry_after=self.retry_after,
            )
        headers = _headers(request)
        tenant = self.access.authenticate(headers.get("authorization"), headers.get("x-tenant"))
        require_json(headers)
        return headers, tenant

    async def _admit(self, request: Request, headers: dict[str, str], tenant: str | None) -> ReachRequest:
        """Read the body within its byte and time budgets, parse it strictly: the ReachRequest to run."""
        limits = self.limits
        raw = await read_body(
            request.stream(), headers, limit=limits.max_body, timeout=limits.body_timeout, large=self.large
        )
        body = parse_body(loads(raw, max_depth=limits.max_depth))
        if headers.get("x-tenant") is None and body.tenant is not None and body.tenant != tenant:  # else checked
            tenant = self.access.authenticate(headers.get("authorization"), body.tenant)
        source = request.client.host if request.client else None
        return to_request(body, lambda name: headers.get(name.lower()), tenant=tenant, source=source)

    def _refusal(
        self, endpoint: str, exc: ReachError, request_id: str | None = None, *, close: bool = False
    ) -> Response:
        """A 4xx/5xx JSON answer; ``close`` ends the connection (its unread body is never read)."""
        status = exc.http_status
        if isinstance(exc, ConfigError):
            log.error("request %s failed on the gateway's configuration: %s", request_id, exc.message)
            exc = ConfigError("the gateway's configuration cannot serve this request; its log names the problem")
        headers = {"Connection": "close"} if close else {}
        retry_after = getattr(exc, "retry_after", None)
        if isinstance(exc, Backpressure | RateLimited):
            headers["Retry-After"] = str(max(1, round(retry_after or self.retry_after)))
        self.metrics.inc(REFUSED, {"type": exc.error_type})
        self.metrics.inc(REQUESTS, {"endpoint": endpoint, "status": str(status)})
        return _json(error_body(exc, request_id), status, headers)

    def _span(self, request: Request, reach: ReachRequest, name: str) -> Span:
        """A server span, child of the caller's ``traceparent`` when there is one."""
        headers = _headers(request)
        parent = extract_context(headers) if HEADER_TRACEPARENT in headers else None
        span = self._tracer.start_span(f"{name} {reach.capability}", context=parent, kind=SpanKind.SERVER)
        if span.is_recording():
            span.set_attribute(ATTR_CAPABILITY, reach.capability)
            span.set_attribute(ATTR_REQUEST_ID, reach.request_id)
            if reach.tenant:
                span.set_attribute(ATTR_TENANT, reach.tenant)
        return span

    def _crash(self, endpoint: str, exc: Exception) -> Response:
        """A bug of ours: 500 with an error id; the details go to the gateway's log under that id, not to the caller."""
        error_id = uuid.uuid4().hex[:16]
        log.error("error %s on %s: %s", error_id, endpoint, type(exc).__name__, exc_info=exc)
        self.metrics.inc(REQUESTS, {"endpoint": endpoint, "status": "500"})
        body = {
            "type": "internal",
            "message": f"the gateway failed; its log holds the details under error id {error_id}",
        }
        return _json({"request_id": None, "status": "fail", "data": None, "error": body}, 500)

    async def reach(self, request: Request) -> Response:
        started = time.perf_counter()
        self.inflight += 1
        try:
            return await self._reach(request)
        except Exception as exc:
            return self._crash("reach", exc)
        finally:
            self.inflight -= 1
            self.metrics.observe(LATENCY, time.perf_counter() - started, {"endpoint": "reach"})

    async def _reach(self, request: Request) -> Response:
        try:
            headers, tenant = self._gate(request)
        except ReachError as exc:
            return self._refusal("reach", exc, close=True)
        try:
            reach = await self._admit(request, headers, tenant)
        except ReachError as exc:
            return self._refusal("reach", exc, close=isinstance(exc, BodyTooLarge | BodyTimeout))
        if HEADER_TRACEPARENT not in headers and spans_are_noop(self._tracer_provider):
            return await self._forward(reach)  # no trace to continue, none to record: no span to open
        span = self._span(request, reach, "reach.gateway")
        try:
            with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
                response = await self.forwarder.run(reach)
                if span.is_recording():
                    span.set_attribute(ATTR_STATUS, response.status)
                    span.set_attribute(ATTR_AGENT, response.agent or "")
                    span.set_attribute(ATTR_INSTANCE, response.instance or "")
        except ReachError as exc:
            return self._refusal("reach", exc, reach.request_id)
        return self._answer(response)

    async def _forward(self, reach: ReachRequest) -> Response:
        try:
            response = await self.forwarder.run(reach)
        except ReachError as exc:
            return self._refusal("reach", exc, reach.request_id)
        return self._answer(response)

    def _answer(self, response: ReachResponse) -> Response:
        self.metrics.inc(REQUESTS, {"endpoint": "reach", "status": response.status})
        return _json(response_body(response))

    async def _hot(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/reach`` straight from the server, past Starlette's middleware and router (its hot path)."""
        response = await self.reach(Request(scope, receive))
        await response(scope, receive, send)

    async def reach_stream(self, request: Request) -> Response:
        """SSE; the in-flight count is released when the ASGI call ends, whether or not the stream ever started."""
        self.inflight += 1
        stream = _Stream(self)
        try:
            return await self._reach_stream(request, stream)
        except Exception as exc:
            return self._crash("stream", exc)
        finally:
            if not stream.handed_over:
                await stream.release()

    async def _reach_stream(self, request: Request, stream: _Stream) -> Response:
        try:
            headers, tenant = self._gate(request)
        except ReachError as exc:
            return self._refusal("stream", exc, close=True)
        try:
            reach = await self._admit(request, headers, tenant)
        except ReachError as exc:
            return self._refusal("stream", exc, close=isinstance(exc, BodyTooLarge | BodyTimeout))
        stream.span = span = self._span(request, reach, "reach.gateway.stream")
        stream.events = events = self.forwarder.stream(reach)
        try:
            with trace.use_span(span, end_on_exit=False):
                first = await anext(events, StreamEvent("end"))
        except ReachError as exc:
            return self._refusal("stream", exc, reach.request_id)
        stream.handed_over = True
        return _Released(self._frames(first, events, stream), stream.release)

    async def _frames(
        self, first: StreamEvent, events: AsyncIterator[StreamEvent], stream: _Stream
    ) -> AsyncIterator[bytes]:
        """SSE frames in the agent's format: ``data`` chunks, then ``end`` or ``error``."""
        event = first
        while event.kind == "data":
            yield encode_sse(_dumps(event.data).decode(), "data")
            event = await anext(events, StreamEvent("end"))
        if event.kind == "end":
            stream.status = "success"
            yield encode_sse("", "end")
        else:
            error = event.error or ErrorInfo(type="transient", message="the stream failed without details")
            yield encode_sse(_dumps(error.model_dump(exclude_none=True)).decode(), "error")

    async def agents(self, request: Request) -> Response:
        try:
            headers = _headers(request)
            tenant = self.access.authenticate(headers.get("authorization"), headers.get("x-tenant"))
        except ReachError as exc:
            return self._refusal("agents", exc)
        source = request.client.host if request.client else None
        return _json({"tenant": tenant, "agents": self.forwarder.visible(tenant, source)})

    async def healthz(self, request: Request) -> Response:
        if self.worker is None:
            return JSONResponse({"status": "alive"})
        return JSONResponse({"status": "alive", "worker": self.worker})

    async def readyz(self, request: Request) -> Response:
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not self.forwarder.table.agents():
            return JSONResponse({"status": "no agents registered"}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def metrics_text(self, request: Request) -> Response:
        self.metrics.set(INFLIGHT, self.inflight)
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)

    # ------------------------------------------------------------------ app

    def app(self) -> Starlette:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            self.draining = False
            await self.forwarder.start()
            try:
                yield
            finally:
                self.draining = True
                await self.forwarder.aclose()

        routes = [
            Route("/v1/reach", self.reach, methods=["POST"]),
            Route("/v1/reach/stream", self.reach_stream, methods=["POST"]),
            Route("/v1/agents", self.agents, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics_text, methods=["GET"]),
            Route("/mcp", McpEndpoint(self).handle, methods=["GET", "POST", "DELETE"]),
        ]
        if self.issuer is not None:
            routes += issuer_routes(self.issuer, self.access.authenticate)
        return _App(self._hot, routes=routes, lifespan=lifespan)


class _App(Starlette):
    """Starlette, but ``POST /v1/reach`` goes straight to ``hot``: every other request (and a reach under a
    ``root_path``) takes the routes, the same handler included."""

    def __init__(self, hot: Callable[[Scope, Receive, Send], Awaitable[None]], **options: Any) -> None:
        super().__init__(**options)
        self._hot = hot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == "/v1/reach"
            and scope["method"] == "POST"
            and not scope.get("root_path")
        ):
            await self._hot(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)
