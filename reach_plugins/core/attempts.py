"""The attempts of one request: admit, send within the attempt's time, classify, then retry, fail over or stop.

:class:`Engine` holds the machinery a pipeline shares across requests
(breakers, guards, router, transport, clock); :class:`Flight` is the state of
one request. ``run_unary`` is the retry loop; streaming reuses the same steps.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, Literal

from reach_plugins.core.backoff import retry_delay
from reach_plugins.core.breaker import Breakers, BreakerTransition, CircuitBreaker, Permit
from reach_plugins.core.classify import Verdict, check_return_schema, classify_exception, classify_reply
from reach_plugins.core.clock import Clock, SystemClock
from reach_plugins.core.deadline import Deadline, per_attempt_timeout
from reach_plugins.core.guards import AgentGuards, GuardTable, Slot
from reach_plugins.core.loopguard import check_target, hops_header
from reach_plugins.core.ports import CredentialResolver, RouteLike, RouterLike
from reach_plugins.core.trace import TraceRecorder
from reach_plugins.errors import CircuitOpen, DeadlineExceeded, NoHealthyAgent, ReachError
from reach_plugins.model import ErrorInfo, ReachRequest, ReachResponse
from reach_plugins.telemetry import (
    ATTR_BREAKER_FROM,
    ATTR_BREAKER_TO,
    EVENT_BREAKER,
    EVENT_FAILOVER,
    EVENT_GIVE_UP,
    EVENT_RETRY,
    HEADER_DEADLINE,
    HEADER_HOPS,
)
from reach_plugins.transport import Call, Credential, Reply, Transport

logger = logging.getLogger("reach_plugins.core")

Status = Literal["success", "fail", "timeout"]


_NO_CREDENTIAL = Credential()


def _no_credential(agent: Any, tenant: str | None) -> Credential:
    return _NO_CREDENTIAL


@dataclass(slots=True)
class Flight:
    """The running state of one request."""

    request: ReachRequest
    rec: TraceRecorder
    route: RouteLike
    deadline: Deadline
    key: str | None
    retries_here: bool
    """Whether this layer owns retries (not marked ``retried_upstream``, transport does not retry)."""
    headers: dict[str, str]
    attempts: int = 0
    far_attempts: int = 0
    excluded: set[tuple[str, str]] = field(default_factory=set)
    status: str = "pending"
    error: ErrorInfo | None = None
    streamed_events: int = 0
    """Data events handed to the caller of a stream (a unary request leaves it 0)."""
    streamed_chars: int = 0
    """Characters of text those events carried (:func:`~reach_plugins.core.batching.streamed_chars`)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What follows a failed attempt: a retry after ``delay`` seconds, or (``delay`` None) the end, and why."""

    delay: float | None
    why: str
    out_of_time: bool = False


@dataclass(frozen=True, slots=True)
class Admission:
    """What one admitted attempt holds: concurrency slots and a breaker permit."""

    guards: AgentGuards
    slot: Slot
    breaker: CircuitBreaker
    permit: Permit


class Engine:
    """The shared machinery of a pipeline; every method works on one :class:`Flight`."""

    def __init__(
        self,
        *,
        router: RouterLike,
        transport: Transport,
        clock: Clock,
        rng: random.Random,
        credentials: CredentialResolver | None,
    ) -> None:
        self.router = router
        self.transport = transport
        self.clock = clock
        self.rng = rng
        self.credentials = credentials or _no_credential
        self.breakers = Breakers(self._on_transition)
        self.guards = GuardTable()
        self.observer: TraceRecorder | None = None
        """The request whose breaker call is running now: transitions it causes land in its trace."""
        enforces = bool(getattr(transport, "enforces_timeout", False))
        self.transport_times_out = enforces and isinstance(clock, SystemClock)
        """The transport bounds each send by ``call.timeout`` in real time: a second timer here would be waste."""

    def _on_transition(self, transition: BreakerTransition) -> None:
        level = logging.WARNING if transition.after == "open" else logging.INFO
        logger.log(
            level,
            "breaker %s/%s: %s -> %s (%s)",
            transition.agent,
            transition.instance,
            transition.before,
            transition.after,
            transition.reason,
        )
        if self.observer is not None:
            self.observer.event(
                EVENT_BREAKER,
                transition.at,
                instance=transition.instance,
                reason=transition.reason,
                **{ATTR_BREAKER_FROM: transition.before, ATTR_BREAKER_TO: transition.after},
            )

    def admit_now(self, flight: Flight) -> Admission | None:
        """The usual admission, without waiting: a free slot and a closed breaker; else None (use :meth:`admit`)."""
        route = flight.route
        now = self.clock.now()
        guards = self.guards.get(route.agent, now)
        slot = guards.try_admit(route.capability)
        if slot is None:
            return None
        breaker = self.breakers.get(route.agent, route.instance.instance_id)
        if breaker.is_closed and not flight.deadline.expired(now):
            permit = breaker.acquire(now)
            if permit is not None:
                return Admission(guards, slot, breaker, permit)
        guards.release(slot)
        return None

    async def admit(self, flight: Flight) -> Admission:
        """Rate limit and concurrency, then the breaker; an instance whose breaker refuses is failed over."""
        while True:
            route = flight.route
            guards = self.guards.get(route.agent, self.clock.now())
            slot = await guards.admit(route.capability, self.clock, flight.deadline)
            breaker = self.breakers.get(route.agent, route.instance.instance_id)
            now = self.clock.now()
            self.observer = flight.rec
            try:
                permit = breaker.acquire(now)
            finally:
                self.observer = None
            if permit is not None and not flight.deadline.expired(now):
                return Admission(guards, slot, breaker, permit)
            guards.release(slot)
            if permit is not None:
                breaker.release(permit)
                raise DeadlineExceeded(
                    f"request {flight.request.request_id}: the deadline passed while waiting for a slot"
                )
            state = breaker.state(now)
            try:
                self.fail_over(flight, f"breaker of {route.instance.instance_id} is {state}")
            except NoHealthyAgent as exc:
                raise CircuitOpen(
                    f"the breaker of {route.agent.name}/{route.instance.instance_id} is {state} and no other "
                    f"instance can take the request ({exc.message})",
                    reasons={route.instance.instance_id: f"breaker {state}", **exc.reasons},
                ) from exc

    def fail_over(self, flight: Flight, reason: str) -> None:
        """Route again without the instances tried so far (raises NoHealthyAgent/CircuitOpen when none is left)."""
        old = flight.route
        flight.excluded.add((old.agent.name, old.instance.instance_id))
        route = self.router.route(flight.request, exclude=flight.excluded)
        check_target(flight.request.hops, route.agent.name, route.capability.name)
        flight.headers[HEADER_HOPS] = hops_header(flight.request.hops, route.agent.name, route.capability.name)
        flight.route = route
        flight.rec.route = route.decision
        flight.rec.event(
            EVENT_FAILOVER,
            self.clock.now(),
            reason=reason,
            **{"from": old.instance.instance_id},
            to=route.instance.instance_id,
        )

    def prepare(self, flight: Flight, timeout: float, now: float) -> Call:
        route = flight.route
        headers = dict(flight.headers)
        headers[HEADER_DEADLINE] = str(max(0, int((flight.deadline.at - now) * 1000.0)))
        return Call(
            request=flight.request,
            agent=route.agent,
            instance=route.instance,
            timeout=timeout,
            attempt=flight.attempts,
            capability=route.capability,
            credential=self.credentials(route.agent, flight.request.tenant),
            headers=headers,
        )

    async def send(self, flight: Flight) -> tuple[Verdict, Reply | None]:
        """One attempt within ``min(remaining, per-attempt timeout)``, classified."""
        now = self.clock.now()
        route = flight.route
        timeout = flight.deadline.attempt_timeout(now, per_attempt_timeout(route.agent, route.capability))
        call = self.prepare(flight, timeout, now)
        try:
            if self.transport_times_out:
                reply = await self.transport.send(call)
            else:
                async with self.clock.timeout_at(now + timeout):
                    reply = await self.transport.send(call)
        except (ReachError, TimeoutError) as exc:
            if isinstance(exc, ReachError) and exc.refused:
                raise
            return classify_exception(exc), None
        verdict = classify_reply(reply)
        if verdict.ok:
            verdict = check_return_schema(route.capability, reply.data) or verdict
        return verdict, reply

    def settle(self, flight: Flight, admission: Admission, verdict: Verdict, duration: float, now: float) -> None:
        """Feed the breaker, the retry budget and the adaptive limit; free the slots."""
        self.observer = flight.rec
        try:
            admission.breaker.record(admission.permit, now, failure=verdict.instance_fault, duration=duration)
        finally:
            self.observer = None
        if verdict.ok:
            admission.guards.budget.record_success()
        elif verdict.retryable:
            admission.guards.budget.record_failure()
        latency = duration if verdict.ok else None
        admission.guards.done(admission.slot, now, latency=latency, overload=verdict.overload)

    def abandon(self, admission: Admission) -> None:
        """Free an admission whose attempt was cancelled before it produced a result."""
        admission.breaker.release(admission.permit)
        admission.guards.release(admission.slot)

    def plan_retry(self, flight: Flight, verdict: Verdict, admission: Admission, now: float) -> Plan:
        """The backoff before the next attempt, or why there is none."""
        if not verdict.retryable:
            return Plan(None, f"{verdict.outcome} is never retried")
        if not flight.retries_here and verdict.outcome != "backpressure":
            return Plan(None, "retries belong to another layer (retried upstream, or the transport retries)")
        capability = flight.route.capability
        policy = capability.retry or flight.route.agent.retry
        if flight.attempts >= policy.max_attempts:
            return Plan(None, f"max_attempts {policy.max_attempts} reached")
        if verdict.delivered and not capability.retryable and flight.key is None:
            return Plan(None, f"capability {capability.name!r} is not retryable and the agent may have executed it")
        if not admission.guards.budget.allows_retry():
            return Plan(None, f"retry budget of agent {flight.route.agent.name!r} is exhausted")
        delay = retry_delay(flight.attempts - 1, policy, self.rng, verdict.retry_after)
        if not flight.deadline.fits(now, delay):
            return Plan(None, f"a retry after {delay:.3g}s would start past the deadline", out_of_time=True)
        return Plan(delay, "retry")

    def record(
        self, flight: Flight, verdict: Verdict, admission: Admission, started: float, now: float, delay: float | None
    ) -> None:
        """Add the attempt to the request's trace (a success only when someone will read it)."""
        if verdict.ok and not flight.rec.keep:
            return
        route = flight.route
        flight.rec.attempt(
            number=flight.attempts,
            agent=route.agent.name,
            instance=route.instance.instance_id,
            endpoint=route.instance.endpoint,
            started_at=started,
            duration_ms=(now - started) * 1000.0,
            outcome=verdict.outcome,
            error=verdict.error.message if verdict.error else None,
            retry_delay_ms=None if delay is None else delay * 1000.0,
            breaker_state=admission.breaker.state(now),
            delivered=verdict.delivered,
        )

    def respond(
        self, flight: Flight, status: Status, data: Any, error: ErrorInfo | None, reply: Reply | None = None
    ) -> ReachResponse:
        """The response; who served it is what the far side says (a gateway or node may have failed over)."""
        route = flight.route
        decision = route.decision
        return ReachResponse(
            request_id=flight.request.request_id,
            status=status,
            data=data,
            error=error,
            agent=(reply.agent if reply is not None and reply.agent else route.agent.name),
            instance=(reply.instance if reply is not None and reply.instance else route.instance.instance_id),
            attempts=flight.far_attempts,
            cost_ms=(self.clock.now() - flight.rec.started_at) * 1000.0,
            context_restore=decision.context_restore,
            degraded=decision.degraded,
        )

    def give_up(
        self, flight: Flight, verdict: Verdict, reply: Reply | None, why: str, *, out_of_time: bool = False
    ) -> ReachResponse:
        """The final answer of a request that did not succeed: ``timeout`` or ``fail``, never the bad data."""
        now = self.clock.now()
        flight.rec.event(EVENT_GIVE_UP, now, reason=why, outcome=verdict.outcome)
        last = verdict.error.message if verdict.error else verdict.outcome
        if verdict.outcome == "invalid_response":
            logger.warning(
                "request %s: invalid response from %s: %s",
                flight.request.request_id,
                flight.route.instance.instance_id,
                last,
            )
        if out_of_time or verdict.outcome == "timeout" or flight.deadline.expired(now):
            message = f"deadline reached after {flight.attempts} attempt(s) ({why}); last error: {last}"
            return self.respond(flight, "timeout", None, ErrorInfo(type="timeout", message=message))
        data = reply.data if reply is not None and verdict.outcome == "business" else None
        error = verdict.error or ErrorInfo(type=verdict.outcome, message=why)
        return self.respond(flight, "fail", data, error, reply)


async def run_unary(engine: Engine, flight: Flight) -> ReachResponse:
    """Attempt, classify, retry with full jitter within budget and deadline, fail over; return the answer."""
    clock = engine.clock
    last: tuple[Verdict, Reply | None] | None = None
    while True:
        flight.attempts += 1
        admission = engine.admit_now(flight)
        if admission is None:
            try:
                admission = await engine.admit(flight)
            except ReachError as exc:
                flight.attempts -= 1
                if last is None:
                    raise
                return engine.give_up(flight, last[0], last[1], f"no instance could take the retry: {exc.message}")
        started = clock.now()
        try:
            verdict, reply = await engine.send(flight)
        except BaseException:
            engine.abandon(admission)
            raise
        now = clock.now()
        engine.settle(flight, admission, verdict, now - started, now)
        flight.far_attempts += reply.attempts if reply is not None else 1
        if verdict.ok and reply is not None:
            engine.record(flight, verdict, admission, started, now, None)
            return engine.respond(flight, "success", reply.data, None, reply)
        plan = engine.plan_retry(flight, verdict, admission, now)
        engine.record(flight, verdict, admission, started, now, plan.delay)
        if plan.delay is None:
            return engine.give_up(flight, verdict, reply, plan.why, out_of_time=plan.out_of_time)
        delay = plan.delay
        last = (verdict, reply)
        flight.rec.event(EVENT_RETRY, now, attempt=flight.attempts, delay_ms=delay * 1000.0, outcome=verdict.outcome)
        await clock.sleep(delay)
        if verdict.unreachable or not admission.breaker.available(clock.now()):
            try:
                engine.fail_over(flight, f"{flight.route.instance.instance_id} is unreachable or its breaker opened")
            except ReachError as exc:
                if not admission.breaker.available(clock.now()):
                    return engine.give_up(flight, verdict, reply, f"no other instance to fail over to: {exc.message}")
