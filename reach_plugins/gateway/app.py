"""The gateway's Starlette app: ``POST /v1/reach``, ``/v1/reach/stream`` (SSE), ``GET /v1/agents``, ``/v1/loops``,
health, metrics.

Every route goes through the server layer (authenticated, body read within
its budgets, parsed strictly into a :class:`~reach_plugins.wire.body.WireBody`)
and a reach runs through the :class:`~reach_plugins.server.forwarder.Forwarder` under a
server span that continues the caller's trace. Refusals are 4xx JSON naming
the problem (429 + ``Retry-After`` to slow down, 503/504 when nobody could
serve in time); a routed outcome is 200 with the response body, whatever its
status. More than ``max_inflight`` concurrent requests get an explicit
backpressure answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, TracerProvider
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from reach_plugins.errors import Backpressure, ConfigError, RateLimited, ReachError, Unauthenticated
from reach_plugins.gateway.mcp import McpEndpoint
from reach_plugins.gateway.ops import OpsPage, Recent
from reach_plugins.media import parts_from_wire
from reach_plugins.model import ErrorInfo, ReachRequest, ReachResponse
from reach_plugins.protocols import encode_sse
from reach_plugins.security.issuer import TokenIssuer
from reach_plugins.server.access import Access
from reach_plugins.server.forwarder import Forwarder
from reach_plugins.server.inbound import InputLimits
from reach_plugins.server.issuer_routes import issuer_routes
from reach_plugins.server.layer import OPEN, Inbound, ServerApp, ServerRoute, Stage
from reach_plugins.telemetry.logs import bind_request_id
from reach_plugins.telemetry.prometheus import CONTENT_TYPE, Metrics, scrape_allowed
from reach_plugins.telemetry.spans import (
    ATTR_AGENT,
    ATTR_CAPABILITY,
    ATTR_INSTANCE,
    ATTR_REQUEST_ID,
    ATTR_TENANT,
    end_server_span,
    extract_context,
    get_tracer,
    spans_are_noop,
)
from reach_plugins.telemetry.trace import RecentTraces
from reach_plugins.transport import EventStream, StreamEvent
from reach_plugins.wire.body import WireBody, error_body, response_body, to_request
from reach_plugins.wire.headers import HEADER_TRACEPARENT
from reach_plugins.wire.media_stream import sse_frames

log = logging.getLogger("reach_plugins.gateway")

REQUESTS = "reach_gateway_requests_total"
LATENCY = "reach_gateway_request_seconds"
INFLIGHT = "reach_gateway_inflight"
REFUSED = "reach_gateway_refused_total"
LOOPS = "reach_gateway_dependency_loops"
KEEPALIVE = 15.0
"""Seconds of silence after which the trace stream sends a comment (so a follower that left is noticed)."""


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode()


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
        max_media_bytes: int = 0,
        issuer: TokenIssuer | None = None,
        exchangers: Mapping[str, str] | None = None,
        worker: int | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        recent: RecentTraces | None = None,
        reaches: Recent | None = None,
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
        self.max_media_bytes = max_media_bytes
        """The most media bytes one reach body carries here (0: none, bodies stay within ``limits.max_body``);
        :func:`create_app` sets the largest ``max_media_bytes`` its configured capabilities declare. Each
        capability's own limit is enforced where it is served (the agent SDK)."""
        self.issuer = issuer
        """The token issuer role (DESIGN.md 11.4): ``POST /v1/tokens`` and the JWKS, when given."""
        self.exchangers = dict(exchangers or {})
        """The agents that may exchange at the issuer role the tokens they receive: name -> its issuer token."""
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
        self.metrics.declare(LOOPS, "gauge", "Agent pairs reaching each other too often (GET /v1/loops).")
        self.metrics.before_render(self._gauges)
        self.metrics_port = metrics_port
        """Where ``/metrics`` is served instead of on the gateway's port (from a thread, on ``metrics_host``)."""
        self.metrics_host = metrics_host
        self.recent = recent
        """The recent traces ``GET /v1/traces/stream`` serves (the route exists when given)."""
        self.reaches = reaches if reaches is not None else Recent()
        """The newest reaches the operations page shows (a sink of the forwarder's traces, as ``serve`` wires it)."""

    # ------------------------------------------------------------------ request handling

    async def caller(self, request: Request, headers: Mapping[str, str]) -> str | None:
        """The server layer's auth rule: the tenant of the bearer token (the one a claimed ``X-Tenant`` names)."""
        return self.access.authenticate(headers.get("authorization"), headers.get("x-tenant"))

    async def _gate(self, request: Request, headers: Mapping[str, str]) -> str | None:
        """The auth rule of the reach routes: the concurrency bound, then the caller."""
        if self.inflight > self.max_inflight:
            raise Backpressure(
                f"the gateway is serving {self.max_inflight} requests, its limit; retry after {self.retry_after:g}s",
                retry_after=self.retry_after,
            )
        return await self.caller(request, headers)

    def _admit(self, inbound: Inbound) -> ReachRequest:
        """The ReachRequest to run: the parsed body, completed by the headers, for the body's tenant if it names one."""
        body: WireBody = inbound.body
        headers, tenant = inbound.headers, inbound.caller
        if headers.get("x-tenant") is None and body.tenant is not None and body.tenant != tenant:  # else checked
            tenant = self.access.authenticate(headers.get("authorization"), body.tenant)
        request = inbound.request
        source = request.client.host if request.client else None
        media = parts_from_wire(body.media, limit=self.max_media_bytes, capability=body.capability)
        reach = to_request(body, lambda name: headers.get(name.lower()), tenant=tenant, source=source, media=media)
        bind_request_id(reach.request_id)
        return reach

    def _refuser(self, endpoint: str) -> Callable[[ReachError, Stage], Response]:
        """The layer's refusals for ``endpoint``, counted like every refusal of the gateway."""
        return lambda exc, stage: self._refusal(endpoint, exc)

    def _refusal(self, endpoint: str, exc: ReachError, request_id: str | None = None) -> Response:
        """A 4xx/5xx JSON answer (the server layer ends the connection when the body was left unread)."""
        status = exc.http_status
        if isinstance(exc, ConfigError):
            log.error("request %s failed on the gateway's configuration: %s", request_id, exc.message)
            exc = type(exc)("the gateway's configuration cannot serve this request; its log names the problem")
        headers = {}
        retry_after = getattr(exc, "retry_after", None)
        if isinstance(exc, Backpressure | RateLimited):
            headers["Retry-After"] = str(max(1, round(retry_after or self.retry_after)))
        self.metrics.inc(REFUSED, {"type": exc.error_type})
        self.metrics.inc(REQUESTS, {"endpoint": endpoint, "status": str(status)})
        return _json(error_body(exc, request_id), status, headers)

    def _span(self, headers: Mapping[str, str], reach: ReachRequest, name: str) -> Span:
        """A server span, child of the caller's ``traceparent`` when there is one."""
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

    async def _counted(self, request: Request, serve: Callable[[], Awaitable[Response]]) -> Response:
        """Around ``POST /v1/reach``: a place in flight, the latency, a 500 with an error id for a bug of ours."""
        started = time.perf_counter()
        self.inflight += 1
        try:
            return await serve()
        except Exception as exc:
            return self._crash("reach", exc)
        finally:
            self.inflight -= 1
            self.metrics.observe(LATENCY, time.perf_counter() - started, {"endpoint": "reach"})

    async def reach(self, inbound: Inbound) -> Response:
        try:
            reach = self._admit(inbound)
        except ReachError as exc:
            return self._refusal("reach", exc)
        headers = inbound.headers
        if HEADER_TRACEPARENT not in headers and spans_are_noop(self._tracer_provider):
            return await self._forward(reach)  # no trace to continue, none to record: no span to open
        span = self._span(headers, reach, "reach.gateway")
        try:
            with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
                response = await self.forwarder.run(reach)
                if span.is_recording():
                    end_server_span(span, response.status, response.error)
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

    async def _streamed(self, request: Request, serve: Callable[[], Awaitable[Response]]) -> Response:
        """Around ``POST /v1/reach/stream``: the place in flight is released when the ASGI call ends (a started
        stream's answer releases it), whether or not the stream ever started."""
        self.inflight += 1
        response: Response | None = None
        try:
            response = await serve()
            return response
        except Exception as exc:
            return self._crash("stream", exc)
        finally:
            if not isinstance(response, _Released):
                self.inflight -= 1

    async def reach_stream(self, inbound: Inbound) -> Response:
        stream = _Stream(self)
        try:
            return await self._reach_stream(inbound, stream)
        finally:
            if not stream.handed_over:
                await stream.release()

    async def _release(self, stream: _Stream) -> None:
        try:
            await stream.release()
        finally:
            self.inflight -= 1

    async def _reach_stream(self, inbound: Inbound, stream: _Stream) -> Response:
        try:
            reach = self._admit(inbound)
        except ReachError as exc:
            return self._refusal("stream", exc)
        stream.span = span = self._span(inbound.headers, reach, "reach.gateway.stream")
        stream.events = events = self.forwarder.stream(reach)
        try:
            with trace.use_span(span, end_on_exit=False):
                first = await anext(events, StreamEvent("end"))
        except ReachError as exc:
            return self._refusal("stream", exc, reach.request_id)
        stream.handed_over = True
        return _Released(self._frames(first, events, stream), lambda: self._release(stream))

    async def _frames(
        self, first: StreamEvent, events: AsyncIterator[StreamEvent], stream: _Stream
    ) -> AsyncIterator[bytes]:
        """SSE frames in the agent's format: ``data`` chunks and media parts in chunks, then ``end`` or ``error``."""
        event = first
        while not event.last:
            if event.media is not None:
                for frame in sse_frames(event.media):
                    yield frame
            else:
                yield encode_sse(_dumps(event.data).decode(), "data")
            event = await anext(events, StreamEvent("end"))
        if event.kind == "end":
            stream.status = "success"
            yield encode_sse("", "end")
        else:
            error = event.error or ErrorInfo(type="transient", message="the stream failed without details")
            yield encode_sse(_dumps(error.model_dump(exclude_none=True)).decode(), "error")

    async def agents(self, inbound: Inbound) -> Response:
        client = inbound.request.client
        tenant = inbound.caller
        return _json({"tenant": tenant, "agents": self.forwarder.visible(tenant, client.host if client else None)})

    async def loops(self, inbound: Inbound) -> Response:
        """The dependency loops among the agents the caller may reach: pairs reaching each other too often."""
        client = inbound.request.client
        tenant = inbound.caller
        return _json({"tenant": tenant, "loops": self.forwarder.loops(tenant, client.host if client else None)})

    def _gauges(self) -> None:
        self.metrics.set(INFLIGHT, self.inflight)
        self.metrics.set(LOOPS, self.forwarder.pipeline.loops.looping)

    async def _mcp_counted(self, request: Request, serve: Callable[[], Awaitable[Response]]) -> Response:
        """Around ``/mcp``: counted in flight (over ``max_inflight``: 429, come back) and in the request metrics."""
        self.inflight += 1
        try:
            if self.inflight > self.max_inflight:
                return Response(status_code=Backpressure.http_status, headers={"Retry-After": f"{self.retry_after:g}"})
            answer = await serve()
        finally:
            self.inflight -= 1
        self.metrics.inc(REQUESTS, {"endpoint": "mcp", "status": str(answer.status_code)})
        return answer

    async def healthz(self, inbound: Inbound) -> Response:
        if self.worker is None:
            return JSONResponse({"status": "alive"})
        return JSONResponse({"status": "alive", "worker": self.worker})

    async def readyz(self, inbound: Inbound) -> Response:
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if not self.forwarder.table.agents():
            return JSONResponse({"status": "no agents registered"}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def metrics_text(self, inbound: Inbound) -> Response:
        return Response(await self.metrics.scrape(), media_type=CONTENT_TYPE)

    async def _scraper(self, request: Request, headers: Mapping[str, str]) -> None:
        """The auth rule of ``/metrics`` when the metrics have a token: that bearer, nothing else."""
        if not scrape_allowed(self.metrics.token, headers.get("authorization")):
            raise Unauthenticated("GET /metrics needs the metrics token: Authorization: Bearer <token>")

    async def _operator(self, request: Request, headers: Mapping[str, str]) -> None:
        """The auth rule of the operator's trace stream: the metrics token, which must be set (traces show tenants
        and payloads)."""
        token = self.metrics.token
        if token is None or not scrape_allowed(token, headers.get("authorization")):
            raise Unauthenticated(
                "GET /v1/traces/stream needs the operator's token: start the gateway with --metrics-token-env VAR "
                "and send Authorization: Bearer <its value>"
            )

    async def traces(self, inbound: Inbound) -> Response:
        """The recent traces, then each new one, as server-sent events (one JSON ``ReachTrace`` per event)."""
        recent = self.recent
        assert recent is not None  # the route exists only with it
        queue = recent.follow()

        async def frames() -> AsyncIterator[bytes]:
            while True:
                try:
                    line = await asyncio.wait_for(queue.get(), KEEPALIVE)
                except TimeoutError:
                    yield b": keep-alive\n\n"  # a gone follower is noticed on the next write
                    continue
                if line == RecentTraces.END:
                    return
                yield b"data: " + line.encode() + b"\n\n"

        async def release() -> None:
            recent.leave(queue)

        return _Released(frames(), release)

    # ------------------------------------------------------------------ app

    def app(self) -> ServerApp:
        """Every route declared through the server layer (:mod:`reach_plugins.server.layer`); ``POST /v1/reach``
        is its hot path, past the router's walk."""

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            self.draining = False
            await self.forwarder.start()
            port = self.metrics_port
            scrapes = None if port is None else self.metrics.serve_http(self.metrics_host, port)
            watching = asyncio.create_task(
                self.metrics.reach.watch(self.forwarder.registry, registrations=True), name="reach registry metrics"
            )
            try:
                yield
            finally:
                self.draining = True
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
                if scrapes is not None:
                    await asyncio.to_thread(scrapes.shutdown)
                    scrapes.server_close()
                await self.forwarder.aclose()

        limits, large = self.limits, self.large
        bodies = limits.with_media(self.max_media_bytes)
        mcp = McpEndpoint(self.forwarder, metrics=self.metrics.reach)
        routes = [
            ServerRoute(
                "/v1/reach",
                ("POST",),
                self.reach,
                auth=self._gate,
                body=WireBody,
                limits=bodies,
                large=large,
                json_only=True,
                refuse=self._refuser("reach"),
                around=self._counted,
            ),
            ServerRoute(
                "/v1/reach/stream",
                ("POST",),
                self.reach_stream,
                auth=self._gate,
                body=WireBody,
                limits=bodies,
                large=large,
                json_only=True,
                refuse=self._refuser("stream"),
                around=self._streamed,
            ),
            ServerRoute("/v1/agents", ("GET",), self.agents, auth=self.caller, refuse=self._refuser("agents")),
            ServerRoute("/v1/loops", ("GET",), self.loops, auth=self.caller, refuse=self._refuser("loops")),
            ServerRoute("/healthz", ("GET",), self.healthz, auth=OPEN),
            ServerRoute("/readyz", ("GET",), self.readyz, auth=OPEN),
            *self._metrics_routes(),
            *(
                [ServerRoute("/v1/traces/stream", ("GET",), self.traces, auth=self._operator)]
                if self.recent is not None
                else []
            ),
            *mcp.routes(self.caller, limits=limits, large=large, around=self._mcp_counted),
            *OpsPage(self.forwarder, self.reaches, token=self.metrics.token).routes(),
        ]
        if self.issuer is not None:
            routes += issuer_routes(self.issuer, self.access.authenticate, limits=limits, agents=self.exchangers)
        return ServerApp(routes, lifespan=lifespan, hot="/v1/reach")

    def _metrics_routes(self) -> list[ServerRoute]:
        if self.metrics_port is not None:
            return []
        auth = OPEN if self.metrics.token is None else self._scraper
        return [ServerRoute("/metrics", ("GET",), self.metrics_text, auth=auth)]
