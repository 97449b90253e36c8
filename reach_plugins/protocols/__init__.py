"""Protocol adapters: build the downstream HTTP request for a call, normalise the reply.

Pure functions of plain data (no HTTP library is imported here), so every wire
engine and the gateway share them. ``adapter_for(agent.protocol)`` picks one.
"""

from __future__ import annotations

from reach_plugins.errors import ConfigError
from reach_plugins.protocols.a2a import A2AAdapter
from reach_plugins.protocols.base import (
    Adapter,
    Exchange,
    HttpRequest,
    HttpResponse,
    StreamDecoder,
    check_return,
    decoded,
    parse_retry_after,
    reach_headers,
)
from reach_plugins.protocols.mcp import McpAdapter
from reach_plugins.protocols.mcp_stream import answering_elicitation
from reach_plugins.protocols.openai import OpenAIAdapter
from reach_plugins.protocols.rawhttp import RawHttpAdapter
from reach_plugins.protocols.reach import ReachAdapter
from reach_plugins.wire.sse import SseDecoder, SseEvent, encode_sse

ADAPTERS: dict[str, Adapter] = {
    adapter.protocol: adapter
    for adapter in (ReachAdapter(), OpenAIAdapter(), RawHttpAdapter(), A2AAdapter(), McpAdapter())
}


def adapter_for(protocol: str) -> Adapter:
    """The adapter of ``protocol`` (``reach``, ``openai-compatible``, ``raw-http``, ``a2a``, ``mcp``)."""
    try:
        return ADAPTERS[protocol]
    except KeyError:
        raise ConfigError(f"unknown agent protocol {protocol!r}; use one of: {', '.join(sorted(ADAPTERS))}") from None


__all__ = [
    "ADAPTERS",
    "A2AAdapter",
    "Adapter",
    "Exchange",
    "HttpRequest",
    "HttpResponse",
    "McpAdapter",
    "OpenAIAdapter",
    "RawHttpAdapter",
    "ReachAdapter",
    "SseDecoder",
    "SseEvent",
    "StreamDecoder",
    "adapter_for",
    "answering_elicitation",
    "check_return",
    "decoded",
    "encode_sse",
    "parse_retry_after",
    "reach_headers",
]
