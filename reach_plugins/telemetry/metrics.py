"""Metrics through the OpenTelemetry metrics API: what operators chart (seed 001, section 4.1, step five).

Like spans, metrics need ``opentelemetry-api`` only and follow the global
provider: a client given no ``sink`` records into :func:`global_metrics` once
the application installs an SDK ``MeterProvider`` (nothing is built before
that); passing ``sink=`` (or ``meter_provider``) chooses instead.
:class:`ReachMetrics` is a :class:`~reach_plugins.telemetry.trace.TraceSink`, so
every finished request's trace becomes request counts and durations per
capability, agent and instance, attempts by outcome (``not_delivered``,
``unknown``, ``failed``, ``business``, ``success``, ``cancelled``),
retries, failovers, breaker transitions and state, dedup hits and route
decisions (affinity ``new`` / ``pinned`` / ``restored``, degraded); nothing is
added to the request path but the sink call (the pipeline hands it the request's
recorder, :meth:`ReachMetrics.finished`, so no trace is built for it). Registrations, heartbeat expiry
(:meth:`ReachMetrics.watch`), session closes and the tool-mapping rule (the
semantic route distribution) are recorded where they happen.

    metrics = ReachMetrics(meter_provider=provider)
    client = ReachClient(registry, sink=metrics)          # or sink=fan_out(JsonLinesSink(path), metrics)
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from opentelemetry import trace as otel
from opentelemetry.metrics import (
    CallbackOptions,
    MeterProvider,
    NoOpMeterProvider,
    Observation,
    get_meter,
    get_meter_provider,
)
from opentelemetry.metrics._internal import _ProxyMeterProvider
from opentelemetry.trace import SpanContext

from reach_plugins.telemetry.instruments import QueuedHistogram, RunningTotals
from reach_plugins.telemetry.labels import Vocabulary
from reach_plugins.telemetry.spans import (
    _VERSION,
    ATTR_AFFINITY,
    ATTR_AGENT,
    ATTR_BREAKER_FROM,
    ATTR_BREAKER_TO,
    ATTR_CAPABILITY,
    ATTR_DEGRADED,
    ATTR_ERROR_TYPE,
    ATTR_GEN_AI_OPERATION_NAME,
    ATTR_GEN_AI_TOOL_NAME,
    ATTR_GEN_AI_TOOL_TYPE,
    ATTR_INSTANCE,
    ATTR_LOOP_PAIR,
    ATTR_OUTCOME,
    ATTR_RESULT,
    ATTR_RULE,
    ATTR_SIDE,
    ATTR_STATUS,
    ATTR_TENANT,
    ATTR_USAGE_SOURCE,
    EVENT_BREAKER,
    EVENT_CONSISTENCY,
    EVENT_CONSISTENCY_STATE,
    EVENT_FAILOVER,
    EVENT_RETRY,
    INSTRUMENTATION_NAME,
    OPERATION_EXECUTE_TOOL,
)
from reach_plugins.telemetry.trace import TraceRecorder, TraceSink, emit_safely
from reach_plugins.telemetry.usage import tokens_in, tokens_of

if TYPE_CHECKING:
    from reach_plugins.model import ReachTrace
    from reach_plugins.registry.base import Registry

# --------------------------------------------------------------------------- instrument names
GEN_AI_EXECUTE_TOOL_DURATION: Final = "gen_ai.execute_tool.duration"
"""GenAI semantic conventions: one ``execute_tool`` call as the framework saw it, in seconds."""
REQUESTS: Final = "reach.client.requests"
REQUEST_DURATION: Final = "reach.client.request.duration"
ATTEMPTS: Final = "reach.client.attempts"
RETRIES: Final = "reach.client.retries"
FAILOVERS: Final = "reach.client.failovers"
DEDUP_HITS: Final = "reach.client.dedup.hits"
ROUTE_DECISIONS: Final = "reach.route.decisions"
BREAKER_TRANSITIONS: Final = "reach.breaker.transitions"
BREAKER_STATE: Final = "reach.breaker.state"
SESSIONS_CLOSED: Final = "reach.sessions.closed"
CANCELLATIONS: Final = "reach.client.cancellations"
TOOL_ROUTES: Final = "reach.tool.routes"
REGISTRATIONS: Final = "reach.registry.registrations"
HEARTBEAT_EXPIRATIONS: Final = "reach.registry.heartbeat.expirations"
USAGE_CALLS: Final = "reach.usage.calls"
"""Calls per tenant, agent and capability (seed 000, section 4.4)."""
USAGE_TOKENS: Final = "reach.usage.tokens"
"""Tokens per tenant, agent and capability; ``reach.usage.source`` says ``reported`` or ``estimated``."""
QUOTA_FALLBACKS: Final = "reach.quota.fallbacks"
"""Calls judged by a process's local share of the quotas while the shared store was unreachable."""
QUOTA_REFUSALS: Final = "reach.quota.refusals"
QUOTA_WAITS: Final = "reach.quota.waits"
"""Seconds calls refused by a quota waited to be judged again (``quotas.waits``), by priority and outcome."""
CONSISTENCY_SCORES: Final = "reach.consistency.score"
CONSISTENCY_EJECTIONS: Final = "reach.consistency.ejections"
LOOP_ALERTS: Final = "reach.dependency.loop_alerts"
"""Agent pairs that became dependency loops (:mod:`reach_plugins.policy.dependency`)."""

BREAKER_STATES: Final = {"closed": 0, "half_open": 1, "open": 2}
"""``reach.breaker.state`` values: 0 closed, 1 half-open, 2 open."""
DURATION_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Tried(Protocol):
    """An attempt as metrics read it: an :class:`~reach_plugins.model.Attempt` or the hot path's ``AttemptRecord``."""

    @property
    def agent(self) -> str: ...

    @property
    def instance(self) -> str: ...

    @property
    def delivery(self) -> str: ...

    @property
    def outcome(self) -> str: ...


def attempt_outcome(attempt: Tried) -> str:
    """DESIGN 11.1's name for how an attempt ended: ``not_delivered``, ``unknown``, ``failed``, ``business``, ..."""
    if attempt.delivery != "answered":
        return attempt.delivery
    return {
        "timeout": "unknown",
        "transient": "failed",
        "handler_failed": "failed",
        "backpressure": "not_delivered",
    }.get(attempt.outcome, attempt.outcome)


@dataclass(frozen=True, slots=True)
class _Shown:
    """The label sets one kind of request is recorded under, at a vocabulary revision."""

    revision: int
    agent: str
    requests: Mapping[str, Any]
    duration: Mapping[str, Any]
    decided: Mapping[str, Any] | None
    usage: Mapping[str, Any]


class ReachMetrics:
    """The instruments of reach-plugins on ``meter_provider`` (the global one by default); a trace sink.

    Every label set goes through ``vocabulary`` (:mod:`reach_plugins.telemetry.labels`): a server passes one that
    knows its registry and tenants, so a name a caller made up is counted as ``unknown``; by default names pass
    as they are, under the series cap.
    """

    def __init__(self, meter_provider: MeterProvider | None = None, *, vocabulary: Vocabulary | None = None) -> None:
        self.vocabulary = vocabulary if vocabulary is not None else Vocabulary()
        meter = get_meter(INSTRUMENTATION_NAME, _VERSION, meter_provider=meter_provider)
        self.tool_duration = meter.create_histogram(
            GEN_AI_EXECUTE_TOOL_DURATION, unit="s", description="Duration of tool execution.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )  # fmt: skip
        self.request_duration = QueuedHistogram(
            meter, REQUEST_DURATION, unit="s", description="Time to answer a reach, retries included.",
            boundaries=DURATION_BUCKETS,
        )  # fmt: skip
        self.requests = RunningTotals(
            meter, REQUESTS, unit="{request}", description="Finished reaches.", before=[self.request_duration.flush]
        )
        self.attempts = RunningTotals(meter, ATTEMPTS, unit="{attempt}", description="Attempts by outcome.")
        self.retries = meter.create_counter(RETRIES, unit="{retry}", description="Retries after a failed attempt.")
        self.failovers = meter.create_counter(FAILOVERS, unit="{failover}", description="Moves to another instance.")
        self.dedup_hits = meter.create_counter(DEDUP_HITS, unit="{request}", description="Answers replayed by key.")
        self.route_decisions = RunningTotals(
            meter, ROUTE_DECISIONS, unit="{decision}", description="Where reaches went: affinity and degradation."
        )
        self.breaker_transitions = meter.create_counter(
            BREAKER_TRANSITIONS, unit="{transition}", description="Circuit breaker state changes per instance."
        )
        self.sessions_closed = meter.create_counter(SESSIONS_CLOSED, unit="{session}", description="Closed sessions.")
        self.cancellations = meter.create_counter(
            CANCELLATIONS, unit="{attempt}", description="Attempts cancelled (session closed, caller gone)."
        )
        self.tool_routes = meter.create_counter(
            TOOL_ROUTES, unit="{call}", description="Tool calls by mapping rule (exact, semantic, map...) and side."
        )
        self.registrations = meter.create_counter(
            REGISTRATIONS, unit="{registration}", description="Instance registrations by result."
        )
        self.heartbeat_expirations = meter.create_counter(
            HEARTBEAT_EXPIRATIONS, unit="{instance}", description="Instances whose heartbeats stopped."
        )
        self.usage_calls = RunningTotals(meter, USAGE_CALLS, unit="{call}", description="Calls per tenant.")
        self.usage_tokens = meter.create_counter(USAGE_TOKENS, unit="{token}", description="Tokens per tenant.")
        self.consistency_scores = meter.create_histogram(
            CONSISTENCY_SCORES, unit="1", description="Replies' similarity to their requests (opted-in capabilities)."
        )
        self.consistency_ejections = meter.create_counter(
            CONSISTENCY_EJECTIONS, unit="{ejection}", description="Instances ejected for replies beside the question."
        )
        self.loop_alerts = meter.create_counter(
            LOOP_ALERTS, unit="{alert}", description="Agent pairs found reaching each other above the threshold."
        )
        self._lock = threading.Lock()
        self._breakers: dict[str, int] = {}
        self._shown: dict[tuple[str, str | None, tuple[str, str, str, bool] | None, str], _Shown] = {}
        """Label sets per kind of request (capability, tenant, route, status): built once, not per request."""
        self._tried: dict[tuple[str, str, str, str], tuple[int, Mapping[str, Any]]] = {}
        """An attempt's label set per (capability, agent, instance, outcome), with the revision it was shown at."""
        meter.create_observable_gauge(
            BREAKER_STATE, [self._breaker_states], unit="1", description="Breaker state: 0 closed, 1 half-open, 2 open."
        )

    # ------------------------------------------------------------------ requests (a TraceSink)

    def emit(self, trace: ReachTrace) -> None:
        """Record one finished request (what :class:`~reach_plugins.ReachClient` hands its sink)."""
        route = trace.route
        where = (route.agent, route.instance, route.affinity, route.degraded) if route is not None else None
        span = otel.get_current_span().get_span_context()
        self._request(
            trace.capability, trace.tenant, where, trace.status, trace.duration_ms / 1000.0, trace.dedup_hit,
            tokens_of(trace), trace.attempts, trace.events, span,
        )  # fmt: skip

    def finished(self, rec: TraceRecorder, status: str, now: float) -> None:
        """Record one finished request read off its recorder: what :meth:`emit` of its trace records, with no
        trace built (the pipeline's way; ``rec.usage`` must be set)."""
        route, request = rec.route, rec.request
        where = None
        if route is not None:
            affinity = route.affinity
            where = (route.agent.name, route.instance.instance_id, affinity, affinity == "degraded")
        seconds = (now - rec.started_at) * 1000.0 / 1000.0  # the trace's duration_ms in seconds, to the last bit
        self._request(
            request.capability, request.tenant, where, status, seconds, rec.dedup_hit,
            tokens_in(rec.usage, rec.events), rec.attempts, rec.events, rec.span.get_span_context(),
        )  # fmt: skip

    def _request(
        self,
        capability: str,
        tenant: str | None,
        where: tuple[str, str, str, bool] | None,
        status: str,
        seconds: float,
        dedup_hit: bool,
        tokens: tuple[int, int],
        attempts: Iterable[Tried],
        events: Iterable[Mapping[str, object]],
        span: SpanContext,
    ) -> None:
        """One request: ``where`` is its route's agent, instance, affinity and degradation (None: never routed)."""
        revision = self.vocabulary.revision
        shown = self._shown.get((capability, tenant, where, status))
        if shown is None or shown.revision != revision:
            shown = self._show(revision, capability, tenant, where, status)
        self.requests.add(1, shown.requests)
        self.request_duration.record(seconds, shown.duration, span if span.is_valid else None)
        if shown.decided is not None:
            self.route_decisions.add(1, shown.decided)
        if dedup_hit:
            self.dedup_hits.add(1, self._labels(DEDUP_HITS, {ATTR_CAPABILITY: capability}))
        self.usage_calls.add(1, shown.usage)
        self._tokens(tenant, shown.agent, capability, tokens)
        for attempt in attempts:
            outcome = attempt_outcome(attempt)
            tried = self._tried.get((capability, attempt.agent, attempt.instance, outcome))
            if tried is None or tried[0] != revision:
                tried = self._try(revision, capability, attempt.agent, attempt.instance, outcome)
            self.attempts.add(1, tried[1])
            if outcome == "cancelled":
                at = {ATTR_CAPABILITY: capability, ATTR_AGENT: attempt.agent, ATTR_INSTANCE: attempt.instance}
                self.cancellations.add(1, self._labels(CANCELLATIONS, at))
        self._events(capability, events)

    def _show(
        self, revision: int, capability: str, tenant: str | None, where: tuple[str, str, str, bool] | None, status: str
    ) -> _Shown:
        """The label sets of a kind of request, as the vocabulary shows them at ``revision`` (kept for the next)."""
        agent, instance, affinity, degraded = where if where is not None else ("", "", "", False)
        at = {ATTR_CAPABILITY: capability, ATTR_AGENT: agent, ATTR_INSTANCE: instance}
        finished = {**at, ATTR_STATUS: status}
        decided = {**at, ATTR_AFFINITY: affinity, ATTR_DEGRADED: str(degraded).lower()}
        who = {ATTR_TENANT: tenant or "", ATTR_AGENT: agent, ATTR_CAPABILITY: capability}
        shown = _Shown(
            revision,
            agent,
            requests=self._labels(REQUESTS, finished),
            duration=self._labels(REQUEST_DURATION, finished),
            decided=self._labels(ROUTE_DECISIONS, decided) if where is not None else None,
            usage=self._labels(USAGE_CALLS, who),
        )
        self._keep(self._shown, (capability, tenant, where, status), shown)
        return shown

    def _try(
        self, revision: int, capability: str, agent: str, instance: str, outcome: str
    ) -> tuple[int, Mapping[str, Any]]:
        """An attempt's label set at ``revision`` (kept for the next)."""
        tried = {ATTR_CAPABILITY: capability, ATTR_AGENT: agent, ATTR_INSTANCE: instance, ATTR_OUTCOME: outcome}
        shown = (revision, self._labels(ATTEMPTS, tried))
        self._keep(self._tried, (capability, agent, instance, outcome), shown)
        return shown

    def _keep(self, memo: dict[Any, Any], key: Any, value: Any) -> None:
        """Remember ``value`` under ``key`` while ``memo`` holds fewer kinds than the vocabulary admits series."""
        if key in memo or len(memo) < self.vocabulary.max_series:
            memo[key] = value

    def _labels(self, instrument: str, attributes: Mapping[str, Any]) -> Mapping[str, Any]:
        return self.vocabulary.labels(instrument, attributes)

    def _tokens(self, tenant: str | None, agent: str, capability: str, tokens: tuple[int, int]) -> None:
        """Tokens (reported, estimated) per tenant, agent and capability (see ``telemetry.usage``)."""
        reported, estimated = tokens
        if not (reported or estimated):
            return
        who = {ATTR_TENANT: tenant or "", ATTR_AGENT: agent, ATTR_CAPABILITY: capability}
        if reported:
            self.usage_tokens.add(reported, self._labels(USAGE_TOKENS, {**who, ATTR_USAGE_SOURCE: "reported"}))
        if estimated:
            self.usage_tokens.add(estimated, self._labels(USAGE_TOKENS, {**who, ATTR_USAGE_SOURCE: "estimated"}))

    def _events(self, capability: str, events: Iterable[Mapping[str, object]]) -> None:
        of = {ATTR_CAPABILITY: capability}
        for event in events:
            name = event.get("event")
            if name == EVENT_CONSISTENCY:
                score = event.get("score")
                if isinstance(score, int | float):
                    self.consistency_scores.record(float(score), self._labels(CONSISTENCY_SCORES, of))
            elif name == EVENT_CONSISTENCY_STATE and event.get(ATTR_BREAKER_TO) == "ejected":
                ejected = {ATTR_CAPABILITY: capability, ATTR_INSTANCE: str(event.get("instance"))}
                self.consistency_ejections.add(1, self._labels(CONSISTENCY_EJECTIONS, ejected))
            elif name == EVENT_RETRY:
                self.retries.add(1, self._labels(RETRIES, of))
            elif name == EVENT_FAILOVER:
                self.failovers.add(1, self._labels(FAILOVERS, of))
            elif name == EVENT_BREAKER:
                before, after = str(event.get(ATTR_BREAKER_FROM)), str(event.get(ATTR_BREAKER_TO))
                self.breaker(str(event.get("instance", "")), before, after)

    def breaker(self, instance: str, before: str, after: str) -> None:
        """A breaker moved from ``before`` to ``after``: counted, and the instance's state gauge set."""
        moved = {ATTR_INSTANCE: instance, ATTR_BREAKER_FROM: before, ATTR_BREAKER_TO: after}
        self.breaker_transitions.add(1, self._labels(BREAKER_TRANSITIONS, moved))
        shown = self._labels(BREAKER_STATE, {ATTR_INSTANCE: instance}).get(ATTR_INSTANCE, instance)
        with self._lock:
            self._breakers[shown] = BREAKER_STATES.get(after, -1)

    def _breaker_states(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            states = dict(self._breakers)
        return [Observation(state, {ATTR_INSTANCE: instance}) for instance, state in sorted(states.items())]

    # ------------------------------------------------------------------ framework calls, sessions, registry

    def tool_route(self, tool: str, rule: str, remote: bool) -> None:
        """Where a framework tool call went: the mapping rule (the semantic route distribution) and the side."""
        side = "remote" if remote else "local"
        routed = {ATTR_GEN_AI_TOOL_NAME: tool, ATTR_RULE: rule, ATTR_SIDE: side}
        self.tool_routes.add(1, self._labels(TOOL_ROUTES, routed))

    def tool_call(self, tool: str, seconds: float, error: str | None = None, *, tool_type: str | None = None) -> None:
        """How long one reached tool call took as the framework saw it (GenAI ``gen_ai.execute_tool.duration``)."""
        attributes = {ATTR_GEN_AI_OPERATION_NAME: OPERATION_EXECUTE_TOOL, ATTR_GEN_AI_TOOL_NAME: tool}
        if tool_type is not None:
            attributes[ATTR_GEN_AI_TOOL_TYPE] = tool_type
        if error is not None:
            attributes[ATTR_ERROR_TYPE] = error
        self.tool_duration.record(seconds, self._labels(GEN_AI_EXECUTE_TOOL_DURATION, attributes))

    def session_closed(self) -> None:
        """A conversation was closed (later reaches in it are refused, calls in flight cancelled)."""
        self.sessions_closed.add(1)

    def cancellation(self, capability: str) -> None:
        """A call in flight was cancelled because its conversation closed."""
        self.cancellations.add(1, self._labels(CANCELLATIONS, {ATTR_CAPABILITY: capability}))

    def loop_alert(self, first: str, second: str) -> None:
        """Agents ``first`` and ``second`` became a dependency loop (reaching each other above the threshold)."""
        self.loop_alerts.add(1, self._labels(LOOP_ALERTS, {ATTR_LOOP_PAIR: f"{first}<->{second}"}))

    def registration(self, agent: str, ok: bool) -> None:
        """An instance of ``agent`` tried to register (the agent SDK's registration reports each try)."""
        registered = {ATTR_AGENT: agent, ATTR_RESULT: "success" if ok else "failure"}
        self.registrations.add(1, self._labels(REGISTRATIONS, registered))

    async def watch(self, registry: Registry, *, registrations: bool = False) -> None:
        """Count heartbeat expiry, and with ``registrations`` the instances that register, from ``registry``'s watch
        stream until it ends.

        An expiry is an instance whose heartbeats stopped: ``instance_down``, or an instance gone without saying
        ``draining`` first (its lease expired: killed, not stopped). ``registrations`` is for a server, which sees
        agents register only through the registry (an agent's own SDK counts its tries, failures included);
        instances present when the watch starts are not counted as registrations, but their expiry is.
        """
        events = registry.watch()  # subscribed before the snapshot, so nothing falls between them
        seen = {(agent, instance_id) for agent in registry.agents() for instance_id in registry.instances(agent)}
        down: set[tuple[str, str]] = set()
        async for event in events:
            key = (event.agent, event.instance_id or "")
            if event.kind == "instance_put" and key not in seen:
                seen.add(key)
                if registrations:
                    self.registration(event.agent, ok=True)
            elif event.kind == "instance_up":
                down.discard(key)
            elif event.kind == "instance_down" and key not in down:
                down.add(key)
                self._expired(event.agent)
            elif event.kind == "instance_deleted":
                seen.discard(key)
                if key not in down and event.status == "ready":
                    self._expired(event.agent)
                down.discard(key)

    def _expired(self, agent: str) -> None:
        self.heartbeat_expirations.add(1, self._labels(HEARTBEAT_EXPIRATIONS, {ATTR_AGENT: agent}))


_GLOBAL_LOCK = threading.Lock()
_global: ReachMetrics | None = None


def global_metrics() -> ReachMetrics | None:
    """:class:`ReachMetrics` on the global ``MeterProvider``, or None while none is installed (costs nothing then).

    One per process: instruments registered twice on one meter would report every series twice. The global
    provider is set once per process, so once found it is kept (the look-up reads the environment: ~3 us).
    """
    global _global
    if _global is not None:
        return _global
    provider = get_meter_provider()
    if isinstance(provider, NoOpMeterProvider | _ProxyMeterProvider):
        return None
    with _GLOBAL_LOCK:
        if _global is None:
            _global = ReachMetrics(provider)
        return _global


def metrics_in(sink: TraceSink | None) -> ReachMetrics | None:
    """The :class:`ReachMetrics` a sink is or fans out to (a server's), else the global one (or None)."""
    if isinstance(sink, ReachMetrics):
        return sink
    if isinstance(sink, FanOut):
        found = next((one for one in sink.sinks if isinstance(one, ReachMetrics)), None)
        if found is not None:
            return found
    return global_metrics()


class FanOut:
    """One trace sink feeding several (a JSON-lines file and metrics, say); a failing one never stops the rest."""

    def __init__(self, *sinks: TraceSink) -> None:
        self.sinks = sinks

    def emit(self, trace: ReachTrace) -> None:
        for sink in self.sinks:
            emit_safely(sink, trace)


def split_sink(sink: TraceSink | None) -> tuple[ReachMetrics | None, TraceSink | None]:
    """The metrics a sink is or fans out to (they read the recorder: no trace is built for them), and the rest."""
    if isinstance(sink, ReachMetrics):
        return sink, None
    if isinstance(sink, FanOut):
        found = next((one for one in sink.sinks if isinstance(one, ReachMetrics)), None)
        if found is not None:
            return found, fan_out(*(one for one in sink.sinks if one is not found))
    return None, sink


def fan_out(*sinks: TraceSink | None) -> TraceSink | None:
    """The sinks given (``None`` left out) as one: ``None``, the only one, or a :class:`FanOut`."""
    present = [sink for sink in sinks if sink is not None]
    if len(present) <= 1:
        return present[0] if present else None
    return FanOut(*present)
