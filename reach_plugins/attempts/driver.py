"""The one driver of a request's attempts, for unary calls and streams: the only awaits and sleeps of the path.

Each turn: admit, try (send a call, or open a stream and wait for its first
event), look up what follows (:meth:`Engine.decide`), feed the breakers and
the trace, then take the step — finish, give up, fail over at once, or sleep
the backoff and retry. Every step moves the request along
:data:`~reach_plugins.attempts.lifecycle.PHASES`, so an impossible one raises.
A won attempt is handed back unsettled: a unary call settles it at once, a
stream once it has relayed its events.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NamedTuple

from reach_plugins.attempts.engine import Engine
from reach_plugins.attempts.flight import Admission, Flight
from reach_plugins.errors import OutcomeUnknown, ReachError
from reach_plugins.model import ReachResponse
from reach_plugins.policy.classify import Verdict
from reach_plugins.telemetry.spans import EVENT_RETRY
from reach_plugins.transport import EventStream, Reply, StreamEvent


class Tried(NamedTuple):
    """What one attempt brought back: its verdict, the reply (unary) or the opened stream and its first event."""

    verdict: Verdict
    answered: bool
    """Something answered (False: the transport raised); through a hop, no answer is the hop's own fault."""
    reply: Reply | None = None
    events: EventStream | None = None
    first: StreamEvent | None = None


class Won(NamedTuple):
    """A successful attempt, not settled yet: its admission, what it brought, and when it started and ended."""

    admission: Admission
    tried: Tried
    started: float
    ended: float
    duration: float


Attempt = Callable[[Engine, Flight, float], Awaitable[Tried]]
"""Make one attempt for ``flight`` starting at ``now`` (send, or open a stream)."""


async def drive(engine: Engine, flight: Flight, attempt: Attempt) -> Won | ReachResponse:
    """Attempts until one succeeds (returned unsettled) or the request's final answer is due (returned)."""
    clock = engine.clock
    last: Tried | None = None
    while True:
        flight.attempts += 1
        try:
            admission = engine.admit_now(flight) or await engine.admit(flight)
        except ReachError as exc:
            flight.attempts -= 1
            if last is None:
                raise
            flight.move("give_up")
            why = f"no instance could take the retry: {exc.message}"
            return engine.give_up(flight, last.verdict, last.reply, why)
        flight.move("admit")
        started, tick = clock.now(), clock.monotonic()
        try:
            tried = await attempt(engine, flight, started)
        except BaseException:
            engine.abandon(admission)
            raise
        flight.move("send")
        now, duration = clock.now(), clock.monotonic() - tick
        reply, verdict = tried.reply, tried.verdict
        flight.far_attempts += reply.attempts if reply is not None else 1
        if verdict.ok:
            flight.move("finish")
            return Won(admission, tried, started, now, duration)
        if tried.events is not None:
            await tried.events.aclose()
        where = flight.route
        step = engine.decide(flight, verdict, admission, now)
        again = step.action == "retry" and not verdict.unreachable
        engine.settle(flight, admission, verdict, duration, again=again, answered=tried.answered)
        engine.record_at(flight, where, verdict, admission, started, now, step.plan.delay)
        flight.move(step.action)
        if step.action == "give_up":
            return engine.give_up(flight, verdict, reply, step.plan.why, out_of_time=step.plan.out_of_time)
        last = tried
        if step.action == "fail_over":
            continue
        delay = step.plan.delay or 0.0
        flight.rec.event(EVENT_RETRY, now, attempt=flight.attempts, delay_ms=delay * 1000.0, outcome=verdict.outcome)
        await clock.sleep(delay)
        if verdict.unreachable or not admission.breaker.available(clock.monotonic()):
            try:
                engine.fail_over(flight, f"{flight.route.instance.instance_id} is unreachable or its breaker opened")
            except OutcomeUnknown:
                flight.move("give_up")
                return engine.give_up(flight, verdict, reply, "the pinned instance cannot take the retry")
            except ReachError as exc:
                if not admission.breaker.available(clock.monotonic()):
                    flight.move("give_up")
                    why = f"no other instance to fail over to: {exc.message}"
                    return engine.give_up(flight, verdict, reply, why)
        flight.move("wake")


async def _send(engine: Engine, flight: Flight, now: float) -> Tried:
    verdict, reply = await engine.send(flight)
    return Tried(verdict, reply is not None, reply)


async def run_unary(engine: Engine, flight: Flight) -> ReachResponse:
    """One unary request through :func:`drive`: a won attempt is settled and answered at once."""
    won = await drive(engine, flight, _send)
    if isinstance(won, ReachResponse):
        return won
    engine.settle(flight, won.admission, won.tried.verdict, won.duration)
    engine.record_at(flight, flight.route, won.tried.verdict, won.admission, won.started, won.ended, None)
    return engine.respond(flight, "success", won.tried.reply.data if won.tried.reply else None, None, won.tried.reply)
