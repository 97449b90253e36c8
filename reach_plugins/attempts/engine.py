"""The attempts of one request: admit, send within the attempt's time, classify, then look up what follows.

:class:`Engine` holds the machinery a pipeline shares across requests
(breakers, guards, router, transport, clock); :class:`Flight` is the state of
one request. What follows an attempt is the table
:data:`~reach_plugins.attempts.lifecycle.AFTER` (DESIGN 11.1), looked up by
:meth:`Engine.decide`; the loop that awaits and sleeps is
:mod:`reach_plugins.attempts.driver`, one for unary calls and streams.
Subscribers (the request's trace recorder, a pipeline's hooks) hear of each
attempt and of each breaker or consistency change it causes through
:class:`~reach_plugins.attempts.hooks.AttemptHooks`.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from reach_plugins.attempts.admission import GuardTable
from reach_plugins.attempts.bounded import within
from reach_plugins.attempts.flight import Admission, Flight, Pin, Plan, Step, where_of
from reach_plugins.attempts.hooks import AttemptHooks, Moved
from reach_plugins.attempts.lifecycle import after
from reach_plugins.attempts.ports import CredentialResolver, RouteLike, RouterLike
from reach_plugins.clock import Clock
from reach_plugins.errors import (
    CircuitOpen,
    DeadlineExceeded,
    NoHealthyAgent,
    OutcomeUnknown,
    RateLimited,
    ReachError,
)
from reach_plugins.model import AttemptRecord, ErrorInfo, Hedging, ReachResponse
from reach_plugins.policy.backoff import retry_delay
from reach_plugins.policy.breaker import Breakers, BreakerTransition, CircuitBreaker, Permit
from reach_plugins.policy.classify import (
    TOKEN_REFUSALS,
    Verdict,
    check_return_schema,
    classify_exception,
    classify_reply,
    refused_before_running,
)
from reach_plugins.policy.consistency import ConsistencyMonitor, ConsistencyTransition, score_reply
from reach_plugins.policy.deadline import (
    RETRY_ROOM_QUANTILE,
    RETRY_ROOM_SAMPLES,
    per_attempt_timeout,
    retry_room,
)
from reach_plugins.policy.hedging import hedging_of
from reach_plugins.policy.latency import Latencies
from reach_plugins.policy.loopguard import check_target, hops_header
from reach_plugins.policy.outliers import OutlierDetector, OutlierTransition
from reach_plugins.telemetry.spans import EVENT_CONSISTENCY, EVENT_FAILOVER, EVENT_GIVE_UP
from reach_plugins.transport import Call, Credential, Reply, Transport
from reach_plugins.wire.headers import HEADER_DEADLINE, HEADER_HOPS

logger = logging.getLogger("reach_plugins.attempts")

Status = Literal["success", "fail", "timeout"]


_NO_CREDENTIAL = Credential()

_REFUSAL_LOG_EVERY = 60.0
"""Seconds between two warnings about the same instance refusing calls for the same cause."""


def _no_credential(agent: Any, tenant: str | None) -> Credential:
    return _NO_CREDENTIAL


_FINISHED = Step("finish", Plan(None, "success"))
_BUSINESS = Step("give_up", Plan(None, "business is never retried"))
"""The steps after a success and a business error: the same every time (and immutable), so made once."""


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
        hooks: tuple[AttemptHooks, ...] = (),
    ) -> None:
        self.router = router
        self.transport = transport
        self.clock = clock
        self.rng = rng
        self.credentials = credentials or _no_credential
        self.hooks = hooks
        """Subscribers that hear of every request's attempts and state changes (beside its trace recorder)."""
        self.breakers = Breakers(self._log_move)
        self.consistency = ConsistencyMonitor(listener=self._log_move)
        """Per-instance reply consistency (capabilities with ``consistency:``): ejects instances answering beside."""
        self.outliers = OutlierDetector(listener=self._log_move)
        """Each instance's latency and failure trend against its peers: slows then ejects an outlier."""
        self.guards = GuardTable()
        self._refusals_logged: dict[tuple[str, str, str], float] = {}
        """When each (agent, instance, cause) of a refusal may be logged again."""
        self.latencies = Latencies()
        """Recent winning latencies of the calls that may be retried safely: when to hedge, when to cut."""
        self.hop: str | None = transport.hop
        """The address of the gateway or node every attempt goes through; its own failures open its breaker."""

    def tell_moved(self, flight: Flight) -> Callable[[Moved], None]:
        """The per-call listener of the breaker and consistency calls made for ``flight``: its subscribers."""
        if not self.hooks:
            return flight.rec.moved
        subscribers = (flight.rec, *self.hooks)

        def tell(change: Moved) -> None:
            for subscriber in subscribers:
                subscriber.moved(change)

        return tell

    def _judge_consistency(self, flight: Flight, data: Any) -> None:
        """Score a successful reply against its request when the capability opted in; feed the monitor."""
        route = flight.route
        policy = route.capability.consistency
        if policy is None:
            return
        score = score_reply(flight.request, data)
        low = self.consistency.record(
            route.agent.name,
            route.instance.instance_id,
            policy,
            score,
            self.clock.monotonic(),
            on_move=self.tell_moved(flight),
        )
        flight.rec.event(EVENT_CONSISTENCY, self.clock.now(), instance=route.instance.instance_id, score=score, low=low)

    @staticmethod
    def _log_move(moved: BreakerTransition | ConsistencyTransition | OutlierTransition) -> None:
        """Log an instance's state change: a warning when it is shut out (opened, ejected)."""
        logger.log(
            logging.WARNING if moved.after in ("open", "ejected") else logging.INFO,
            "%s %s/%s: %s -> %s (%s)",
            moved.kind,
            moved.agent,
            moved.instance,
            moved.before,
            moved.after,
            moved.reason,
        )

    def refusal_of(self, route: RouteLike, verdict: Verdict) -> Verdict:
        """``verdict`` of an answer from ``route``, as a refusal of the instance when it proves nothing ran there
        (:func:`~reach_plugins.policy.classify.refused_before_running`; only for a reach agent answering us
        directly, with the token our issuer signed), logged."""
        if self.hop is not None or route.agent.protocol != "reach" or verdict.ok:
            return verdict
        verdict = refused_before_running(verdict)
        if verdict.refusal:
            self._log_refusal(route, verdict)
        return verdict

    def _log_refusal(self, route: RouteLike, verdict: Verdict) -> None:
        """Warn that an instance refused a call before running it (at most once a minute per instance and cause):
        a token refusal of a token our issuer just signed usually means the instance's clock is off."""
        error = verdict.error
        kind = error.type if error else "refusal"
        where = (route.agent.name, route.instance.instance_id, kind)
        tick = self.clock.monotonic()
        if tick < self._refusals_logged.get(where, -math.inf):
            return
        if len(self._refusals_logged) >= 1024:
            self._refusals_logged.clear()
        self._refusals_logged[where] = tick + _REFUSAL_LOG_EVERY
        hint = " (is its clock skewed?)" if kind in TOKEN_REFUSALS else ""
        logger.warning(
            "%s/%s refused a call before running it%s: %s: %s; failing over, and counting it against the instance",
            route.agent.name,
            route.instance.instance_id,
            hint,
            kind,
            error.message if error else "",
        )

    def admit_now(self, flight: Flight) -> Admission | None:
        """The usual admission, without waiting: a free slot and a closed breaker; else None (use :meth:`admit`)."""
        route = flight.route
        tick = self.clock.monotonic()
        guards = self.guards.get(route.agent, tick)
        slot = guards.try_admit(route.capability, route.instance.instance_id)
        if slot is None:
            return None
        breaker = self.breakers.get(route.agent, route.instance.instance_id, flight.request.tenant)
        closed = breaker.is_closed and (self.hop is None or self.breakers.hop(self.hop).is_closed)
        if closed and not flight.deadline.expired(self.clock.now()):
            permit = breaker.acquire(tick)
            if permit is not None:
                return Admission(guards, slot, breaker, permit, self._hop_permit(tick))
        guards.release(slot)
        return None

    def _hop_permit(self, tick: float) -> tuple[CircuitBreaker, Permit] | None:
        """A permit of the hop's breaker (None without a hop); raises CircuitOpen while the hop's breaker is open."""
        if self.hop is None:
            return None
        breaker = self.breakers.hop(self.hop)
        permit = breaker.acquire(tick)
        if permit is None:
            raise CircuitOpen(
                f"the breaker of {self.hop} is {breaker.state(tick)}: it did not answer, so nothing is sent "
                f"through it for {breaker.open_for:g}s (then it is probed)",
                reasons={self.hop: f"breaker {breaker.state(tick)}"},
            )
        return breaker, permit

    async def admit(self, flight: Flight) -> Admission:
        """Rate limit and concurrency, then the breaker; an instance whose breaker refuses is failed over."""
        while True:
            route = flight.route
            guards = self.guards.get(route.agent, self.clock.monotonic())
            try:
                slot = await guards.admit(route.capability, route.instance.instance_id, self.clock, flight.deadline)
            except RateLimited:
                if not guards.window_full(route.instance.instance_id, route.capability) or not self._spill(flight):
                    raise
                continue
            breaker = self.breakers.get(route.agent, route.instance.instance_id, flight.request.tenant)
            tick = self.clock.monotonic()
            permit = breaker.acquire(tick, on_move=self.tell_moved(flight))
            if permit is not None and not flight.deadline.expired(self.clock.now()):
                try:
                    return Admission(guards, slot, breaker, permit, self._hop_permit(tick))
                except CircuitOpen:
                    breaker.release(permit)
                    guards.release(slot)
                    raise
            guards.release(slot)
            if permit is not None:
                breaker.release(permit)
                raise DeadlineExceeded(
                    f"request {flight.request.request_id}: the deadline passed while waiting for a slot"
                )
            state = breaker.state(tick)
            try:
                self.fail_over(flight, f"breaker of {route.instance.instance_id} is {state}")
            except NoHealthyAgent as exc:
                raise CircuitOpen(
                    f"the breaker of {route.agent.name}/{route.instance.instance_id} is {state} and no other "
                    f"instance can take the request ({exc.message})",
                    reasons={route.instance.instance_id: f"breaker {state}", **exc.reasons},
                ) from exc

    def _spill(self, flight: Flight) -> bool:
        """Whether a flight refused by its instance's full window went to another instance (limits are per
        instance: one narrowed by its overload must not shed calls its peers have room for)."""
        try:
            self.fail_over(flight, f"{flight.route.instance.instance_id}: concurrency window full")
        except ReachError:
            return False
        return True

    def pin(self, flight: Flight, where: str | None, shared: bool) -> None:
        """Keep the rest of the flight where its key can be checked (``where``, or any instance if ``shared``)."""
        flight.pin = Pin(where or where_of(flight.route), shared)

    def check_pin(self, flight: Flight, route: RouteLike) -> None:
        """Raise OutcomeUnknown when ``route`` cannot check the pinned key (another instance, another agent)."""
        pin = flight.pin
        if pin is None or where_of(route) == pin.where:
            return
        if pin.shared and route.agent.name == pin.where.partition("/")[0]:
            return
        raise self.outcome_unknown(flight)

    @staticmethod
    def outcome_unknown(flight: Flight) -> OutcomeUnknown:
        """The end of a keyed flight whose answer was lost where no one else can check its key."""
        where = flight.pin.where if flight.pin is not None else None
        return OutcomeUnknown(
            f"request {flight.request.request_id}: an attempt at {where} was sent and its answer lost, and "
            f"{where} cannot take the retry; retrying later with idempotency key {flight.key!r} is safe "
            "(it is checked before anything runs again)",
            key=flight.key,
        )

    def fail_over(self, flight: Flight, reason: str) -> None:
        """Route again without the instances tried so far (raises NoHealthyAgent/CircuitOpen when none is left,
        OutcomeUnknown when the flight is pinned and the next candidate cannot check its key)."""
        old = flight.route
        flight.excluded.add((old.agent.name, old.instance.instance_id))
        if flight.pin is not None and not flight.pin.shared:
            raise self.outcome_unknown(flight)
        route = self.router.route(flight.request, exclude=flight.excluded)
        self.check_pin(flight, route)
        check_target(flight.request.hops, route.agent.name, route.capability.name)
        flight.headers[HEADER_HOPS] = hops_header(flight.request.hops, route.agent.name, route.capability.name)
        flight.route = route
        flight.rec.route = route
        flight.rec.event(
            EVENT_FAILOVER,
            self.clock.now(),
            reason=reason,
            **{"from": old.instance.instance_id},
            to=route.instance.instance_id,
        )

    def hedging(self, flight: Flight) -> Hedging | None:
        """The hedging policy of ``flight`` when this layer may hedge it (it routes and retries, no hop owns
        that, the call is not bound to a conversation's instance, and it may run twice: see
        :func:`~reach_plugins.policy.hedging.hedging_of`), else None."""
        if self.hop is not None or not flight.retries_here or flight.request.session_id is not None:
            return None
        if flight.pin is not None and not flight.pin.shared:
            return None
        return hedging_of(flight.route.agent, flight.route.capability, keyed=flight.key is not None)

    def hedge(self, flight: Flight) -> tuple[Flight, Admission] | None:
        """A second attempt of ``flight`` at another instance of the same agent, admitted without waiting; None
        when there is no such instance, it cannot be admitted now, or the retry budget says no (a hedge spends a
        retry token, as gRPC's throttling counts hedges: under a full outage hedging adds no load)."""
        route = flight.route
        exclude = {*flight.excluded, (route.agent.name, route.instance.instance_id)}
        try:
            other = self.router.route(flight.request, exclude=exclude)
        except ReachError:
            return None
        if other.agent.name != route.agent.name:
            return None
        sibling = replace(flight, route=other, excluded=exclude, attempts=flight.attempts + 1)
        admission = self.admit_now(sibling)
        if admission is None:
            return None
        if not admission.guards.budget.spend():
            self.abandon(admission)
            return None
        sibling.spent_retry = True
        return sibling, admission

    def adopt(self, flight: Flight, winner: Flight) -> None:
        """Carry on ``flight`` from the hedge that ended the race: its instance, and where it may have run."""
        flight.excluded.add((flight.route.agent.name, flight.route.instance.instance_id))
        flight.route = winner.route
        flight.rec.route = winner.route
        flight.ran_at = winner.ran_at
        flight.spent_retry = flight.spent_retry or winner.spent_retry

    def cancelled(self, flight: Flight, admission: Admission, started: float, tick: float) -> None:
        """Free the admission of an attempt that lost its race (started at ``started``, monotonic ``tick``), record
        it as ``cancelled``, and tell the outlier detector it ran that long unanswered: a censored sample, so a
        slow instance whose attempts keep losing races is still judged (issue 25)."""
        self.abandon(admission)
        where, now = admission.breaker, self.clock.monotonic()
        tell = self.tell_moved(flight)
        self.outliers.censored(where.agent, where.instance, at_least=now - tick, now=now, on_move=tell)
        lost, wall = "another attempt of the request answered first", self.clock.now()
        record = self._record(flight, flight.route, admission, started, wall, "cancelled", lost, None, "unknown")
        self._publish(flight, record, kept=True)

    @staticmethod
    def _retry_safe(flight: Flight) -> bool:
        """Whether this layer retries the call and a retry is checked (a key) or harmless (a ``safe`` capability)."""
        return flight.retries_here and (flight.key is not None or flight.route.capability.safe)

    def _retry_room(self, flight: Flight, now: float) -> float:
        """What an attempt may take so that its answer lost leaves the retries their share of the deadline
        (:func:`~reach_plugins.policy.deadline.retry_room`): the first attempt never uses the whole deadline once
        the capability's latency is known."""
        route = flight.route
        policy = route.capability.retry or route.agent.retry
        p99 = self.latencies.quantile(
            route.agent.name, route.capability.name, RETRY_ROOM_QUANTILE, min_samples=RETRY_ROOM_SAMPLES
        )
        return retry_room(flight.deadline.remaining(now), policy.max_attempts - flight.counted, p99)

    def won(self, flight: Flight, seconds: float) -> None:
        """A call that may be retried safely succeeded in ``seconds`` at its last attempt: remember its latency."""
        if self._retry_safe(flight):
            self.latencies.record(flight.route.agent.name, flight.route.capability.name, seconds)

    def prepare(self, flight: Flight, timeout: float, now: float) -> Call:
        """The call of the next attempt. Downstream credentials are resolved only where they are sent: through a
        gateway or node the hop holds and injects them (DESIGN 11.4), so the caller needs none of them."""
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
            credential=self.credentials(route.agent, flight.request.tenant) if self.hop is None else _NO_CREDENTIAL,
            headers=headers,
            span=flight.rec.span,
        )

    async def send(self, flight: Flight) -> tuple[Verdict, Reply | None]:
        """One attempt within ``min(remaining, per-attempt timeout)``, classified."""
        now = self.clock.now()
        route = flight.route
        timeout = flight.deadline.attempt_timeout(now, per_attempt_timeout(route.agent, route.capability))
        if self._retry_safe(flight):
            timeout = min(timeout, self._retry_room(flight, now))
        call = self.prepare(flight, timeout, now)
        before, flight.ran_at = flight.ran_at, where_of(route)
        self.consistency.sent(route.agent.name, route.instance.instance_id, self.clock.monotonic())
        if flight.claim is not None and flight.claim.where != flight.ran_at:
            await flight.claim.moved(flight.ran_at)
        try:
            reply = await within(self.clock, now + timeout, self.transport.send(call))
        except (ReachError, TimeoutError) as exc:
            if isinstance(exc, ReachError) and exc.refused:
                flight.ran_at = before
                raise
            verdict = classify_exception(exc)
            if not verdict.delivered:
                flight.ran_at = before
            return verdict, None
        verdict = self.refusal_of(route, classify_reply(reply))
        if not verdict.delivered:
            flight.ran_at = before
        if verdict.ok:
            verdict = check_return_schema(route.capability, reply.data) or verdict
        if verdict.ok:
            self._judge_consistency(flight, reply.data)
        return verdict, reply

    def settle(
        self,
        flight: Flight,
        admission: Admission,
        verdict: Verdict,
        duration: float,
        *,
        again: bool = False,
        answered: bool = True,
    ) -> None:
        """Feed the breakers, the retry budget and the adaptive limit; free the slots.

        ``again``: the request retries on the same instance. The breaker then
        waits for the request's last attempt there, so it judges requests, not
        attempts: a flaky instance whose retries succeed is not opened, a dead
        one (every attempt fails) is. ``answered``: something answered (False:
        the transport raised). Through a hop, no answer is the hop's own
        failure: it goes to the hop's breaker and the instance is not blamed.
        """
        tick = self.clock.monotonic()
        fault = verdict.instance_fault and not admission.guards.at_capacity(admission.slot, verdict)
        """Overload is never a fault (backpressure is none by its class; a timeout at the instance's capacity is
        excused here): it narrows the instance's window, no breaker (instance's or hop's) counts it."""
        hop_fault = admission.hop is not None and not answered and fault
        tell = self.tell_moved(flight)
        if admission.hop is not None:
            admission.hop[0].record(admission.hop[1], tick, failure=hop_fault, duration=duration, on_move=tell)
        if hop_fault or (again and fault):
            admission.breaker.release(admission.permit)
        else:
            admission.breaker.record(admission.permit, tick, failure=fault, duration=duration, on_move=tell)
        if not hop_fault:
            failure = verdict.instance_fault and not verdict.overload
            where = admission.breaker
            self.outliers.record(where.agent, where.instance, latency=duration, failure=failure, now=tick, on_move=tell)
        if verdict.ok:
            admission.guards.budget.record_success(retry=flight.spent_retry)
        latency = duration if verdict.ok else None
        refused = verdict.overload and not verdict.delivered
        admission.guards.done(admission.slot, tick, latency=latency, overload=verdict.overload, refused=refused)

    def abandon(self, admission: Admission) -> None:
        """Free an admission whose attempt was cancelled before it produced a result."""
        admission.breaker.release(admission.permit)
        if admission.hop is not None:
            admission.hop[0].release(admission.hop[1])
        admission.guards.release(admission.slot)

    def plan_retry(self, flight: Flight, verdict: Verdict, admission: Admission, now: float) -> Plan:
        """The backoff before the next attempt, or why there is none."""
        if not verdict.retryable:
            return Plan(None, f"{verdict.outcome} is never retried")
        if not flight.retries_here and verdict.outcome != "backpressure":
            return Plan(None, "retries belong to another layer (retried upstream, or the transport retries)")
        capability = flight.route.capability
        policy = capability.retry or flight.route.agent.retry
        if flight.counted >= policy.max_attempts:
            return Plan(None, f"max_attempts {policy.max_attempts} reached")
        if verdict.delivered and not capability.retryable and flight.key is None:
            return Plan(None, f"capability {capability.name!r} is not retryable and the agent may have executed it")
        if not admission.guards.budget.allows_retry():
            return Plan(None, f"retry budget of agent {flight.route.agent.name!r} is exhausted")
        delay = retry_delay(flight.attempts - 1, policy, self.rng, verdict.retry_after)
        if not flight.deadline.fits(now, delay):
            return Plan(None, f"a retry after {delay:.3g}s would start past the deadline", out_of_time=True)
        flight.spent_retry = admission.guards.budget.spend() or flight.spent_retry
        return Plan(delay, "retry")

    def decide(self, flight: Flight, verdict: Verdict, admission: Admission, now: float) -> Step:
        """The step after an attempt: its row of :data:`~reach_plugins.attempts.lifecycle.AFTER`, carried out."""
        row = after(verdict.stage, flight.key is not None)
        if row.action == "finish":
            return _FINISHED
        if row.action == "give_up":
            return _BUSINESS
        if row.fail_over_first and flight.retries_here:
            try:
                self.fail_over(flight, f"{flight.route.instance.instance_id}: not delivered ({verdict.outcome})")
            except ReachError:
                pass
            else:
                return Step("fail_over", Plan(0.0, "not delivered: failed over at once"))
        flight.counted += 1
        if row.pin and flight.pin is None:
            self.pin(flight, where_of(flight.route), flight.route.agent.idempotency.shared)
        plan = self.plan_retry(flight, verdict, admission, now)
        return Step("give_up" if plan.delay is None else "retry", plan)

    def record_at(
        self,
        flight: Flight,
        route: RouteLike,
        verdict: Verdict,
        admission: Admission,
        started: float,
        now: float,
        delay: float | None,
    ) -> None:
        """Tell the subscribers of the attempt at ``route`` (the flight may have failed over since); a success
        only when someone will read it."""
        keeps = flight.rec.keeps(flight.attempts)
        if verdict.ok and not keeps and not self.hooks:
            return
        error = verdict.error.message if verdict.error else None
        record = self._record(flight, route, admission, started, now, verdict.outcome, error, delay, verdict.delivery)
        self._publish(flight, record, kept=not verdict.ok or keeps)

    def _record(
        self,
        flight: Flight,
        route: RouteLike,
        admission: Admission,
        started: float,
        now: float,
        outcome: str,
        error: str | None,
        delay: float | None,
        delivery: str,
    ) -> AttemptRecord:
        return AttemptRecord(
            number=flight.attempts,
            agent=route.agent.name,
            instance=route.instance.instance_id,
            endpoint=route.instance.endpoint,
            started_at=started,
            duration_ms=(now - started) * 1000.0,
            outcome=outcome,
            error=error,
            retry_delay_ms=None if delay is None else delay * 1000.0,
            breaker_state=admission.breaker.state(self.clock.monotonic()),
            delivery=delivery,
        )

    def _publish(self, flight: Flight, record: AttemptRecord, *, kept: bool) -> None:
        """``record`` to every hook, and to the request's trace when ``kept``."""
        if kept:
            flight.rec.attempt(record)
        for hook in self.hooks:
            hook.attempt(record)

    def respond(
        self, flight: Flight, status: Status, data: Any, error: ErrorInfo | None, reply: Reply | None = None
    ) -> ReachResponse:
        """The response; who served it is what the far side says (a gateway or node may have failed over)."""
        route = flight.route
        affinity = route.affinity
        return ReachResponse(
            request_id=flight.request.request_id,
            status=status,
            data=data,
            error=error,
            agent=(reply.agent if reply is not None and reply.agent else route.agent.name),
            instance=(reply.instance if reply is not None and reply.instance else route.instance.instance_id),
            attempts=flight.far_attempts,
            cost_ms=(self.clock.now() - flight.rec.started_at) * 1000.0,
            context_restore=affinity == "restored",
            degraded=affinity == "degraded",
            media=list(reply.media) if reply is not None else [],
        )

    def give_up(
        self, flight: Flight, verdict: Verdict, reply: Reply | None, why: str, *, out_of_time: bool = False
    ) -> ReachResponse:
        """The final answer of a request that did not succeed: ``timeout`` or ``fail``, never the bad data."""
        now = self.clock.now()
        flight.rec.event(EVENT_GIVE_UP, now, reason=why, outcome=verdict.outcome)
        last = verdict.error.message if verdict.error else verdict.outcome
        if flight.pin is not None and not verdict.settled:
            unknown = self.outcome_unknown(flight)
            info = ErrorInfo(type=unknown.error_type, message=f"{unknown.message}; gave up: {why}; last error: {last}")
            late = out_of_time or flight.deadline.expired(now)
            return self.respond(flight, "timeout" if late else "fail", None, info)
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
