"""GrpcNodeTransport: reach agents through a Reach node over gRPC (grpc.aio).

The node routes, queues, injects credentials and retries (``owns_retries``):
the client's core sends each request once. The attempt's budget is the gRPC
deadline and ``x-reach-deadline``; the other headers travel as metadata.
A full queue answers with the ``Backpressure`` message, which becomes a reply
of error type ``backpressure`` carrying the node's ``retry_after`` hint.
Callback mode: :meth:`GrpcNodeTransport.submit` returns a ticket at once;
:meth:`GrpcNodeTransport.result` fetches the outcome, or the node pushes it
to the callback named at submit time.
"""

from __future__ import annotations

from typing import Any

import grpc

from reach_plugins.errors import (
    Backpressure,
    ConfigError,
    ConnectError,
    ConnectionLost,
    InvalidResponse,
    MediaTooLarge,
    ReachError,
    ReadTimeout,
    RemoteError,
    RequestError,
)
from reach_plugins.model import ErrorInfo, ReachRequest, ReachResponse
from reach_plugins.telemetry.spans import note_rpc
from reach_plugins.transport import BaseTransport, Call, Credential, EventStream, Reply, StreamEvent
from reach_plugins.wire.body import MAX_REPLY, refusal
from reach_plugins.wire.headers import ERROR_TYPE, RETRY_AFTER
from reach_plugins.wire.media_stream import MediaAssembler
from reach_plugins.wire.proto import reach_pb2 as pb
from reach_plugins.wire.proto import reach_pb2_grpc as pb_grpc
from reach_plugins.wire.protocodec import (
    backpressure_reply,
    call_message,
    call_metadata,
    dumps,
    error_info,
    loads,
    metadata_lookup,
    reply_from_result,
    response_from_result,
    start_of,
)

NODE_SCHEME = "grpc://"
_CALL = "reach.v1.ReachNode/Call"
_STREAM = "reach.v1.ReachNode/Stream"
"""``rpc.method`` of the node's two RPCs (fully qualified, as the RPC conventions ask)."""


def _refusal(exc: grpc.aio.AioRpcError) -> ReachError | None:
    """A node's deliberate refusal (it names the error's wire code in its trailers), as the error it names."""
    trailers = metadata_lookup(exc.trailing_metadata())
    kind = trailers.get(ERROR_TYPE)
    if kind is None:
        return None
    try:
        retry_after = float(trailers[RETRY_AFTER]) if RETRY_AFTER in trailers else None
    except ValueError:
        retry_after = None
    return refusal(kind, exc.details() or kind, retry_after)


def _mapped(exc: grpc.aio.AioRpcError, target: str) -> ReachError:
    """A gRPC failure as ours: only a failed connect proves the node never saw the request."""
    code = exc.code()
    details = exc.details() or code.name
    where = f"the Reach node at {target}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return ReadTimeout(f"no answer from {where} in time")
    if code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in details.lower():
        return ConnectError(f"cannot connect to {where}: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return ConnectionLost(f"the connection to {where} broke: {details}")
    return RemoteError(f"{where} failed with {code.name}: {details}")


_RECEIVE = "grpc.max_receive_message_length"


class GrpcNodeTransport(BaseTransport):
    """Send each call to the Reach node at ``target`` (``host:port``).

    ``token`` is the bearer token presented to the node. With
    ``use_credential=True`` (node-to-node forwarding) a call's bearer
    credential is presented instead: the tenant's credential for the next node.
    ``credentials`` (``grpc.ssl_channel_credentials(...)``) reach a node served over TLS.
    """

    owns_retries = True

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        use_credential: bool = False,
        options: list[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        target = target.removeprefix(NODE_SCHEME).rstrip("/")
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"a Reach node target is 'host:port' (or grpc://host:port), got {target!r}")
        self.target = target
        self.hop: str | None = f"grpc://{target}"
        self._token = token
        self._use_credential = use_credential
        self._options = list({_RECEIVE: MAX_REPLY, **dict(options or [])}.items())
        """Channel options; replies up to :data:`MAX_REPLY` (data and media parts) by default, not grpc's 4 MiB."""
        self._credentials = credentials
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    def _node(self) -> Any:
        if self._stub is None:
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
            else:
                self._channel = grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
            self._stub = pb_grpc.ReachNodeStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def _token_for(self, credential: Credential) -> str | None:
        if self._use_credential and credential.type == "bearer" and credential.value:
            return credential.value
        return self._token

    async def send(self, call: Call) -> Reply:
        metadata = call_metadata(call, self._token_for(call.credential))
        note_rpc(call.span, self.target, _CALL)
        try:
            reply = await self._node().Call(call_message(call), timeout=call.timeout, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            note_rpc(call.span, self.target, _CALL, exc.code().name)
            raise (_refusal(exc) or _mapped(exc, self.target)) from exc
        note_rpc(call.span, self.target, _CALL, grpc.StatusCode.OK.name)
        if reply.HasField("backpressure"):
            return backpressure_reply(reply.backpressure)
        return reply_from_result(call, reply.result)

    async def stream(self, call: Call) -> EventStream:
        """Stream events; backpressure or a failure before the first event raises (the core may retry)."""
        metadata = call_metadata(call, self._token_for(call.credential))
        note_rpc(call.span, self.target, _STREAM)
        responses = self._node().Stream(call_message(call), timeout=call.timeout, metadata=metadata)
        limit = call.media_limit
        media = MediaAssembler(limit=limit, capability=call.request.capability)
        try:
            async for reply in responses:
                kind = reply.WhichOneof("kind")
                if kind == "backpressure":
                    hint = reply.backpressure
                    raise Backpressure(hint.reason or "the node's queue is full", retry_after=hint.retry_after or None)
                try:
                    event = _event(reply, kind, media)
                except MediaTooLarge as exc:
                    event = StreamEvent.failed(exc)
                if event is None:
                    continue
                if event.last:
                    note_rpc(call.span, self.target, _STREAM, grpc.StatusCode.OK.name)
                yield event
                if event.last:
                    return
            yield StreamEvent("error", error=ErrorInfo(type="transient", message="the node's stream ended early"))
        except grpc.aio.AioRpcError as exc:
            note_rpc(call.span, self.target, _STREAM, exc.code().name)
            raise (_refusal(exc) or _mapped(exc, self.target)) from exc
        finally:
            responses.cancel()

    async def submit(self, request: ReachRequest, *, callback: str | None = None, timeout: float = 10.0) -> str:
        """Callback mode: hand ``request`` to the node and get its ticket at once.

        Raises :class:`~reach_plugins.errors.Backpressure` (with the node's
        ``retry_after``) when its queue is full: the request was not taken.
        """
        message = pb.SubmitRequest(call=_submitted(request), callback=callback or "")
        metadata = (("authorization", f"Bearer {self._token}"),) if self._token else ()
        try:
            reply = await self._node().Submit(message, timeout=timeout, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            raise (_refusal(exc) or _mapped(exc, self.target)) from exc
        if reply.HasField("backpressure"):
            hint = reply.backpressure
            raise Backpressure(hint.reason or "the node's queue is full", retry_after=hint.retry_after or None)
        ticket: str = reply.ticket.ticket
        return ticket

    async def result(self, ticket: str, *, wait: float = 0.0) -> ReachResponse | None:
        """The outcome of a ticket, waiting up to ``wait`` seconds; ``None`` while it is still pending."""
        metadata = (("authorization", f"Bearer {self._token}"),) if self._token else ()
        message = pb.ResultRequest(ticket=ticket, wait_ms=int(wait * 1000))
        try:
            reply = await self._node().Result(message, timeout=wait + 10.0, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            raise _mapped(exc, self.target) from exc
        if reply.state == pb.UNKNOWN:
            raise RequestError(f"ticket {ticket!r} is unknown to the node at {self.target} (never issued, or expired)")
        if reply.state == pb.PENDING:
            return None
        return response_from_result(reply.result)

    async def aclose(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None


def _event(reply: pb.StreamReply, kind: str | None, media: MediaAssembler) -> StreamEvent | None:
    """The event one message completes (``None`` while a media part is still arriving)."""
    if kind == "media_start":
        media.start(start_of(reply.media_start))
        return None
    if kind == "media_chunk":
        media.add(reply.media_chunk)
        return None
    if kind == "media_end":
        return StreamEvent("media", media=media.end())
    if media.open:
        raise InvalidResponse(f"a {kind!r} message came inside a media part of the node's stream")
    if kind == "data":
        return StreamEvent("data", loads(reply.data, "a stream chunk"))
    return StreamEvent("end") if kind == "end" else StreamEvent("error", error=error_info(reply.error))


def _submitted(request: ReachRequest) -> pb.ReachCall:
    """The body of a callback-mode request (its budget is the request's own ``timeout_ms``)."""
    return pb.ReachCall(
        request_id=request.request_id,
        capability=request.capability,
        action=request.action or "",
        payload=dumps(request.payload),
        session_id=request.session_id or "",
        tenant=request.tenant or "",
        idempotency_key=request.idempotency_key or "",
        deadline_ms=request.timeout_ms or 0,
        intent=request.intent or "",
        priority=pb.BATCH if request.priority == "batch" else pb.ONLINE,
        scope_tags=request.scope_tags,
    )
