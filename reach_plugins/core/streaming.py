"""Streamed replies through the same core: retried only until the first event has been passed on.

Three tiers of time: the first event must come within the attempt's time;
after that each gap between events is bounded by ``stream_idle`` (and by the
request's deadline only when the caller set one), so a long, lively stream is
never cut by a total timeout — the seeds' half-finished answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from reach_plugins.core.attempts import Admission, Engine, Flight
from reach_plugins.core.classify import SUCCESS, Verdict, classify_exception, classify_reply
from reach_plugins.core.deadline import per_attempt_timeout, timeouts_for
from reach_plugins.errors import ReachError
from reach_plugins.model import ErrorInfo
from reach_plugins.telemetry import EVENT_RETRY
from reach_plugins.transport import Reply, StreamEvent


def classify_event(event: StreamEvent) -> Verdict:
    """``data``/``end`` succeed; an ``error`` event is classified like a failed reply."""
    if event.kind != "error":
        return SUCCESS
    error = event.error or ErrorInfo(type="transient", message="the stream reported an error without details")
    return classify_reply(Reply(status="fail", error=error))


async def _close(events: AsyncIterator[StreamEvent]) -> None:
    aclose: Any = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


def _error_event(verdict: Verdict) -> StreamEvent:
    return StreamEvent("error", error=verdict.error or ErrorInfo(type=verdict.outcome, message=verdict.outcome))


async def stream_attempts(engine: Engine, flight: Flight, *, explicit_deadline: bool) -> AsyncIterator[StreamEvent]:
    """Yield the events of the first attempt whose stream starts well; sets ``flight.status`` at the end."""
    clock = engine.clock
    last: Verdict | None = None
    while True:
        flight.attempts += 1
        try:
            admission = await engine.admit(flight)
        except ReachError as exc:
            flight.attempts -= 1
            if last is None:
                raise
            final = engine.give_up(flight, last, None, f"no instance could take the retry: {exc.message}")
            flight.status, flight.error = final.status, final.error
            yield StreamEvent("error", error=final.error)
            return
        settled = False
        started = clock.now()
        route = flight.route
        timeout = flight.deadline.attempt_timeout(started, per_attempt_timeout(route.agent, route.capability))
        events = engine.transport.stream(engine.prepare(flight, timeout, started))
        try:
            first: StreamEvent | None = None
            try:
                async with clock.timeout_at(started + timeout):
                    first = await anext(events)
            except StopAsyncIteration:
                first = StreamEvent("end")
            except (ReachError, TimeoutError) as exc:
                verdict = classify_exception(exc)
            if first is not None:
                verdict = classify_event(first)
            now = clock.now()
            flight.far_attempts += 1
            if first is None or not verdict.ok:
                engine.settle(flight, admission, verdict, now - started, now)
                settled = True
                plan = engine.plan_retry(flight, verdict, admission, now)
                engine.record(flight, verdict, admission, started, now, plan.delay)
                if plan.delay is None:
                    final = engine.give_up(flight, verdict, None, plan.why, out_of_time=plan.out_of_time)
                    flight.status, flight.error = final.status, final.error
                    yield StreamEvent("error", error=final.error)
                    return
                last = verdict
                flight.rec.event(EVENT_RETRY, now, attempt=flight.attempts, delay_ms=plan.delay * 1000.0)
                await clock.sleep(plan.delay)
                if verdict.unreachable or not admission.breaker.available(clock.now()):
                    try:
                        engine.fail_over(flight, f"{route.instance.instance_id} failed before its first event")
                    except ReachError:
                        if not admission.breaker.available(clock.now()):
                            raise
                continue
            first_delay = now - started
            yield first
            verdict = SUCCESS if first.kind == "end" else await _follow(engine, flight, events, admission)
            if verdict.ok:
                flight.status = "success"
            else:
                flight.status = "timeout" if verdict.outcome == "timeout" else "fail"
                flight.error = verdict.error
            end = clock.now()
            engine.settle(flight, admission, verdict, first_delay, end)
            settled = True
            engine.record(flight, verdict, admission, started, end, None)
            if verdict.error is not None:
                yield _error_event(verdict)
            return
        finally:
            if not settled:
                engine.abandon(admission)
            await _close(events)


async def _follow(engine: Engine, flight: Flight, events: AsyncIterator[StreamEvent], admission: Admission) -> Verdict:
    """Pass events on until the end; the verdict says how the stream finished (an error is not retried now)."""
    clock = engine.clock
    route = flight.route
    idle = timeouts_for(route.agent, route.capability).stream_idle
    explicit_end = flight.deadline.at if flight.explicit_deadline else None
    raise NotImplementedError
