"""ReachEnhancer: turn a framework's tool call into a reach, framework-neutral.

A tool maps to a capability by, in order: the explicit ``capability_map``,
the exact name, then — only with ``match="semantic"`` and a stated
``min_similarity`` — a semantic match of its name and description (the
:class:`~reach_plugins.matching.CapabilityMatcher`, which refuses ties; never
to a ``danger_level: high`` capability). A local tool nothing maps runs
locally, and :meth:`ReachEnhancer.explain` says why. The policy then picks
the side: ``remote_first`` reaches when a healthy agent offers the capability
and runs the local tool otherwise, ``remote_only`` always reaches,
``local_only`` never does.

A reach runs through :class:`~reach_plugins.ReachClient` (session liveness,
affinity on the conversation key, the resilience core) inside an
``execute_tool {tool}`` span. Frameworks call tools both ways, so the enhancer
holds a :class:`~reach_plugins.client.blocking.SyncReachClient`: its client lives on
one private loop, ``reach`` blocks on it and ``areach`` awaits it from the
caller's loop. One client on one loop means one conversation pin, one breaker
table and single-flight idempotency across a framework's sync and async calls.
Whatever touches the client's router (the health check of :meth:`ReachEnhancer.decide`,
closing a session) runs on that loop too, never in the framework's thread
(DESIGN.md 11.8); mapping a tool (:meth:`ReachEnhancer.resolve`) reads only the
registry's view and works from any thread.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, Self

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from pydantic_core import to_jsonable_python

from reach_plugins.client.blocking import SyncReachClient
from reach_plugins.client.client import ReachClient
from reach_plugins.errors import (
    ApprovalRequired,
    ConfigError,
    NoHealthyAgent,
    ReachError,
    RemoteError,
    RequestError,
    SessionClosed,
    UnknownCapability,
    from_wire,
)
from reach_plugins.frameworks.toolcalls import (
    Approver,
    Decision,
    ExposeOption,
    Exposure,
    MatcherOption,
    MatchMode,
    OnError,
    PendingApproval,
    Policy,
    ProxySpec,
    Resolution,
    RouteInfo,
    ServeSpec,
    ToolCall,
    ToolMapper,
    ToolResult,
    Verdict,
    check_choice,
    content_of,
    error_text,
)
from reach_plugins.matching.ranking import DEFAULT_WEIGHTS
from reach_plugins.model import Capability, ReachRequest, ReachResponse, error_for_response
from reach_plugins.security import context
from reach_plugins.telemetry.metrics import ReachMetrics, fan_out, global_metrics
from reach_plugins.telemetry.spans import (
    ATTR_CAPABILITY,
    ATTR_ERROR_TYPE,
    ATTR_FALLBACK,
    ATTR_GEN_AI_CONVERSATION_ID,
    ATTR_GEN_AI_OPERATION_NAME,
    ATTR_GEN_AI_TOOL_CALL_ID,
    ATTR_GEN_AI_TOOL_NAME,
    ATTR_GEN_AI_TOOL_TYPE,
    OPERATION_EXECUTE_TOOL,
    TOOL_TYPE_EXTENSION,
    TOOL_TYPE_FUNCTION,
    get_tracer,
    tool_span_name,
)
from reach_plugins.wire.items import reply_of

if TYPE_CHECKING:
    from reach_plugins.registry import Registry
    from reach_plugins.stores.sessions import SessionStore
    from reach_plugins.transport import StreamEvent, Transport


class _ToolSpan:
    """A tool call's span that remembers the error type it was given (the duration metric's ``error.type``)."""

    __slots__ = ("error", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.error: str | None = None

    def set_attribute(self, key: str, value: str) -> None:
        if key == ATTR_ERROR_TYPE:
            self.error = value
        self.span.set_attribute(key, value)

    def set_status(self, status: Status) -> None:
        self.span.set_status(status)


class Stoppable(Protocol):
    """Something served on this enhancer's behalf (:class:`~reach_plugins.agent.langgraph.ServedAgent`)."""

    def stop(self) -> None: ...


SessionKey = Callable[[Any], "str | None"]
"""Derives the conversation key from the host framework's call (LangGraph: the ``ToolCallRequest``)."""


class ReachEnhancer:
    """Reach other agents from any framework's tool calls (keyword-only; ``registry`` an object or a URL).

    Give it the client's settings (``registry``, ``transport``, ``tenant``,
    ``sessions``, any other :class:`ReachClient` keyword) or a ready ``client``
    (which brings its own ports: its session store is the one ``close_session`` closes).
    Session liveness is on by default (``sessions="memory://"``). A capability
    with ``danger_level: high`` or ``require_approval`` is sent only when
    ``approver`` says yes (LangGraph's adapter asks a human with ``interrupt``).
    ``on_error="message"`` turns a failure into text for the model,
    ``"raise"`` raises it. ``expose`` names the capabilities without a local
    tool that the model may see as proxy tools (names or scope tags, or a
    predicate; none by default; ``danger_level: high`` ones only by name).
    ``metrics`` (:class:`~reach_plugins.telemetry.metrics.ReachMetrics`) records tool
    calls and, as the client's trace sink, every reach (for a ready
    ``client``, give it ``sink=metrics`` yourself); without it both go to the
    global ``MeterProvider`` once an SDK is installed there.
    ``match="exact"`` (the default) routes a tool only by ``capability_map``
    or its own name; ``match="semantic", min_similarity=0.46`` also by meaning
    (``matcher`` picks the embedder, or is a ready ``CapabilityMatcher``); a near
    tie by meaning goes to the capability with the best
    ``capacity_weights[0] * similarity + capacity_weights[1] * free capacity``
    (0.7 / 0.3; ``None``: a tie stays a tie), and :meth:`explain` shows both parts.
    ``serve_as`` names what this agent offers when it is
    served itself (``auto_register=True``; the agent SDK serves it, see :meth:`adopt`).
    """

    def __init__(
        self,
        *,
        registry: Registry | str | None = None,
        transport: Transport | None = None,
        tenant: str | None = None,
        capability_map: Mapping[str, str | None] | None = None,
        policy: Policy = "remote_first",
        auto_register: bool = False,
        sessions: SessionStore | str | None = None,
        approver: Approver | None = None,
        match: MatchMode = "exact",
        min_similarity: float | None = None,
        matcher: MatcherOption = None,
        on_error: OnError = "message",
        client: ReachClient | None = None,
        session_key: SessionKey | None = None,
        serve_as: ServeSpec | None = None,
        scope_tags: Sequence[str] = (),
        expose: ExposeOption = None,
        timeout_ms: int | None = None,
        tracer_provider: TracerProvider | None = None,
        metrics: ReachMetrics | None = None,
        capacity_weights: Sequence[float] | None = DEFAULT_WEIGHTS,
        **client_options: Any,
    ) -> None:
        check_choice("policy", policy, Policy)
        check_choice("on_error", on_error, OnError)
        settings = (registry, transport, tenant, sessions)
        if client is not None and (client_options or any(setting is not None for setting in settings)):
            raise ConfigError(
                "pass either client= or the client's settings (registry, transport, tenant, sessions...), not both: "
                "a ready client brings its own ports (build it with sessions= if its conversations should close)"
            )
        if auto_register and serve_as is None:
            raise ConfigError("auto_register=True needs serve_as=ServeSpec(name=..., capabilities=[...])")
        self.policy: Policy = policy
        self.on_error: OnError = on_error
        self.auto_register = auto_register
        self.serve_as = serve_as
        self.approver = approver
        self.session_key = session_key
        self.scope_tags = tuple(scope_tags)
        self.exposure = Exposure.of(expose)
        self.timeout_ms = timeout_ms
        self.tracer_provider = tracer_provider
        self._tracer = get_tracer(tracer_provider)
        self._metrics = metrics
        if metrics is not None and client is None:
            client_options["sink"] = fan_out(client_options.get("sink"), metrics)
        self._owns_client = client is None
        self.blocking = SyncReachClient.wrap(
            client
            or ReachClient(
                registry if registry is not None else "memory://",
                transport,
                tenant,
                sessions=sessions if sessions is not None else "memory://",
                tracer_provider=tracer_provider,
                **client_options,
            )
        )
        """The enhancer's client on its own loop: ``reach`` blocks on it, ``areach`` awaits it."""
        self.client = self.blocking.client
        self.mapper = ToolMapper(
            self.client.registry,
            capability_map=capability_map,
            match=match,
            min_similarity=min_similarity,
            matcher=matcher,
            scope_tags=scope_tags,
            capacity_weights=capacity_weights,
        )
        self._probes: dict[str, ReachRequest] = {}
        self.served: list[Stoppable] = []

    # ------------------------------------------------------------------ mapping

    def resolve(self, tool_name: str, description: str = "") -> str | None:
        """The capability ``tool_name`` maps to, or ``None`` (it stays local; :meth:`explain` says why); cached."""
        return self.mapper.explain(tool_name, description).capability

    def explain(self, tool_name: str, description: str = "") -> Resolution:
        """Like :meth:`resolve`, with the rule that decided and the evidence (why a local tool stays local, too)."""
        return self.mapper.explain(tool_name, description)

    def catalogue(self) -> Mapping[str, Capability]:
        """Every capability the registry offers, by name."""
        return self.mapper.catalogue()

    def tools(self, local: Iterable[str | tuple[str, str]] = ()) -> list[ProxySpec]:
        """Proxy tools for the exposed capabilities no local tool covers (``local``: names, or ``(name, description)``).

        Only what ``expose`` lets through (nothing by default). Capabilities this
        agent serves itself (``serve_as``) are left out: an agent does not reach itself.
        """
        if self.policy == "local_only":
            return []
        own = self.serve_as.capabilities if self.serve_as is not None else ()
        return self.mapper.uncovered(
            local, exclude=[c if isinstance(c, str) else c.name for c in own], exposed=self.exposure
        )

    def exposes(self, capability: str) -> bool:
        """Whether the model may call ``capability`` without a local tool for it (``expose``)."""
        found = self.catalogue().get(capability)
        return found is not None and self.exposure(found)

    # ------------------------------------------------------------------ deciding

    def decide(self, call: ToolCall) -> Decision:
        """Where ``call`` goes under the policy; ``remote_first`` checks that a healthy agent can take it.

        The mapping runs in the caller's thread; the router is asked on the client's loop (11.8).
        """
        mapped = self._mapped(call)
        decision = mapped if isinstance(mapped, Decision) else self.blocking.bridge.run(self._checked(*mapped))
        return self._counted(call, decision)

    async def adecide(self, call: ToolCall) -> Decision:
        """:meth:`decide` from a running loop: the router is asked on the client's loop, not on this one."""
        mapped = self._mapped(call)
        decision = mapped if isinstance(mapped, Decision) else await self.blocking.bridge.submit(self._checked(*mapped))
        return self._counted(call, decision)

    def _counted(self, call: ToolCall, decision: Decision) -> Decision:
        if (metrics := self.metrics) is not None:
            metrics.tool_route(call.name, decision.resolution.rule, decision.remote)
        return decision

    def _mapped(self, call: ToolCall) -> Decision | tuple[Capability, Resolution]:
        """The decision the policy and the mapping settle alone, or the capability whose health must settle it."""
        if self.policy == "local_only":
            return Decision(False, None, Resolution(call.name, None, "off", "policy local_only"), "policy local_only")
        resolution = self.mapper.explain(call.name, call.description, wait=False)
        target = resolution.capability
        capability = self.catalogue().get(target) if target is not None else None
        if self.policy == "remote_only" or not call.has_local:
            why = "policy remote_only" if call.has_local else "no local tool"
            return Decision(True, capability, resolution, f"{why}; {resolution.detail}")
        if capability is None:
            why = f"no agent offers {target!r}" if target else f"not mapped ({resolution.detail})"
            return Decision(False, None, resolution, f"{why}; running the local tool")
        return capability, resolution

    async def _checked(self, capability: Capability, resolution: Resolution) -> Decision:
        """Remote when an agent can take ``capability`` now (the router's answer, on the client's loop), else local."""
        probe = self._probes.get(capability.name)
        if probe is None:
            probe = ReachRequest(capability=capability.name, tenant=self.client.tenant, scope_tags=self.scope_tags)
            self._probes[capability.name] = probe
        try:
            await self.client.candidates(probe, limit=1)
        except (NoHealthyAgent, RequestError) as exc:
            return Decision(False, capability, resolution, f"{exc.message}; running the local tool")
        return Decision(True, capability, resolution, resolution.detail)

    # ------------------------------------------------------------------ reaching

    async def areach(
        self,
        call: ToolCall,
        decision: Decision | None = None,
        *,
        approver: Approver | None = None,
        on_item: OnItem | None = None,
    ) -> ToolResult:
        """Reach the capability of ``call`` (decided if not given); failures per ``on_error``.

        With ``on_item`` the reply is streamed and each item handed to it as it arrives (the host framework
        shows the remote agent's work while it runs); a keyed capability is not streamed (a stream is never
        deduplicated), so ``on_item`` then sees nothing. When the target agent asks its caller for the approval
        (an ``ApprovalRequired`` with a ticket), the approver is asked, unless it already approved this call,
        and the call is sent again with the ticket (it runs once, there).
        """
        decision = decision if decision is not None else await self.adecide(call)
        with self._span(call) as span:
            try:
                capability, answer = self._ask(call, decision, approver)
                sent = _approved(call, capability, await answer if inspect.isawaitable(answer) else answer)
                try:
                    return _ranked(await self._adeliver(span, sent, capability, on_item, None), decision)
                except ApprovalRequired as asked:
                    answer = self._asked_by_target(sent, capability, approver, asked)
                    sent = _approved(sent, capability, await answer if inspect.isawaitable(answer) else answer)
                    return _ranked(await self._adeliver(span, sent, capability, on_item, asked.ticket), decision)
            except ReachError as exc:
                return self._failed(span, call, decision.resolution.capability, exc, None)

    def reach(
        self,
        call: ToolCall,
        decision: Decision | None = None,
        *,
        approver: Approver | None = None,
        on_item: OnItem | None = None,
    ) -> ToolResult:
        """Blocking :meth:`areach`, safe inside a running loop (the reach runs on the client's own loop)."""
        decision = decision if decision is not None else self.decide(call)
        run = self.blocking.bridge.run
        with self._span(call) as span:
            try:
                capability, answer = self._ask(call, decision, approver)
                sent = _approved(call, capability, run(answer) if inspect.isawaitable(answer) else answer)
                try:
                    return _ranked(self._deliver(span, sent, capability, on_item, None), decision)
                except ApprovalRequired as asked:
                    answer = self._asked_by_target(sent, capability, approver, asked)
                    sent = _approved(sent, capability, run(answer) if inspect.isawaitable(answer) else answer)
                    return _ranked(self._deliver(span, sent, capability, on_item, asked.ticket), decision)
            except ReachError as exc:
                return self._failed(span, call, decision.resolution.capability, exc, None)

    async def _adeliver(
        self, span: _ToolSpan, call: ToolCall, capability: Capability, on_item: OnItem | None, ticket: str | None
    ) -> ToolResult:
        """Send ``call`` once (streamed when ``on_item`` listens); raises a target's request for approval."""
        options = self._options(call, ticket)
        if on_item is not None and capability.idempotency_key is None:
            items = await self._astream(capability.name, options, on_item)
            return self._streamed(span, call, capability.name, items)
        response = await self.blocking.bridge.submit(self.client.reach(capability.name, trace=True, **options))
        return self._answered(span, call, capability.name, response, ticket)

    def _deliver(
        self, span: _ToolSpan, call: ToolCall, capability: Capability, on_item: OnItem | None, ticket: str | None
    ) -> ToolResult:
        """Blocking :meth:`_adeliver`."""
        options = self._options(call, ticket)
        if on_item is not None and capability.idempotency_key is None:
            items: list[Any] = []
            for event in self.blocking.stream(capability.name, **options):
                for item in _data(event):
                    on_item(item)
                    items.append(item)
            return self._streamed(span, call, capability.name, items)
        response = self.blocking.reach(capability.name, trace=True, **options)
        return self._answered(span, call, capability.name, response, ticket)

    async def _astream(self, capability: str, options: dict[str, Any], on_item: OnItem) -> list[Any]:
        """The stream's data items, each handed to ``on_item`` on arrival (the stream runs on the client's loop)."""
        events = self.client.stream(capability, **options)
        items: list[Any] = []
        try:
            while True:
                try:
                    event = await self.blocking.bridge.submit(anext(events))
                except StopAsyncIteration:
                    return items
                for item in _data(event):
                    handled = on_item(item)
                    if inspect.isawaitable(handled):
                        await handled
                    items.append(item)
        finally:
            await self.blocking.bridge.submit(events.aclose())

    def _streamed(self, span: _ToolSpan, call: ToolCall, capability: str, items: list[Any]) -> ToolResult:
        """The result of a streamed reach: the :func:`~reach_plugins.wire.items.reply_of` its items."""
        data = reply_of(items)
        agents = [item["agent"] for item in items if isinstance(item, Mapping) and isinstance(item.get("agent"), str)]
        route = RouteInfo(capability, None, agent=agents[-1] if agents else None, attempts=1)
        span.set_attribute(ATTR_CAPABILITY, capability)
        return ToolResult(call, capability, content_of(data), data, None, route)

    def _ask(
        self, call: ToolCall, decision: Decision, approver: Approver | None
    ) -> tuple[Capability, bool | Verdict | Awaitable[bool | Verdict]]:
        """The capability to reach, and the approver's answer (``True`` when it needs no approval)."""
        capability = decision.capability
        if capability is None:
            wanted = decision.resolution.capability or decision.resolution.tool
            raise UnknownCapability(wanted, sorted(self.catalogue())[:5] if decision.resolution.capability else ())
        if not capability.needs_approval:
            return capability, True
        chosen = approver if approver is not None else self.approver
        if chosen is None:
            raise ApprovalRequired(
                f"capability {capability.name!r} (danger_level {capability.danger_level!r}, require_approval "
                f"{capability.require_approval}) needs a person's approval and this caller has no approver: a "
                "LangGraph or LlamaIndex app asks its user (their adapters bring one); elsewhere (a Dify plugin, "
                "a plain enhancer) pass ReachEnhancer(approver=...)"
            )
        return capability, chosen(
            PendingApproval(call.name, capability, dict(call.args), call.call_id, call.session_key)
        )

    def _asked_by_target(
        self, call: ToolCall, capability: Capability, approver: Approver | None, asked: ApprovalRequired
    ) -> bool | Verdict | Awaitable[bool | Verdict]:
        """The approver's answer when the target asked for one: already given if this call needed approval here;
        without an approver the target's refusal stands (its message says who must approve where)."""
        chosen = approver if approver is not None else self.approver
        if asked.ticket is None or chosen is None:
            raise asked
        if capability.needs_approval:
            return True
        pending = PendingApproval(
            call.name, capability, dict(call.args), call.call_id, call.session_key, asked.question
        )
        return chosen(pending)

    def _options(self, call: ToolCall, ticket: str | None = None) -> dict[str, Any]:
        """The request's fields: payload, conversation, the chain it continues, the time it may take.

        While an agent serves a request, its reaches continue that request's conversation: the served graph's
        ``thread_id`` is the tenant-scoped key of it (``agent.langgraph.thread_id``), never an id to send on.
        """
        served = context.current()
        budgets = [ms for ms in (self.timeout_ms, served.remaining_ms() if served else None) if ms is not None]
        return {
            "payload": to_jsonable_python(dict(call.args)),
            "session_id": served.session_id if served is not None else call.session_key,
            "hops": call.hops if call.hops is not None else context.current_hops(),
            "timeout_ms": min(budgets) if budgets else None,
            "scope_tags": self.scope_tags,
            "action": ticket,
        }

    def _answered(
        self, span: _ToolSpan, call: ToolCall, capability: str, response: ReachResponse, ticket: str | None = None
    ) -> ToolResult:
        """The result of a reply; a first request for the caller's approval (a ticket) is raised to be asked."""
        route = RouteInfo.of(response, capability)
        if not response.ok:
            error = error_for_response(response)
            if isinstance(error, ApprovalRequired) and error.ticket is not None and ticket is None:
                raise error
            return self._failed(span, call, capability, error, route)
        span.set_attribute(ATTR_CAPABILITY, capability)
        return ToolResult(call, capability, content_of(response.data), response.data, None, route)

    def _failed(
        self, span: _ToolSpan, call: ToolCall, capability: str | None, error: ReachError, route: RouteInfo | None
    ) -> ToolResult:
        if capability:
            span.set_attribute(ATTR_CAPABILITY, capability)
        span.set_attribute(ATTR_ERROR_TYPE, type(error).__name__)
        metrics = self.metrics
        if metrics is not None and isinstance(error, SessionClosed) and error.details.get("in_flight"):
            metrics.cancellation(capability or call.name)
        fallback = self._fallback(call, capability, error, route)
        if fallback is not None:
            span.set_attribute(ATTR_FALLBACK, "local")
            return ToolResult(call, capability, error_text(call.name, capability, error), None, error, fallback)
        span.set_status(Status(StatusCode.ERROR, error.message))
        if self.on_error == "raise":
            raise error
        return ToolResult(call, capability, error_text(call.name, capability, error), None, error, route)

    def _fallback(
        self, call: ToolCall, capability: str | None, error: ReachError, route: RouteInfo | None
    ) -> RouteInfo | None:
        """The route record of a call the local tool should take over, or ``None``.

        Under ``remote_first`` a call with a local tool that reached no agent
        (no healthy agent, every breaker open, every attempt refused before the
        agent saw it) runs locally in the same tool call; the record says why.
        """
        if self.policy != "remote_first" or not call.has_local or capability is None:
            return None
        if isinstance(error, NoHealthyAgent):
            route = RouteInfo(capability, None, delivered=False)
        elif route is None or route.delivered:
            return None
        return replace(route, fallback=f"local tool ran: {error.message}")

    @contextmanager
    def _span(self, call: ToolCall) -> Iterator[_ToolSpan]:
        attributes: dict[str, str] = {
            ATTR_GEN_AI_OPERATION_NAME: OPERATION_EXECUTE_TOOL,
            ATTR_GEN_AI_TOOL_NAME: call.name,
            ATTR_GEN_AI_TOOL_TYPE: TOOL_TYPE_FUNCTION if call.has_local else TOOL_TYPE_EXTENSION,
        }
        if call.call_id:
            attributes[ATTR_GEN_AI_TOOL_CALL_ID] = call.call_id
        if call.session_key:
            attributes[ATTR_GEN_AI_CONVERSATION_ID] = call.session_key
        with self._tracer.start_as_current_span(
            tool_span_name(call.name),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            timed, started = _ToolSpan(span), time.perf_counter()
            try:
                yield timed
            finally:
                if (metrics := self.metrics) is not None:
                    tool_type = attributes[ATTR_GEN_AI_TOOL_TYPE]
                    metrics.tool_call(call.name, time.perf_counter() - started, timed.error, tool_type=tool_type)

    @property
    def metrics(self) -> ReachMetrics | None:
        """The ``metrics`` given, else those on the global ``MeterProvider`` (None until an SDK is installed)."""
        return self._metrics if self._metrics is not None else global_metrics()

    # ------------------------------------------------------------------ sessions

    def close_session(self, key: str) -> None:
        """End conversation ``key``: later reaches get ``SessionClosed``, calls in flight are cancelled."""
        self.blocking.bridge.run(self.aclose_session(key))

    async def aclose_session(self, key: str) -> None:
        """Async :meth:`close_session` (the close runs on the client's loop, beside the calls it cancels)."""
        await self.blocking.bridge.submit(self.client.close_session(key))
        if (metrics := self.metrics) is not None:
            metrics.session_closed()

    # ------------------------------------------------------------------ serving

    def adopt(self, served: Stoppable) -> None:
        """Stop ``served`` (an agent this enhancer's framework agent is served as) when the enhancer closes."""
        self.served.append(served)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop served agents and close the client when the enhancer built it (after blocking use)."""
        while self.served:
            self.served.pop().stop()
        if self._owns_client:
            self.blocking.close()
        else:
            self.blocking.bridge.close()

    async def aclose(self) -> None:
        """:meth:`close` from a running loop (the client closes on its own loop)."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


OnItem = Callable[[Any], "Awaitable[None] | None"]
"""Gets each item of a streamed reply as it arrives (:meth:`ReachEnhancer.areach` awaits an awaitable answer)."""


def _ranked(result: ToolResult, decision: Decision) -> ToolResult:
    """``result`` with the ranking that chose its capability in its route record (when free capacity chose it)."""
    route = result.route
    if route is None or decision.resolution.rule != "capacity":
        return result
    return replace(result, route=route.ranked_by(decision.resolution))


def _data(event: StreamEvent) -> list[Any]:
    """A data event's item, nothing for the end; an error event raises the error it reports."""
    if event.kind == "error":
        info = event.error
        raise from_wire(info) if info is not None else RemoteError("the stream ended with an error")
    return [event.data] if event.kind == "data" else []


def _approved(call: ToolCall, capability: Capability, answer: object) -> ToolCall:
    """The call to send once the approver said yes (with a reviewer's edited arguments); raises otherwise."""
    if answer is True:
        return call
    if isinstance(answer, Verdict) and answer.approved:
        return call if answer.args is None else replace(call, args=dict(answer.args))
    why = f": {answer.reason}" if isinstance(answer, Verdict) and answer.reason else ""
    raise ApprovalRequired(
        f"the call to {capability.name!r} was not approved (danger_level {capability.danger_level!r}){why}; "
        "nothing was sent"
    )
