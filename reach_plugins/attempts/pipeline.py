"""The one async pipeline every transport goes through.

Order of a call: loop guard -> route -> target loop check -> dependency-loop watch -> payload vs params_schema ->
deadline -> conversation turn start (relief) -> dedup (single-flight + window) -> fleet-wide quotas (once per
request that sends, where its retries are owned) -> per attempt: rate limit / concurrency ->
breaker -> send within ``min(remaining, per-attempt timeout)`` -> classify ->
retry (full jitter, budget) or fail over -> trace and span.

Dedup comes before the limits (DESIGN.md lists it after them) so that a
duplicate waiting for its in-flight twin (or answered by it) neither burns a rate-limit or quota token nor
sits on a concurrency slot; limits are taken per attempt so that a retry
counts as load and a backoff sleep holds no slot. Raise-vs-return follows
:mod:`reach_plugins.errors`: raise when nothing was sent, return a
``ReachResponse`` (``fail``/``timeout``, with its trace) once an agent was tried.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass

from opentelemetry import trace as otel
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, TracerProvider
from opentelemetry.util.types import AttributeValue

from reach_plugins.attempts.claims import Claim, on_begin, on_end
from reach_plugins.attempts.driver import run_unary
from reach_plugins.attempts.engine import Engine
from reach_plugins.attempts.flight import Flight
from reach_plugins.attempts.hooks import AttemptHooks
from reach_plugins.attempts.loopwatch import LoopWatch
from reach_plugins.attempts.ports import CredentialResolver, RouteLike, RouterLike, TurnHook
from reach_plugins.attempts.quotas import Lease, Quotas
from reach_plugins.attempts.streaming import StreamTally, stream_attempts
from reach_plugins.clock import Clock, as_clock
from reach_plugins.errors import (
    BackendUnavailable,
    ConfigError,
    DeadlineExceeded,
    EntryTooLarge,
    OutcomeUnknown,
    ReachError,
)
from reach_plugins.model import AgentDescriptor, ErrorInfo, Instance, LoopSettings, ReachRequest, ReachResponse
from reach_plugins.policy.batching import BatchPolicy
from reach_plugins.policy.deadline import has_explicit_deadline, resolve_deadline
from reach_plugins.policy.dedup import payload_hash, resolve_key
from reach_plugins.policy.loopguard import DEFAULT_MAX_HOPS, check_length, check_target, hops_header
from reach_plugins.policy.outliers import Standing
from reach_plugins.policy.validation import check_payload
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.dedup import DedupStore, MemoryDedupStore, store_key
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.stores.sessions import session_key
from reach_plugins.telemetry.metrics import ReachMetrics, global_metrics, metrics_in, split_sink
from reach_plugins.telemetry.spans import (
    ATTR_ATTEMPTS,
    ATTR_STREAM_CHARS,
    ATTR_STREAM_EVENTS,
    EVENT_DEDUP_HIT,
    EVENT_DEDUP_UNAVAILABLE,
    EVENT_DEDUP_WAIT,
    EVENT_QUOTA_WAIT,
    EVENT_STREAMED,
    end_client_span,
    get_tracer,
    inject_context,
    invoke_agent_name,
    name_client_span,
    spans_are_noop,
    start_client_span,
)
from reach_plugins.telemetry.trace import TraceRecorder, TraceSink
from reach_plugins.telemetry.usage import usage_of
from reach_plugins.transport import StreamEvent, Transport
from reach_plugins.wire.headers import (
    HEADER_HOPS,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_RETRY,
    HEADER_SUMMARY,
    HEADER_TENANT,
    META_SUMMARY,
    RETRY_UPSTREAM,
    TARGET,
)

logger = logging.getLogger("reach_plugins.attempts")

CLAIM_GRACE = 2.0
"""Seconds a dedup claim outlives its request's deadline: a crashed owner blocks its key no longer than that."""

_SPANS_RECHECK = 1.0
"""Seconds between two looks at the global tracer (or meter) provider while no SDK is installed (the look is not
free)."""


@dataclass(frozen=True, slots=True)
class Guarded:
    """One instance as the core's guards see it now: breaker state, seconds to reopen and left ejected, window."""

    breaker: str
    reopens_in: float | None
    ejected_for: float | None
    window: tuple[int, int] | None
    """Attempts in flight and the adaptive limit, once a call went there."""


class Pipeline:
    """Runs ReachRequests through the resilience core around one Transport."""

    def __init__(
        self,
        *,
        router: RouterLike,
        transport: Transport,
        store: DedupStore | None = None,
        clock: Clock | Callable[[], float] | None = None,
        rng: random.Random | None = None,
        credentials: CredentialResolver | None = None,
        sink: TraceSink | None = None,
        tracer_provider: TracerProvider | None = None,
        max_hops: int = DEFAULT_MAX_HOPS,
        default_timeout: float = 30.0,
        stream_batching: BatchPolicy | None = None,
        hooks: Sequence[AttemptHooks] = (),
        quotas: Quotas | None = None,
        loops: LoopSettings | None = None,
        turns: TurnHook | None = None,
    ) -> None:
        """``hooks`` hear of every request's attempts and breaker/consistency changes (metrics, logs).

        ``quotas`` are applied to every request unless the transport is a hop owning its retries (a gateway or
        node: it applies its own, so a call is counted once); the caller owns (and closes) them.
        ``loops``: the dependency-loop watch (:mod:`reach_plugins.attempts.loopwatch`), on by default.
        ``turns`` hears each conversation's turn start and end (the router's hot-spot relief).

        ``sink`` gets every finished request's trace; without one, traces go to :class:`ReachMetrics` on the global
        ``MeterProvider`` once an SDK is installed there (like spans; nothing is built until then).
        """
        if max_hops < 1 or default_timeout <= 0:
            raise ConfigError(f"max_hops must be >= 1 and default_timeout > 0, got {max_hops} and {default_timeout}")
        self._clock = as_clock(clock)
        self._owns_store = store is None
        self._store: DedupStore = (
            store if store is not None else MemoryDedupStore(budget=DEFAULT_BUDGET, clock=self._clock)
        )
        self._sink = sink
        self._reader, self._traces = split_sink(sink)
        self._tracer_provider = tracer_provider
        self._tracer = get_tracer(tracer_provider)
        self._spans_on = False
        self._spans_recheck = -math.inf
        self._global_metrics: ReachMetrics | None = None
        self._metrics_recheck = -math.inf
        self._max_hops = max_hops
        self._default_timeout = default_timeout
        self._batching = stream_batching or BatchPolicy()
        self._quotas = None if quotas is None or transport.owns_retries else quotas
        self._turns = turns
        self.loops = LoopWatch(loops or LoopSettings(), self._clock, lambda: metrics_in(self._sink))
        """Agent pairs reaching each other too often, seen from this pipeline's reaches."""
        self._engine = Engine(
            router=router,
            transport=transport,
            clock=self._clock,
            rng=rng or random.Random(),
            credentials=credentials,
            hooks=tuple(hooks),
        )

    def is_available(self, agent: str, instance_id: str) -> bool:
        """Whether the instance's breaker would admit a call now and it is not ejected for inconsistent replies."""
        engine = self._engine
        breaker = engine.breakers.find(agent, instance_id)
        if breaker is not None and not breaker.is_closed and not breaker.available(self._clock.monotonic()):
            return False
        consistency = engine.consistency
        if not engine.outliers.available(agent, instance_id, self._clock.monotonic()):
            return False
        return consistency.healthy(agent, instance_id) or consistency.available(
            agent, instance_id, self._clock.monotonic()
        )

    def guarded(self, agent: str, instance_id: str, tenant: str | None = None) -> Guarded:
        """What the core holds of one instance now (breaker, ejections, window), for status views; changes nothing.

        Breakers are per tenant: ``tenant``'s is shown when given (what its calls meet), else the worst of them.
        """
        engine = self._engine
        now = self._clock.monotonic()
        breakers = engine.breakers
        breaker = (
            breakers.find(agent, instance_id, tenant) if tenant is not None else breakers.worst(agent, instance_id, now)
        )
        ends = [
            until - now
            for until in (
                engine.outliers.ejected_until(agent, instance_id),
                engine.consistency.ejected_until(agent, instance_id),
            )
            if until is not None and until > now
        ]
        guards = engine.guards.find(agent)
        return Guarded(
            breaker=breaker.state(now) if breaker is not None else "closed",
            reopens_in=breaker.reopens_in(now) if breaker is not None else None,
            ejected_for=max(ends) if ends else None,
            window=guards.window(instance_id) if guards is not None else None,
        )

    def standing(self, agent: str, instance_id: str) -> Standing:
        """The share of its routing weight the instance keeps against its peers, and why (the router's outlier port)."""
        return self._engine.outliers.standing(agent, instance_id, self._clock.monotonic())

    async def run(self, request: ReachRequest, *, trace: bool = False, route: RouteLike | None = None) -> ReachResponse:
        """One request, start to end. ``trace=True`` attaches the ReachTrace (failures always carry it).

        ``route``: where the first attempt goes, when the caller has routed already (a conversation's pin agreed
        with a shared store): routing once keeps that decision, its ``context_restore`` included.
        """
        started = self._clock.now()
        if self._spans_off(started):
            return await self._run(request, otel.get_current_span(), started, trace, route)
        with self._tracer.start_as_current_span(
            invoke_agent_name(None),
            kind=SpanKind.CLIENT,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            return await self._run(request, span, started, trace, route)

    async def stream(self, request: ReachRequest) -> AsyncGenerator[StreamEvent, None]:
        """Stream one request's events; retried only before the first event, never deduplicated."""
        async with aclosing(self._stream(request)) as batches:
            async for batch in batches:
                for event in batch:
                    yield event

    def stream_batches(self, request: ReachRequest) -> AsyncGenerator[list[StreamEvent], None]:
        """:meth:`stream` as the batches the core hands on (write each as one frame to cut writes and wakeups)."""
        return self._stream(request)

    async def aclose(self) -> None:
        """Close what the pipeline created itself (the default dedup store); the caller owns the transport."""
        if self._owns_store:
            await self._store.aclose()

    # ------------------------------------------------------------------ internals

    def _prepare(
        self, request: ReachRequest, rec: TraceRecorder, context: Context | None, routed: RouteLike | None = None
    ) -> Flight:
        check_length(request.hops, self._max_hops)
        engine = self._engine
        route = routed if routed is not None else engine.router.route(request)
        rec.route = route
        check_target(request.hops, route.agent.name, route.capability.name)
        self.loops.check(request.hops, route.agent.name)
        check_payload(route.capability, request.payload)
        deadline = resolve_deadline(
            request, route.agent, route.capability, started_at=rec.started_at, default_timeout=self._default_timeout
        )
        if deadline.expired(self._clock.now()):
            raise DeadlineExceeded(f"request {request.request_id}: the deadline passed before anything was sent")
        key = resolve_key(request, route.agent, route.capability)
        owns_retries = engine.transport.owns_retries
        headers = {HEADER_HOPS: hops_header(request.hops, route.agent.name, route.capability.name)}
        if request.tenant:
            headers[HEADER_TENANT] = request.tenant
        if key:
            headers[HEADER_IDEMPOTENCY_KEY] = key
        summary = request.metadata.get(META_SUMMARY) if request.metadata else None
        if summary:
            headers[HEADER_SUMMARY] = summary
        if request.retried_upstream or not owns_retries:
            headers[HEADER_RETRY] = RETRY_UPSTREAM
        if rec.span.get_span_context().is_valid:
            inject_context(headers, context)
        retries_here = not (request.retried_upstream or owns_retries)
        return Flight(request, rec, route, deadline, key, retries_here, headers)

    def _turn_started(self, flight: Flight) -> ScopedKey | None:
        """Tell the turn hook a conversation's turn is in flight where it was routed; its key, to end it.

        Called right after routing, before any await (dedup, quotas): a turn routed but not yet sent is in
        flight already, so relief cannot move a later turn of its conversation elsewhere meanwhile.
        """
        request, turns = flight.request, self._turns
        if turns is None or request.session_id is None:
            return None
        conversation = session_key(request.tenant, request.session_id)
        turns.turn_started(conversation, (flight.route.agent.name, flight.route.instance.instance_id))
        return conversation

    def _turn_ended(self, conversation: ScopedKey | None) -> None:
        if conversation is not None and self._turns is not None:
            self._turns.turn_ended(conversation, self._clock.now())

    def _spans_off(self, now: float) -> bool:
        """Whether spans would record nothing (no SDK): asked of OpenTelemetry at most once a second.

        An installed SDK stays installed, so a yes is kept for good; a global
        SDK installed while the client runs is picked up within a second.
        """
        if self._spans_on:
            return False
        if now < self._spans_recheck:
            return True
        off = spans_are_noop(self._tracer_provider)
        self._spans_on = not off
        self._spans_recheck = now + (_SPANS_RECHECK if self._tracer_provider is None else math.inf)
        return off

    def _sinks_at(self, now: float) -> tuple[ReachMetrics | None, TraceSink | None]:
        """Who reads a request's recorder (metrics) and who gets its trace: the ``sink`` given, split, else the
        global metrics once an SDK is installed (looked for at most once a second)."""
        if self._sink is not None:
            return self._reader, self._traces
        if self._global_metrics is None and now >= self._metrics_recheck:
            self._global_metrics = global_metrics()
            self._metrics_recheck = now + _SPANS_RECHECK
        return self._global_metrics, None

    async def _run(
        self, request: ReachRequest, span: Span, started: float, trace: bool, routed: RouteLike | None
    ) -> ReachResponse:
        reader, sink = self._sinks_at(started)
        rec = TraceRecorder(request, started, self._clock.monotonic(), span, sink=sink, reader=reader, keep=trace)
        start_client_span(span, request)
        try:
            flight = self._prepare(request, rec, None, routed)
            turn = self._turn_started(flight)
            try:
                if flight.key is None:
                    response = await self._attempted(flight)
                else:
                    response = await self._deduplicated(flight, flight.key)
            finally:
                self._turn_ended(turn)
        except ReachError as exc:
            self._refused(rec, exc)
            raise
        return self._finish(rec, response, trace)

    @asynccontextmanager
    async def _held(self, flight: Flight) -> AsyncIterator[Lease | None]:
        """Around a flight's attempts: its quota lease, taken (or RateLimited) and given back on every exit.

        Only a flight that will send is held: a duplicate answered by its twin is charged nothing.
        """
        lease = await self._admit(flight)
        try:
            yield lease
        finally:
            await self._leave(lease)

    async def _attempted(self, flight: Flight) -> ReachResponse:
        """The flight's unary attempts, held (:meth:`_held`)."""
        async with self._held(flight):
            return await run_unary(self._engine, flight)

    async def _admit(self, flight: Flight) -> Lease | None:
        """The request's claim on the fleet's quotas (None without any), a wait for it on the trace; raises
        RateLimited."""
        if self._quotas is None:
            return None
        remaining = flight.deadline.remaining(self._clock.now())
        lease = await self._quotas.acquire(flight.request, flight.route.agent.name, remaining)
        if lease is not None and lease.rechecks:
            flight.rec.event(
                EVENT_QUOTA_WAIT, self._clock.now(), waited_ms=lease.waited * 1000.0, rechecks=lease.rechecks
            )
        return lease

    async def _leave(self, lease: Lease | None) -> None:
        if lease is not None and self._quotas is not None:
            await self._quotas.release(lease)

    async def _deduplicated(self, flight: Flight, idempotency_key: str) -> ReachResponse:
        """Run the flight once per idempotency key: a twin's stored or in-flight result answers the rest.

        The claim is settled by how the flight ended: ``done`` on success, ``unknown`` when an attempt may
        have run and its answer was lost (or the caller went away mid-send), released otherwise. A success
        too large for the store is returned all the same (:meth:`_keep`).
        """
        request = flight.request
        key = store_key(request, idempotency_key)
        stored = await self._claim(flight, key, payload_hash(request))
        if stored is not None:
            return self._replay(flight, stored)
        response: ReachResponse | None = None
        try:
            response = await self._attempted(flight)
        finally:
            ran_at = flight.pin.where if flight.pin is not None else None if response is not None else flight.ran_at
            ending = on_end(response is not None and response.ok, ran_at is not None)
            if ending == "done" and response is not None:
                await self._keep(key, response)
            elif ending == "unknown":
                await self._store.unknown(key, ran_at)
            else:
                await self._store.fail(key)
        return response

    async def _keep(self, key: ScopedKey, response: ReachResponse) -> None:
        """Store a success for its twins; one over the store's byte bound is not kept, and the call still succeeded.

        The store then holds the key ``unknown`` where it ran (no reply, only the payload's digest), so a replay
        is taken over pinned there: the agent's own key check answers it (its stored reply, or
        ``outcome_unknown``), and it never runs as new within the window.
        """
        try:
            await self._store.complete(key, response.model_copy(deep=True))
        except EntryTooLarge as exc:
            logger.warning("%s", exc.message)

    async def _claim(self, flight: Flight, key: ScopedKey, digest: str) -> ReachResponse | None:
        """Own the key (None), or return the stored/in-flight twin's response once it is there.

        The claim is a lease of the request's deadline plus :data:`CLAIM_GRACE`; a key left ``unknown`` (by
        a lost answer or a crashed owner) is taken over pinned where it can be checked, never run as new.
        """
        clock = self._clock
        waited = False
        agent = flight.route.agent
        while True:
            now = clock.now()
            lease = flight.deadline.remaining(now) + CLAIM_GRACE
            where = f"{agent.name}/{flight.route.instance.instance_id}"
            try:
                begin = await self._store.begin(key, digest, lease, window=agent.idempotency.window, where=where)
            except BackendUnavailable as exc:
                if not agent.idempotency.shared:
                    raise
                logger.warning("dedup store unreachable; %s is guarded by %s's own store: %s", key, agent.name, exc)
                flight.rec.event(EVENT_DEDUP_UNAVAILABLE, now, error=exc.message)
                return None
            step = on_begin(begin.state, begin.result is not None)
            if step in ("run", "take_over"):
                claimed_at = begin.where if step == "take_over" else where
                flight.claim = Claim(claimed_at, lambda moved: self._store.sent(key, moved))
            if step == "run":
                return None
            if step == "take_over":
                await self._take_over(flight, key, begin.where)
                return None
            if step == "replay" and begin.result is not None:
                return begin.result
            if flight.deadline.expired(now):
                raise DeadlineExceeded(
                    f"request {flight.request.request_id}: a request with the same idempotency key is still "
                    "in flight and the deadline passed while waiting for it"
                )
            if not waited:
                flight.rec.event(EVENT_DEDUP_WAIT, now)
                waited = True
            result = await self._store.wait(key, flight.deadline.remaining(now))
            if result is not None:
                return result

    async def _take_over(self, flight: Flight, key: ScopedKey, where: str | None) -> None:
        """Own an ``unknown`` key: route only where it can be checked, else hand it back and raise OutcomeUnknown."""
        engine = self._engine
        agent, _, instance = (where or "").partition("/")
        shared = flight.route.agent.idempotency.shared and (not agent or agent == flight.route.agent.name)
        engine.pin(flight, where or f"{flight.route.agent.name}/{flight.route.instance.instance_id}", shared)
        try:
            if where is None and not shared:
                raise engine.outcome_unknown(flight)
            if where is not None and not shared and flight.route.instance.instance_id != instance:
                flight.route = self._route_to(flight, where)
                flight.rec.route = flight.route
        except OutcomeUnknown:
            await self._store.unknown(key, where)
            raise

    def _route_to(self, flight: Flight, where: str) -> RouteLike:
        """The route to the pinned ``agent/instance`` (asked as a ``reach.target`` pin), or OutcomeUnknown."""
        engine = self._engine
        pinned = flight.request.model_copy(update={"metadata": {**flight.request.metadata, TARGET: where}})
        passed: set[tuple[str, str]] = set()
        while True:
            try:
                route = engine.router.route(pinned, exclude=passed)
            except ReachError:
                raise engine.outcome_unknown(flight) from None
            if f"{route.agent.name}/{route.instance.instance_id}" == where:
                return route
            passed.add((route.agent.name, route.instance.instance_id))

    def _replay(self, flight: Flight, stored: ReachResponse) -> ReachResponse:
        rec = flight.rec
        rec.dedup_hit = True
        now = self._clock.now()
        rec.event(EVENT_DEDUP_HIT, now, first_request_id=stored.request_id)
        cost = (now - rec.started_at) * 1000.0
        return stored.model_copy(
            update={"request_id": flight.request.request_id, "attempts": 0, "cost_ms": cost, "trace": None},
            deep=True,
        )

    def _finish(self, rec: TraceRecorder, response: ReachResponse, trace: bool) -> ReachResponse:
        failed = response.status != "success"
        if trace or failed or rec.read:
            rec.usage = usage_of(response.data)
            now = self._clock.now()
            built = rec.build(response.status, response.error, now) if trace or failed else None
            rec.finish(response.status, response.error, now, built)
            if built is not None:
                response.trace = built
        span, route = rec.span, rec.route
        if span.is_recording():
            ended: dict[str, AttributeValue] = {ATTR_ATTEMPTS: response.attempts}
            if route is not None:
                agent, instance = response.agent or route.agent.name, response.instance or route.instance.instance_id
                ended.update(name_client_span(span, agent, instance, route.agent.protocol))
            end_client_span(span, response.status, response.error, rec.dedup_hit, ended)
        return response

    def _refused(self, rec: TraceRecorder, exc: ReachError) -> None:
        error = ErrorInfo(type=exc.error_type, message=exc.message)
        rec.finish("error", error, self._clock.now())
        span, route = rec.span, rec.route
        if span.is_recording():
            span.record_exception(exc)
            named = None if route is None else name_client_span(span, *_who(route.agent, route.instance))
            end_client_span(span, "error", error, rec.dedup_hit, named)

    async def _stream(self, request: ReachRequest) -> AsyncGenerator[list[StreamEvent], None]:
        started = self._clock.now()
        owned = not self._spans_off(started)
        span = self._tracer.start_span(invoke_agent_name(None), kind=SpanKind.CLIENT) if owned else None
        span = span or otel.get_current_span()
        reader, sink = self._sinks_at(started)
        rec = TraceRecorder(request, started, self._clock.monotonic(), span, sink=sink, reader=reader)
        start_client_span(span, request)
        flight: Flight | None = None
        turn: ScopedKey | None = None
        tally = StreamTally()
        try:
            flight = self._prepare(request, rec, otel.set_span_in_context(span))
            turn = self._turn_started(flight)
            explicit = has_explicit_deadline(request)
            attempts = stream_attempts(self._engine, flight, tally, explicit_deadline=explicit, batching=self._batching)
            async with self._held(flight) as lease, aclosing(attempts) as batches:
                async for batch in batches:
                    yield batch
                    if lease is not None and self._quotas is not None:
                        lease = await self._quotas.keep(lease)
        except ReachError as exc:
            self._refused(rec, exc)
            raise
        finally:
            self._turn_ended(turn)
            if flight is not None:
                self._streamed(rec, flight, tally)
            if owned:
                span.end()

    def _streamed(self, rec: TraceRecorder, flight: Flight, tally: StreamTally) -> None:
        """Close a stream's books: what it carried (span attributes and trace), its status, its trace line."""
        status = tally.status if tally.status != "pending" else "cancelled"
        now = self._clock.now()
        rec.event(EVENT_STREAMED, now, events=tally.events, chars=tally.chars)
        rec.finish(status, tally.error, now)
        span = rec.span
        if span.is_recording():
            route = flight.route
            ended: dict[str, AttributeValue] = {
                ATTR_ATTEMPTS: flight.attempts,
                ATTR_STREAM_EVENTS: tally.events,
                ATTR_STREAM_CHARS: tally.chars,
                **name_client_span(span, *_who(route.agent, route.instance)),
            }
            end_client_span(span, status, tally.error, False, ended)


def _who(agent: AgentDescriptor, instance: Instance) -> tuple[str, str, str]:
    """The agent, instance and protocol an ``invoke_agent`` span is named by."""
    return agent.name, instance.instance_id, agent.protocol
