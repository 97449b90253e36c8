"""The ``ReachNode`` gRPC service: ``Call``, ``Stream``, ``Submit`` and ``Result`` over one forwarder and one queue.

Each request arrives authenticated from its metadata (``authorization``, by
the gate of :mod:`reach_plugins.node.gate`), its remaining budget is
``min(x-reach-deadline, gRPC deadline)``, and it runs under a server span
continuing the caller's ``traceparent``. Refusals end the RPC with a gRPC
status plus ``x-reach-error-type`` / ``x-reach-http-status`` trailers; a full
queue is answered with the ``Backpressure`` message instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import nullcontext
from typing import Any, Final, NoReturn

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, TracerProvider

from reach_plugins.errors import Backpressure, ConfigError, ReachError
from reach_plugins.media import MAX_MEDIA_BYTES
from reach_plugins.model import ErrorInfo, ReachRequest, ReachResponse
from reach_plugins.node.gate import Caller
from reach_plugins.node.queue import WorkQueue
from reach_plugins.node.tickets import Tickets
from reach_plugins.server.access import Access
from reach_plugins.server.forwarder import Forwarder
from reach_plugins.server.inbound import loads
from reach_plugins.telemetry.logs import bind_request_id
from reach_plugins.telemetry.spans import (
    ATTR_CAPABILITY,
    ATTR_REQUEST_ID,
    ATTR_TENANT,
    end_server_span,
    get_tracer,
    spans_are_noop,
)
from reach_plugins.transport import EventStream, StreamEvent
from reach_plugins.wire.body import to_request
from reach_plugins.wire.headers import (
    CALLBACK_ERROR,
    CALLBACK_STATUS,
    ERROR_TYPE,
    HEADER_AUTHORIZATION,
    HEADER_DEADLINE,
    HEADER_TRACEPARENT,
    HTTP_STATUS,
    RETRY_AFTER,
)
from reach_plugins.wire.proto import reach_pb2 as pb
from reach_plugins.wire.protocodec import (
    body_from_message,
    dumps,
    error_message,
    media_parts,
    media_replies,
    result_message,
)
from reach_plugins.wire.redact import without_addresses

log = logging.getLogger("reach_plugins.node")


Context = Any
"""``grpc.aio.ServicerContext`` (grpc ships no type information)."""

_AUTHORIZATION: Final = HEADER_AUTHORIZATION.lower()
_TENANT: Final = "x-tenant"
_DEADLINE: Final = HEADER_DEADLINE.lower()
_TRACEPARENT: Final = HEADER_TRACEPARENT.lower()
_NO_SPAN: Final = nullcontext()
"""Where there is no span to make current (no SDK, no caller's trace)."""


def peer_address(peer: str) -> str | None:
    """The IP address in a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``), else ``None``."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or None
    return None


def _backpressure(exc: Backpressure) -> pb.Backpressure:
    return pb.Backpressure(retry_after=exc.retry_after or 0.0, reason=exc.message)


class NodeService:
    """The node's RPCs (method names follow the proto), each served behind :class:`~reach_plugins.node.gate.AuthFirst`:
    it takes the decoded message, the servicer context and the admitted :class:`~reach_plugins.node.gate.Caller`."""

    def __init__(
        self,
        forwarder: Forwarder,
        access: Access,
        *,
        queue: WorkQueue,
        tickets: Tickets,
        node_id: str,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        self.forwarder = forwarder
        self.access = access
        self.queue = queue
        self.tickets = tickets
        self.node_id = node_id
        self._tracer_provider = tracer_provider
        self._tracer = get_tracer(tracer_provider)
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ admission

    def _admit(self, message: pb.ReachCall, context: Context, caller: Caller) -> tuple[ReachRequest, dict[str, str]]:
        """The request to run and its metadata (lowercase keys); a ReachError says why not.

        The node's gate (:mod:`reach_plugins.node.gate`) already refused loops
        and unknown callers before the message was decoded and named the
        token's tenant; the payload is decoded once (strictly), and the token is
        looked up again only when the body names a tenant other than the token's.
        """
        metadata = caller.metadata
        claimed = metadata.get(_TENANT)
        tenant = caller.tenant
        remaining = context.time_remaining()
        if remaining is not None:
            budget = int(remaining * 1000)
            given = metadata.get(_DEADLINE, "")
            digits = given.isascii() and given.isdigit()
            metadata[_DEADLINE] = str(min(budget, int(given)) if digits else max(0, budget))
        payload = loads(message.payload, what="payload") if message.payload else None
        body = body_from_message(message, payload)
        if claimed is None and body.tenant and (self.access.open or body.tenant != tenant):
            tenant = self.access.authenticate(metadata.get(_AUTHORIZATION), body.tenant)
        source = peer_address(context.peer())
        media = media_parts(message.media, limit=MAX_MEDIA_BYTES, capability=body.capability)
        request = to_request(body, lambda name: metadata.get(name.lower()), tenant=tenant, source=source, media=media)
        bind_request_id(request.request_id)
        return request, metadata

    async def refuse(self, context: Context, exc: ReachError) -> NoReturn:
        """Abort the call with the error's gRPC code, its wire code and HTTP status in the trailers."""
        message = without_addresses(exc.message)
        if isinstance(exc, ConfigError):
            log.error("the node's configuration cannot serve a request: %s", exc.message)
            message = "the node's configuration cannot serve this request; its log names the problem"
        trailers: tuple[tuple[str, str], ...] = ((ERROR_TYPE, exc.error_type), (HTTP_STATUS, str(exc.http_status)))
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            trailers += ((RETRY_AFTER, repr(float(retry_after))),)
        abort: Callable[..., Awaitable[NoReturn]] = context.abort
        await abort(grpc.StatusCode[exc.grpc_code], message, trailers)

    def _span(self, metadata: Mapping[str, str], request: ReachRequest, name: str) -> Span | None:
        """A server span, child of the caller's ``traceparent`` when there is one.

        ``None`` when it would be an invalid no-op span (no SDK and no parent):
        there is then nothing to record and nothing to propagate.
        """
        traceparent = _TRACEPARENT in metadata
        if not traceparent and spans_are_noop(self._tracer_provider):
            return None
        # metadata keys are lowercase already: the default getter finds traceparent without scanning
        parent = propagate.extract(metadata) if traceparent else None
        span = self._tracer.start_span(f"{name} {request.capability}", context=parent, kind=SpanKind.SERVER)
        if span.is_recording():
            span.set_attribute(ATTR_CAPABILITY, request.capability)
            span.set_attribute(ATTR_REQUEST_ID, request.request_id)
            if request.tenant:
                span.set_attribute(ATTR_TENANT, request.tenant)
        return span

    # ------------------------------------------------------------------ RPCs

    async def Call(self, message: pb.ReachCall, context: Context, caller: Caller) -> pb.CallReply:
        try:
            request, metadata = self._admit(message, context, caller)
            span = self._span(metadata, request, "reach.node")
            with _NO_SPAN if span is None else trace.use_span(span, end_on_exit=True):
                async with self.queue.slot(request.priority):
                    response = await self.forwarder.run(request)
                if span is not None:
                    end_server_span(span, response.status, response.error)
        except Backpressure as exc:
            return pb.CallReply(backpressure=_backpressure(exc))
        except ReachError as exc:
            await self.refuse(context, exc)
        return pb.CallReply(result=result_message(response))

    async def Stream(self, message: pb.ReachCall, context: Context, caller: Caller) -> AsyncIterator[pb.StreamReply]:
        try:
            request, metadata = self._admit(message, context, caller)
        except ReachError as exc:
            await self.refuse(context, exc)
        span = self._span(metadata, request, "reach.node.stream")
        events: EventStream | None = None
        try:
            async with self.queue.slot(request.priority):
                with _NO_SPAN if span is None else trace.use_span(span, end_on_exit=False):
                    events = self.forwarder.stream(request)
                    event = await anext(events, None)
                while event is not None:
                    for reply in _stream_replies(event):
                        yield reply
                    event = None if event.last else await anext(events, None)
        except Backpressure as exc:
            yield pb.StreamReply(backpressure=_backpressure(exc))
        except ReachError as exc:
            await self.refuse(context, exc)
        finally:
            if events is not None:
                await events.aclose()
            if span is not None:
                span.end()

    async def Submit(self, message: pb.SubmitRequest, context: Context, caller: Caller) -> pb.SubmitReply:
        try:
            request, _ = self._admit(message.call, context, caller)
            callback = self.tickets.check(message.callback) if message.callback else None
        except ReachError as exc:
            await self.refuse(context, exc)
        if self.queue.full or self.tickets.full:
            return pb.SubmitReply(backpressure=_backpressure(self.queue.refusal()))
        ticket = self.tickets.issue(callback, request.tenant)
        task = asyncio.create_task(self._run_ticket(ticket, request), name=f"reach ticket {ticket}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return pb.SubmitReply(ticket=pb.Ticket(ticket=ticket, node=self.node_id))

    async def Result(self, message: pb.ResultRequest, context: Context, caller: Caller) -> pb.ResultReply:
        """A ticket's state, for the tenant that submitted it only (another's is as unknown as a made-up one).

        Once a callback was tried, trailers ``x-reach-callback`` (``delivered`` /
        ``failed``) and ``x-reach-callback-error`` say how the push went.
        """
        tenant = caller.tenant
        try:
            response = await self.tickets.wait(message.ticket, min(max(0, message.wait_ms), 60_000) / 1000.0, tenant)
            delivered, why = self.tickets.delivery(message.ticket, tenant)
        except KeyError:
            return pb.ResultReply(state=pb.UNKNOWN)
        if delivered is not None:
            outcome = (CALLBACK_STATUS, "delivered" if delivered else "failed")
            context.set_trailing_metadata((outcome, (CALLBACK_ERROR, why)) if why else (outcome,))
        if response is None:
            return pb.ResultReply(state=pb.PENDING)
        return pb.ResultReply(state=pb.DONE, result=result_message(response))

    # ------------------------------------------------------------------ callback mode

    async def _run_ticket(self, ticket: str, request: ReachRequest) -> None:
        """Run a submitted request (it already holds its place: the queue is not re-checked) and record it."""
        try:
            async with self.queue.slot(request.priority, bounded=False):
                response = await self.forwarder.run(request)
        except ReachError as exc:
            error = ErrorInfo(type=exc.error_type, message=exc.message)
            response = ReachResponse(request_id=request.request_id, status="fail", error=error)
        await self.tickets.complete(ticket, response, request.tenant)

    async def aclose(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.tickets.aclose()


def _stream_replies(event: StreamEvent) -> Iterator[pb.StreamReply]:
    """The messages of one event: a data chunk, a media part in chunks, the end or the error."""
    if event.kind == "data":
        yield pb.StreamReply(data=dumps(event.data))
    elif event.kind == "media" and event.media is not None:
        yield from media_replies(event.media)
    elif event.kind == "end":
        yield pb.StreamReply(end=True)
    else:
        error = event.error or ErrorInfo(type="transient", message="the stream failed without details")
        yield pb.StreamReply(error=error_message(error))
