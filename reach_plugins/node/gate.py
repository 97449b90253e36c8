"""The node's share of the server layer: the caller is checked from the call's metadata before its message is decoded.

gRPC decodes a request message before the servicer sees it, so a check in
the servicer comes after the decoding. :class:`AuthFirst` is a server
interceptor: it reads the metadata (one value per auth header, no forwarding
loop through this node, a valid token for a tenant) while the message is still bytes, and answers a refused call
with a handler that never deserializes it; an admitted call's message is
then decoded here, bytes that are no such message refused as INVALID_ARGUMENT
naming it (gRPC itself would answer UNKNOWN and log a traceback). The message's size is bounded by
``grpc.max_receive_message_length`` (the node's default options) and each
call's time by its deadline (else the forwarder's default timeout).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from reach_plugins.errors import LoopDetected, ReachError, RequestError
from reach_plugins.server.access import Access
from reach_plugins.server.inbound import single_headers
from reach_plugins.wire.headers import HEADER_AUTHORIZATION, HEADER_VIA

Refuse = Callable[[Any, ReachError], Awaitable[NoReturn]]
"""``(servicer context, error) -> never``: aborts the call with the error's gRPC code and trailers."""
_AUTHORIZATION = HEADER_AUTHORIZATION.lower()
_VIA = HEADER_VIA.lower()


class AuthFirst(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuse a call whose metadata carries no valid tenant token before its message is decoded; decode it strictly."""

    def __init__(self, access: Access, refuse: Refuse, *, node_id: str) -> None:
        self._access = access
        self._refuse = refuse
        self._node_id = node_id

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        refused: ReachError | None = None
        try:
            metadata = single_headers(details.invocation_metadata or ())
            self._no_loop(metadata.get(_VIA))
            self._access.authenticate(metadata.get(_AUTHORIZATION), metadata.get("x-tenant"))
        except ReachError as exc:
            refused = exc
        return self._raw(handler, details.method, refused)

    def _no_loop(self, via: str | None) -> None:
        """``LoopDetected`` when the call already passed this node (a config error, named before the caller)."""
        if via and self._node_id in via.split(","):
            raise LoopDetected(
                f"node forwarding loop: this request already passed node {self._node_id} (via {via}); "
                "fix the grpc:// endpoints so the nodes do not point at each other"
            )

    def _raw(self, handler: Any, method: str, refused: ReachError | None) -> Any:
        """``handler`` taking its message as bytes: aborted with ``refused``, else decoded strictly, then served."""
        refuse, decode = self._refuse, handler.request_deserializer

        async def message(request: bytes, context: Any) -> Any:
            if refused is not None:
                await refuse(context, refused)
            try:
                return decode(request)
            except DecodeError:
                await refuse(context, RequestError(f"{method}: the bytes sent are not this call's protobuf message"))

        async def unary(request: bytes, context: Any) -> Any:
            return await handler.unary_unary(await message(request, context), context)

        async def streaming(request: bytes, context: Any) -> AsyncIterator[Any]:
            async for reply in handler.unary_stream(await message(request, context), context):
                yield reply

        serialize = handler.response_serializer
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(streaming, response_serializer=serialize)
        return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serialize)
