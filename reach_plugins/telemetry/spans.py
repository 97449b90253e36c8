"""Telemetry vocabulary and helpers: span and attribute names, header names, W3C context propagation.

Library code depends on ``opentelemetry-api`` only: spans are no-ops until the
application installs an SDK, and every entry point accepts an optional
``tracer_provider`` instead of touching the global one. Names live here as
``Final`` constants so spans, trace files and dashboards agree on spelling.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, MutableMapping
from importlib import metadata
from types import MappingProxyType
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import (
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)
from opentelemetry.util.types import AttributeValue

from reach_plugins.model import ErrorInfo, ReachRequest

INSTRUMENTATION_NAME: Final = "reach_plugins"

# --------------------------------------------------------------------------- span attributes
ATTR_CAPABILITY: Final = "reach.capability"
ATTR_REQUEST_ID: Final = "reach.request_id"
ATTR_TENANT: Final = "reach.tenant"
ATTR_USAGE_SOURCE: Final = "reach.usage.source"
"""``reported`` (the agent's own usage) or ``estimated`` (from streamed text)."""
ATTR_AGENT: Final = "reach.agent"
ATTR_INSTANCE: Final = "reach.instance"
ATTR_ENDPOINT: Final = "reach.endpoint"
ATTR_ROUTE_REASON: Final = "reach.route.reason"
ATTR_FALLBACK: Final = "reach.fallback"
"""``local`` when a call that reached no agent ran the local tool instead (``remote_first``)."""
ATTR_CONTEXT_RESTORE: Final = "reach.context_restore"
ATTR_DEGRADED: Final = "reach.degraded"
ATTR_HOPS: Final = "reach.hops"
ATTR_ATTEMPT: Final = "reach.attempt"
ATTR_ATTEMPTS: Final = "reach.attempts"
ATTR_OUTCOME: Final = "reach.outcome"
ATTR_STATUS: Final = "reach.status"
ATTR_DURATION_MS: Final = "reach.duration_ms"
ATTR_RETRY_DELAY_MS: Final = "reach.retry.delay_ms"
ATTR_DEDUP_HIT: Final = "reach.dedup.hit"
ATTR_BREAKER_FROM: Final = "reach.breaker.from"
ATTR_BREAKER_TO: Final = "reach.breaker.to"
ATTR_REASON: Final = "reach.reason"
ATTR_STREAM_EVENTS: Final = "reach.stream.events"
"""Data events a stream handed to its caller; with ``reach.tenant`` and ``reach.agent``, usage per tenant and agent."""
ATTR_STREAM_CHARS: Final = "reach.stream.chars"
"""Characters of text those events carried (string chunks, ``reply_content`` of chat chunks)."""
ATTR_AFFINITY: Final = "reach.route.affinity"
ATTR_RULE: Final = "reach.tool.rule"
ATTR_LOOP_PAIR: Final = "reach.dependency.pair"
"""Two agents reaching each other, ``first<->second`` (first: the direction seen first)."""
"""How a tool mapped to a capability (``map``, ``exact``, ``semantic``, ``degraded``...): the route distribution."""
ATTR_SIDE: Final = "reach.tool.side"
ATTR_RESULT: Final = "reach.result"
ATTR_ERROR_TYPE: Final = "error.type"
ATTR_ERROR_MESSAGE: Final = "reach.error.message"

# --------------------------------------------------------------------------- GenAI semantic conventions (agents, tools)
ATTR_GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
ATTR_GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
"""The protocol the reached agent speaks (:func:`provider_name`): ``reach``, ``a2a``, ``mcp``, ``raw_http``..."""
ATTR_GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
ATTR_GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
"""``{agent}/{instance}``: the replica that answered, unique in its registry."""
ATTR_GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
ATTR_GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
ATTR_GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
ATTR_GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
OPERATION_EXECUTE_TOOL: Final = "execute_tool"
OPERATION_INVOKE_AGENT: Final = "invoke_agent"
TOOL_TYPE_FUNCTION: Final = "function"
"""``gen_ai.tool.type`` of a framework's own tool (which the enhancer may send to an agent)."""
TOOL_TYPE_EXTENSION: Final = "extension"
"""``gen_ai.tool.type`` of a proxy tool: the capability lives in another agent (GenAI conventions: agent-side call)."""

# --------------------------------------------------------------------------- HTTP client / server conventions
ATTR_SERVER_ADDRESS: Final = "server.address"
ATTR_SERVER_PORT: Final = "server.port"
ATTR_URL_FULL: Final = "url.full"
ATTR_HTTP_REQUEST_METHOD: Final = "http.request.method"
ATTR_HTTP_RESPONSE_STATUS_CODE: Final = "http.response.status_code"

# --------------------------------------------------------------------------- RPC client conventions (the node)
ATTR_RPC_SYSTEM_NAME: Final = "rpc.system.name"
ATTR_RPC_METHOD: Final = "rpc.method"
"""Fully qualified: ``reach.v1.ReachNode/Call``."""
ATTR_RPC_RESPONSE_STATUS_CODE: Final = "rpc.response.status_code"
"""The gRPC status code's name (``OK``, ``UNAVAILABLE``...)."""
RPC_SYSTEM_GRPC: Final = "grpc"

# --------------------------------------------------------------------------- span events
EVENT_ATTEMPT: Final = "reach.attempt"
EVENT_RETRY: Final = "reach.retry"
EVENT_FAILOVER: Final = "reach.failover"
EVENT_GIVE_UP: Final = "reach.give_up"
EVENT_BREAKER: Final = "reach.breaker"
EVENT_CONSISTENCY: Final = "reach.consistency"
"""A reply's consistency score against its request (capabilities with ``consistency:``), and whether it was low."""
EVENT_CONSISTENCY_STATE: Final = "reach.consistency_state"
"""An instance ejected for inconsistent replies, probed, or restored."""
EVENT_OUTLIER: Final = "reach.outlier"
"""An instance judged an outlier against its peers (weight cut, ejected, on probation), or in line again."""
EVENT_DEDUP_HIT: Final = "reach.dedup_hit"
EVENT_DEDUP_WAIT: Final = "reach.dedup_wait"
EVENT_DEDUP_UNAVAILABLE: Final = "reach.dedup_unavailable"
EVENT_RATE_WAIT: Final = "reach.rate_limit_wait"
EVENT_QUOTA_WAIT: Final = "reach.quota_wait"
"""A call refused by a fleet quota waited for it, then was admitted: ``waited_ms`` and ``rechecks``."""
EVENT_STREAMED: Final = "reach.streamed"
"""End of a stream, with ``events`` and ``chars`` handed to the caller (also in the stream's trace)."""

# --------------------------------------------------------------------------- wire headers (DESIGN.md section 4)


def _version() -> str:
    try:
        return metadata.version("reach-plugins")
    except metadata.PackageNotFoundError:
        return "0"


_VERSION: Final = _version()


def invoke_agent_name(agent: str | None) -> str:
    """The CLIENT span of one reach of another agent: ``invoke_agent {agent}`` (``invoke_agent`` before routing)."""
    return f"{OPERATION_INVOKE_AGENT} {agent}" if agent else OPERATION_INVOKE_AGENT


def provider_name(protocol: str) -> str:
    """``gen_ai.provider.name`` of an agent: the protocol it speaks, in the conventions' spelling (``raw_http``)."""
    return protocol.replace("-", "_")


def tool_span_name(tool: str) -> str:
    """The span of one intercepted framework tool call: ``execute_tool {tool}`` (GenAI conventions)."""
    return f"{OPERATION_EXECUTE_TOOL} {tool}"


_DEFAULT_PORTS: Final = {"http": 80, "https": 443, "grpc": 443}


@functools.lru_cache(maxsize=1024)
def server_attributes(endpoint: str) -> Mapping[str, str | int]:
    """``server.address``, ``server.port`` and ``url.full`` of an endpoint, its user and password stripped.

    HTTP client semantic conventions: the URL never carries credentials (nor a
    query, where tokens hide); an endpoint that is not a URL gives nothing.
    Parsed once per endpoint (every recorded span asks again), so read-only.
    """
    return MappingProxyType(_parse_server(endpoint))


def _parse_server(endpoint: str) -> dict[str, str | int]:
    """What :func:`server_attributes` returns, parsed."""
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        return {}
    if not parts.scheme or not parts.hostname:
        return {}
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    found: dict[str, str | int] = {
        ATTR_SERVER_ADDRESS: parts.hostname,
        ATTR_URL_FULL: urlunsplit((parts.scheme, netloc, parts.path, "", "")),
    }
    resolved = port if port is not None else _DEFAULT_PORTS.get(parts.scheme)
    if resolved is not None:
        found[ATTR_SERVER_PORT] = resolved
    return found


# --------------------------------------------------------------------------- the client span and the server span


def start_client_span(span: Span, request: ReachRequest) -> None:
    """What an ``invoke_agent`` span knows before routing: the operation, the capability, the conversation."""
    if span.is_recording():
        started: dict[str, AttributeValue] = {
            ATTR_GEN_AI_OPERATION_NAME: OPERATION_INVOKE_AGENT,
            ATTR_GEN_AI_PROVIDER_NAME: provider_name("reach"),
            ATTR_CAPABILITY: request.capability,
            ATTR_REQUEST_ID: request.request_id,
        }
        if request.tenant:
            started[ATTR_TENANT] = request.tenant
        if request.session_id:  # the GenAI conventions' name for it; reach.session_id would say it twice
            started[ATTR_GEN_AI_CONVERSATION_ID] = request.session_id
        span.set_attributes(started)


def name_client_span(span: Span, agent: str, instance: str, protocol: str) -> dict[str, AttributeValue]:
    """Name the span after the agent that answered; the attributes saying which replica, speaking what.

    They are returned for the span's closing call (:func:`end_client_span`): the SDK locks once per call.
    """
    span.update_name(invoke_agent_name(agent))
    return {
        ATTR_GEN_AI_AGENT_NAME: agent,
        ATTR_GEN_AI_AGENT_ID: f"{agent}/{instance}",
        ATTR_GEN_AI_PROVIDER_NAME: provider_name(protocol),
        ATTR_AGENT: agent,
        ATTR_INSTANCE: instance,
    }


def end_client_span(
    span: Span, status: str, error: ErrorInfo | None, dedup_hit: bool, more: dict[str, AttributeValue] | None = None
) -> None:
    """The span's closing attributes (and error status), set in one call: the SDK locks once per call.

    ``reach.dedup.hit`` is set only on a replayed answer (its absence says the call ran).
    """
    ended: dict[str, AttributeValue] = {ATTR_STATUS: status}
    if dedup_hit:
        ended[ATTR_DEDUP_HIT] = True
    if status != "success":
        ended[ATTR_ERROR_TYPE] = error.type if error else status
        span.set_status(Status(StatusCode.ERROR, error.message if error else status))
    if more:
        ended.update(more)
    span.set_attributes(ended)


def end_server_span(span: Span, status: str, error: ErrorInfo | None) -> None:
    """A SERVER span's outcome: error status and ``error.type`` when the handler failed, crashed or refused."""
    if not span.is_recording():
        return
    span.set_attribute(ATTR_STATUS, status)
    if status != "success":
        span.set_attribute(ATTR_ERROR_TYPE, error.type if error else status)
        span.set_status(Status(StatusCode.ERROR, error.message if error else status))


def served_span(span: Span, http_status: int, body: Mapping[str, object]) -> None:
    """End a SERVER span by the reply sent: its HTTP status, and :func:`end_server_span` of the wire body."""
    if not span.is_recording():
        return
    span.set_attribute(ATTR_HTTP_RESPONSE_STATUS_CODE, http_status)
    error = body.get("error")
    info = None
    if isinstance(error, Mapping):
        info = ErrorInfo(type=str(error.get("type") or "error"), message=str(error.get("message") or ""))
    status = body.get("status")
    end_server_span(span, status if isinstance(status, str) else "fail" if http_status >= 400 else "success", info)


def note_http_request(span: Span, method: str, url: str) -> None:
    """The HTTP client attributes of the request a transport is about to send (``url.full`` without credentials)."""
    if span.is_recording():
        span.set_attributes({ATTR_HTTP_REQUEST_METHOD: method, **server_attributes(url)})


def note_http_status(span: Span, status_code: int) -> None:
    """The HTTP status the request was answered with."""
    if span.is_recording():
        span.set_attribute(ATTR_HTTP_RESPONSE_STATUS_CODE, status_code)


def note_rpc(span: Span, target: str, method: str, status_code: str | None = None) -> None:
    """The RPC client attributes of a gRPC call to ``target`` (``host:port``); ``status_code`` once it is known."""
    if span.is_recording():
        host, _, port = target.rpartition(":")
        noted: dict[str, AttributeValue] = {
            ATTR_RPC_SYSTEM_NAME: RPC_SYSTEM_GRPC,
            ATTR_RPC_METHOD: method,
            ATTR_SERVER_ADDRESS: host.strip("[]"),
        }
        if port.isdigit():
            noted[ATTR_SERVER_PORT] = int(port)
        if status_code is not None:
            noted[ATTR_RPC_RESPONSE_STATUS_CODE] = status_code
        span.set_attributes(noted)


def get_tracer(tracer_provider: TracerProvider | None = None) -> Tracer:
    """Our tracer from ``tracer_provider``, or from the global provider (a no-op until an SDK is set)."""
    return trace.get_tracer(INSTRUMENTATION_NAME, _VERSION, tracer_provider=tracer_provider)


def spans_are_noop(tracer_provider: TracerProvider | None = None) -> bool:
    """True when spans would record nothing (no provider given, no SDK installed): callers can skip them."""
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    return isinstance(provider, ProxyTracerProvider | NoOpTracerProvider)


class _CaseInsensitiveGetter(Getter[Mapping[str, str]]):
    """Header lookup that ignores case, as HTTP does (``Traceparent`` is ``traceparent``)."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            lowered = key.lower()
            value = next((v for k, v in carrier.items() if k.lower() == lowered), None)
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier.keys())


_GETTER: Final = _CaseInsensitiveGetter()


def inject_context(carrier: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write ``traceparent`` (and baggage) for ``context`` (default: the current one) into ``carrier``."""
    propagate.inject(carrier, context=context)


def extract_context(carrier: Mapping[str, str], context: Context | None = None) -> Context:
    """Read the caller's ``traceparent`` from incoming headers; start spans with the result as parent."""
    return propagate.extract(carrier, context=context, getter=_GETTER)
