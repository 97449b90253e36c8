"""The node's share of the server layer: the caller is checked from the call's metadata before its message is decoded.

gRPC decodes a request message before a servicer sees it, so a check in
the servicer comes after the decoding. :class:`AuthFirst` builds the node's
method handlers without a request deserializer: each receives its message as
bytes, reads the metadata (one value per auth header, no forwarding loop
through this node, a valid token for a tenant), aborts a refused call without
decoding it, else decodes it strictly (bytes that are no such message are
INVALID_ARGUMENT naming the method; gRPC itself would answer UNKNOWN and log a
traceback) and hands the servicer the message with the admitted :class:`Caller`,
so the metadata is read and the token checked once a call. The handlers are
built once and registered with the server (no interceptor runs per call). The
message's size is bounded by ``grpc.max_receive_message_length`` (the node's
default options) and each call's time by its deadline (else the forwarder's
default timeout).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Caller:
    """Who the gate admitted: the call's metadata (lowercase keys, one value each) and the token's tenant."""

    metadata: dict[str, str]
    tenant: str | None
    """``None`` only on an open node whose caller names no tenant."""


Unary = Callable[[Any, Any, Caller], Awaitable[Any]]
"""A servicer method answering one message: ``(message, context, caller) -> reply``."""
Streaming = Callable[[Any, Any, Caller], AsyncIterator[Any]]
"""A servicer method streaming its replies: ``(message, context, caller) -> replies``."""


class AuthFirst:
    """The node's method handlers: refuse a call whose metadata carries no valid tenant token before decoding it."""

    def __init__(self, access: Access, refuse: Refuse, *, node_id: str, service: str) -> None:
        self._access = access
        self._refuse = refuse
        self._node_id = node_id
        self._service = service

    def unary(self, name: str, serve: Unary, message: Any, reply: Any) -> grpc.RpcMethodHandler:
        """The handler of unary method ``name`` (request type ``message``, reply type ``reply``)."""
        admit = self._admitter(name, message)

        async def handler(request: bytes, context: Any) -> Any:
            caller, decoded = await admit(request, context)
            return await serve(decoded, context, caller)

        return grpc.unary_unary_rpc_method_handler(handler, response_serializer=reply.SerializeToString)

    def streaming(self, name: str, serve: Streaming, message: Any, reply: Any) -> grpc.RpcMethodHandler:
        """The handler of server-streaming method ``name``."""
        admit = self._admitter(name, message)

        async def handler(request: bytes, context: Any) -> AsyncIterator[Any]:
            caller, decoded = await admit(request, context)
            async for answer in serve(decoded, context, caller):
                yield answer

        return grpc.unary_stream_rpc_method_handler(handler, response_serializer=reply.SerializeToString)

    def _admitter(self, name: str, message: Any) -> Callable[[bytes, Any], Awaitable[tuple[Caller, Any]]]:
        """``(bytes, context) -> (caller, message)``: the checks in order, then the strict decoding."""
        refuse, decode, method = self._refuse, message.FromString, f"/{self._service}/{name}"

        async def admit(request: bytes, context: Any) -> tuple[Caller, Any]:
            try:
                caller = self._caller(context.invocation_metadata() or ())
            except ReachError as exc:
                await refuse(context, exc)
            try:
                return caller, decode(request)
            except DecodeError:
                await refuse(context, RequestError(f"{method}: the bytes sent are not this call's protobuf message"))

        return admit

    def _caller(self, invocation_metadata: Any) -> Caller:
        metadata = single_headers(invocation_metadata)
        self._no_loop(metadata.get(_VIA))
        tenant = self._access.authenticate(metadata.get(_AUTHORIZATION), metadata.get("x-tenant"))
        return Caller(metadata, tenant)

    def _no_loop(self, via: str | None) -> None:
        """``LoopDetected`` when the call already passed this node (a config error, named before the caller)."""
        if via and self._node_id in via.split(","):
            raise LoopDetected(
                f"node forwarding loop: this request already passed node {self._node_id} (via {via}); "
                "fix the grpc:// endpoints so the nodes do not point at each other"
            )
