"""Every header and metadata key of the wire (DESIGN.md section 4): HTTP headers, gRPC metadata, request metadata.

One home, so a gateway, a node, an agent and every transport spell each name alike.
"""

from typing import Final

# HTTP headers (DESIGN.md section 4)
HEADER_TRACEPARENT: Final = "traceparent"
HEADER_AUTHORIZATION: Final = "Authorization"
HEADER_TENANT: Final = "X-Tenant"
HEADER_IDEMPOTENCY_KEY: Final = "Idempotency-Key"
HEADER_DEADLINE: Final = "X-Reach-Deadline"
HEADER_HOPS: Final = "X-Reach-Hops"
HEADER_TOKEN: Final = "X-Reach-Token"
"""The header carrying the per-hop token: its own, never the downstream credential's (``Authorization``)."""
HEADER_RETRY: Final = "X-Reach-Retry"
RETRY_UPSTREAM: Final = "upstream"
"""``X-Reach-Retry: upstream``: a layer above retries this request, so this one must not."""
HEADER_SUMMARY: Final = "X-Reach-Summary"
"""A broadcast copy's summary of the answers already in (JSON, ASCII): the agent may skip or shorten its work."""
SUMMARY_BYTES: Final = 4096
"""Largest :data:`HEADER_SUMMARY` value sent or passed on (it travels as one header)."""
HEADER_PREFER: Final = "X-Reach-Prefer"
HEADER_TARGET: Final = "X-Reach-Target"
HEADER_VIA: Final = "X-Reach-Via"
HEADER_SOURCE: Final = "X-Reach-Source"
"""Between hops: the addresses the request came from so far, comma separated (it may only add, never vouch)."""
HEADER_TICKET: Final = "X-Reach-Ticket"
HEADER_SAFE: Final = r"^[\x20-\x7e]+$"
"""Fields that travel on as header values (``X-Tenant``, ``Idempotency-Key``): printable ASCII only."""

# gRPC metadata and trailers of the node
ERROR_TYPE: Final = "x-reach-error-type"
HTTP_STATUS: Final = "x-reach-http-status"
RETRY_AFTER: Final = "x-reach-retry-after"
"""Seconds a refused caller should wait (a gRPC trailer beside the error type; HTTP says ``Retry-After``)."""
CALLBACK_STATUS: Final = "x-reach-callback"
"""Trailer of ``Result``: ``delivered`` or ``failed``, once the ticket's callback was tried."""
CALLBACK_ERROR: Final = "x-reach-callback-error"
"""Trailer of ``Result``: why the callback push failed (its kind or HTTP status, never its URL)."""

# request metadata keys (ReachRequest.metadata)
META_SUMMARY: Final = "reach.summary"
"""Request metadata carrying :data:`HEADER_SUMMARY`'s value."""
META_CALLBACK: Final = "reach.callback"
"""Request metadata: where a node pushes the result of a callback-mode request (``http(s)://`` or ``grpc://``)."""
TARGET: Final = "reach.target"
"""Metadata key: the ``agent/instance`` that must serve this request (a broadcast copy)."""
PREFER: Final = "reach.prefer"
"""Metadata key: the ``agent/instance`` to use if it can take the request, else route as usual."""
SOURCE: Final = "reach.source"
"""Request metadata: the addresses the request came through, earlier hops' first, this server's peer last."""
VIA: Final = "reach.via"
"""Request metadata: the nodes this request was forwarded through, comma separated."""
UNKNOWN_SOURCE: Final = "unknown"
"""The source of a caller whose address the server cannot see (a unix socket): outside every network."""
