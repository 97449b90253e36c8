"""The ``tool.before_invoke`` hook Dify does not have, and the settings a Dify plugin reaches agents with.

Neither Dify nor its plugin SDK lets code run before a tool call, so
:func:`before_invoke` is a plain function the plugin's entry points call
(:mod:`reach_plugins.frameworks.dify.plugin` installs it around an agent strategy's
``self.session.tool.invoke``). It returns the reach's
:class:`~reach_plugins.frameworks.toolcalls.ToolResult`, or ``None`` to let the original
tool run; :func:`before_invoke_stream` is the same hook for a strategy that
shows the agent's items as they arrive. Dify's conversation id is the affinity
key and the session-liveness key. Nothing here imports ``dify_plugin``.

A plugin process reaches agents with one enhancer per distinct
:class:`ReachSettings` (the tool provider's credentials, else ``REACH_*``
environment variables), or with the one given to :func:`configure`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Final

from opentelemetry.trace import SpanKind

from reach_plugins.errors import ConfigError, ReachError, from_wire
from reach_plugins.frameworks.enhancer import ReachEnhancer
from reach_plugins.frameworks.toolcalls import Decision, Resolution, ToolCall, ToolResult, content_of
from reach_plugins.telemetry.spans import ATTR_CAPABILITY, ATTR_GEN_AI_CONVERSATION_ID, get_tracer
from reach_plugins.wire.items import is_progress, is_result, reply_of

ATTR_DIFY_APP_ID: Final = "dify.app_id"
ATTR_ENDUSER_ID: Final = "enduser.id"
CAPABILITY_PARAMETER: Final = "reach_capability"
"""A tool parameter (form ``form``) naming the capability a generic :class:`ReachTool` forwards to."""


@dataclass(frozen=True, slots=True)
class ReachSettings:
    """Where a plugin finds agents: a registry URL, a tenant, optionally a Reach gateway to go through."""

    registry: str = "memory://"
    tenant: str | None = None
    gateway_url: str | None = None
    gateway_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], *, prefix: str = "", environ: Mapping[str, str] | None = None
    ) -> ReachSettings:
        """Settings from ``{prefix}registry``, ``{prefix}tenant``, ... in ``values``, else ``REACH_REGISTRY``, ...

        ``values`` are a tool provider's credentials, or an agent strategy's
        parameters (``prefix="reach_"``).
        """
        env = os.environ if environ is None else environ
        found: dict[str, Any] = {}
        for setting in fields(cls):
            name = setting.name
            value = _text(values.get(f"{prefix}{name}")) or _text(env.get(f"REACH_{name.upper()}"))
            if value:
                found[name] = value
        return cls(**found)

    @staticmethod
    def given(values: Mapping[str, Any], *, prefix: str = "") -> bool:
        """Whether ``values`` set any setting (otherwise the configured or environment enhancer applies)."""
        return any(_text(values.get(f"{prefix}{setting.name}")) for setting in fields(ReachSettings))

    def enhancer(self) -> ReachEnhancer:
        """A new enhancer for these settings (direct HTTP, or through the gateway when ``gateway_url`` is set)."""
        transport = None
        if self.gateway_url:
            from transports.gateway import GatewayTransport

            transport = GatewayTransport(self.gateway_url, token=self.gateway_token)
        return ReachEnhancer(registry=self.registry, transport=transport, tenant=self.tenant)


def _text(value: Any) -> str:
    """A setting's value, blank when unset (Dify sends empty strings for fields left empty)."""
    return "" if value is None else str(value).strip()


_lock = threading.Lock()
_configured: ReachEnhancer | None = None
_built: dict[ReachSettings, ReachEnhancer] = {}


def configure(enhancer: ReachEnhancer | None) -> None:
    """Use ``enhancer`` for every hook call that names none (``None``: back to settings from the environment)."""
    global _configured
    _configured = enhancer


def enhancer_for(settings: ReachSettings) -> ReachEnhancer:
    """The enhancer for ``settings``: built once per process, as Dify creates a tool object per call."""
    with _lock:
        enhancer = _built.get(settings)
        if enhancer is None:
            enhancer = _built[settings] = settings.enhancer()
        return enhancer


def default_enhancer() -> ReachEnhancer:
    """The configured enhancer, else the one for the ``REACH_*`` environment variables."""
    return _configured if _configured is not None else enhancer_for(ReachSettings.from_mapping({}))


def enhancer_from(values: Mapping[str, Any], *, prefix: str = "") -> ReachEnhancer:
    """The enhancer for the settings in ``values`` (credentials or parameters), else :func:`default_enhancer`."""
    if ReachSettings.given(values, prefix=prefix):
        return enhancer_for(ReachSettings.from_mapping(values, prefix=prefix))
    return default_enhancer()


def check_settings(values: Mapping[str, Any], *, prefix: str = "") -> list[str]:
    """The capabilities the agents of these settings offer; ``ConfigError`` when none can be found.

    What a tool provider's credential check runs, so a wrong registry URL is
    refused when the credentials are saved, not at the first tool call.
    """
    settings = ReachSettings.from_mapping(values, prefix=prefix)
    offered = sorted(enhancer_for(settings).catalogue())
    if not offered:
        raise ConfigError(
            f"the registry {settings.registry!r} lists no agent; give the URL of the registry your agents are in "
            "(file:///path/agents.yaml, etcd://host:2379)"
        )
    return offered


def shutdown() -> None:
    """Close the enhancers this module built (the configured one belongs to whoever configured it)."""
    with _lock:
        built = list(_built.values())
        _built.clear()
    for enhancer in built:
        enhancer.close()


def before_invoke(
    tool_name: str,
    tool_parameters: Mapping[str, Any],
    *,
    conversation_id: str | None,
    app_id: str | None,
    user_id: str | None,
    description: str = "",
    tool_call_id: str | None = None,
    enhancer: ReachEnhancer | None = None,
) -> ToolResult | None:
    """Reach the agent that should serve this Dify tool call, or return ``None`` to run the tool itself.

    A failure is a result too (``result.ok`` false, ``result.content`` tells
    the model what to do), unless the enhancer says ``on_error="raise"``. A
    reach that reached no agent returns ``None`` under ``remote_first``: the
    Dify tool runs in the same call.
    """
    reach = enhancer if enhancer is not None else default_enhancer()
    call = _tool_call(tool_name, tool_parameters, conversation_id, description, tool_call_id)
    decision = reach.decide(call)
    if not decision.remote:
        return None
    with _dify_span(tool_name, conversation_id, app_id, user_id, reach):
        result = reach.reach(call, decision)
    return None if result.fallback is not None else result


def before_invoke_stream(
    tool_name: str,
    tool_parameters: Mapping[str, Any],
    *,
    conversation_id: str | None,
    app_id: str | None,
    user_id: str | None,
    description: str = "",
    tool_call_id: str | None = None,
    enhancer: ReachEnhancer | None = None,
) -> Generator[Any, None, ToolResult] | None:
    """:func:`before_invoke` as a stream: ``None`` (run the Dify tool), or the agent's items as they arrive.

    The generator's return value is the :class:`ToolResult` of the whole
    reach; when its ``fallback`` is set nothing was delivered and the Dify
    tool should run instead.
    """
    reach = enhancer if enhancer is not None else default_enhancer()
    call = _tool_call(tool_name, tool_parameters, conversation_id, description, tool_call_id)
    decision = reach.decide(call)
    if not decision.remote:
        return None
    return _spanned_stream(reach, call, decision, app_id, user_id)


def _tool_call(
    tool_name: str,
    tool_parameters: Mapping[str, Any],
    conversation_id: str | None,
    description: str,
    tool_call_id: str | None,
) -> ToolCall:
    return ToolCall(
        name=tool_name,
        args=dict(tool_parameters),
        call_id=tool_call_id,
        description=description,
        session_key=conversation_id or None,
    )


def _spanned_stream(
    reach: ReachEnhancer, call: ToolCall, decision: Decision, app_id: str | None, user_id: str | None
) -> Generator[Any, None, ToolResult]:
    with _dify_span(call.name, call.session_key, app_id, user_id, reach):
        return (yield from stream_reach(reach, call, decision))


def stream_reach(reach: ReachEnhancer, call: ToolCall, decision: Decision) -> Generator[Any, None, ToolResult]:
    """Reach ``call`` as a stream: each item as the agent sends it, then the :class:`ToolResult` of them all.

    The reply is :func:`~reach_plugins.wire.items.reply_of` the items (a served
    framework agent's closing result; strings joined, one item itself, several
    a list); a served agent's progress items (tokens, node updates) and its
    closing result are not yielded: the reply is shown once, whole. A capability
    that needs approval or names an idempotency key is reached whole through
    :meth:`ReachEnhancer.reach`: its approver runs there, and a stream is
    retried only before its first item and never deduplicated. Unlike a
    whole reach, a stream that failed on every instance before its first item
    falls back to the local tool only when no agent could take it
    (``NoHealthyAgent``): its error event does not say whether an attempt was
    delivered, and a delivered one may have run.
    """
    capability = decision.capability
    if capability is None or capability.needs_approval or capability.idempotency_key:
        return reach.reach(call, decision)
    items: list[Any] = []
    with reach._span(call) as span:
        try:
            for event in reach.blocking.stream(capability.name, **reach._options(call)):
                if event.kind == "data":
                    items.append(event.data)
                    if not (is_progress(event.data) or is_result(event.data)):
                        yield event.data
                elif event.kind == "error" and event.error is not None:
                    raise from_wire(event.error)
        except ReachError as exc:
            return reach._failed(span, call, capability.name, exc, None)
        span.set_attribute(ATTR_CAPABILITY, capability.name)
    data = reply_of(items)
    return ToolResult(call, capability.name, content_of(data), data)


def reach_capability(
    capability: str,
    tool_parameters: Mapping[str, Any],
    *,
    conversation_id: str | None,
    app_id: str | None,
    user_id: str | None,
    tool_name: str | None = None,
    enhancer: ReachEnhancer | None = None,
) -> ToolResult:
    """Reach ``capability`` itself (no mapping, no local tool): what a Dify ``ReachTool`` does."""
    reach = enhancer if enhancer is not None else default_enhancer()
    name = tool_name or capability
    call = ToolCall(name=name, args=dict(tool_parameters), session_key=conversation_id or None, has_local=False)
    resolution = Resolution(name, capability, "map", f"the Dify tool {name!r} forwards to {capability!r}")
    decision = Decision(True, reach.catalogue().get(capability), resolution, resolution.detail)
    with _dify_span(name, conversation_id, app_id, user_id, reach):
        return reach.reach(call, decision)


def close_conversation(conversation_id: str, *, enhancer: ReachEnhancer | None = None) -> None:
    """End a Dify conversation: later reaches in it get ``SessionClosed``, calls in flight are cancelled."""
    (enhancer if enhancer is not None else default_enhancer()).close_session(conversation_id)


@contextmanager
def _dify_span(
    tool: str, conversation_id: str | None, app_id: str | None, user_id: str | None, enhancer: ReachEnhancer
) -> Iterator[None]:
    """The Dify hop of the trace: which app and end user made the call, in which conversation."""
    attributes = {
        key: value
        for key, value in (
            (ATTR_DIFY_APP_ID, app_id),
            (ATTR_ENDUSER_ID, user_id),
            (ATTR_GEN_AI_CONVERSATION_ID, conversation_id),
        )
        if value
    }
    tracer = get_tracer(enhancer.tracer_provider)
    with tracer.start_as_current_span(f"dify.tool {tool}", kind=SpanKind.INTERNAL, attributes=attributes):
        yield
