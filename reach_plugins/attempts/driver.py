"""The one driver of a request's attempts, for unary calls and streams: the only awaits and sleeps of the path.

Each turn: admit, try (send a call, or open a stream and wait for its first
event), look up what follows (:meth:`Engine.decide`), feed the breakers and
the trace, then take the step — finish, give up, fail over at once, or sleep
the backoff and retry. Every step moves the request along
:data:`~reach_plugins.attempts.lifecycle.PHASES`, so an impossible one raises.
A won attempt is handed back unsettled: a unary call settles it at once, a
stream once it has relayed its events.

A unary call that may be hedged (:meth:`Engine.hedging`) races: when its
attempt has not answered within the capability's hedge delay, a second one
goes to another instance; the first success wins and the other is cancelled
(recorded ``cancelled``, and fed to the outlier detector as a censored
latency); an attempt that fails while the other still runs is settled and the
race waits for the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from reach_plugins.attempts.engine import Engine
from reach_plugins.attempts.flight import Admission, Flight
from reach_plugins.errors import OutcomeUnknown, ReachError
from reach_plugins.model import Hedging, ReachResponse
from reach_plugins.policy.classify import Verdict
from reach_plugins.policy.hedging import hedge_delay
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


class Raced(NamedTuple):
    """How a hedged race ended: the attempt that decides it, its admission, and when it started."""

    tried: Tried
    admission: Admission
    started: float
    tick: float


async def drive(engine: Engine, flight: Flight, attempt: Attempt, *, hedge: bool = False) -> Won | ReachResponse:
    """Attempts until one succeeds (returned unsettled) or the request's final answer is due (returned).

    ``hedge``: a unary call whose capability allows it races a hedged attempt (see the module docstring)."""
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
        policy = engine.hedging(flight) if hedge else None
        try:
            if policy is None:
                tried = await attempt(engine, flight, started)
            else:
                tried, admission, started, tick = await _race(engine, flight, admission, policy, started)
        except BaseException:
            if policy is None:  # a race frees its own admissions
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


class _Runner(NamedTuple):
    """One attempt of a race: its flight (the request's, or the hedge's sibling), admission and start."""

    flight: Flight
    admission: Admission
    started: float
    tick: float


_Sent = asyncio.Future[tuple[Verdict, Reply | None]]


async def _race(engine: Engine, flight: Flight, admission: Admission, policy: Hedging, started: float) -> Raced:
    """Send ``flight``; if it has not answered after the hedge delay, send a hedge elsewhere and race them.

    The returned attempt decides the request (the first success, else the last to fail); the flight carries
    on from its instance. Every other attempt is settled (it failed) or cancelled (it lost) here.
    """
    clock = engine.clock
    route = flight.route
    delay = hedge_delay(engine.latencies, route.agent.name, route.capability.name, policy)
    first = _quiet(asyncio.ensure_future(engine.send(flight)))
    racing: dict[_Sent, _Runner] = {first: _Runner(flight, admission, started, clock.monotonic())}
    try:
        if flight.deadline.fits(started, delay):
            timer = asyncio.ensure_future(clock.sleep(delay))
            try:
                await asyncio.wait((first, timer), return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
            hedged = None if first.done() else engine.hedge(flight)
            if hedged is not None:
                sibling, second = hedged
                sent = _quiet(asyncio.ensure_future(engine.send(sibling)))
                racing[sent] = _Runner(sibling, second, clock.now(), clock.monotonic())
                flight.attempts = sibling.attempts
        return await _first_success(engine, flight, racing)
    finally:
        for task, left in racing.items():  # only when the race itself was cut (cancelled, or raised)
            task.cancel()
            engine.abandon(left.admission)


def _quiet(task: _Sent) -> _Sent:
    """``task``, whose failure counts as seen once it ends: a cancelled loser's error is nobody's to report."""
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task


async def _first_success(engine: Engine, flight: Flight, racing: dict[_Sent, _Runner]) -> Raced:
    """Wait for the racing attempts until one succeeds (the others are cancelled) or all have failed."""
    clock = engine.clock
    while True:
        done, _ = await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            runner = racing.pop(task)
            failure = task.exception()
            if failure is not None:
                engine.abandon(runner.admission)
                if racing:
                    continue
                raise failure
            verdict, reply = task.result()
            who = runner.flight
            if racing and not verdict.ok:
                duration = clock.monotonic() - runner.tick
                engine.settle(who, runner.admission, verdict, duration, answered=reply is not None)
                engine.record_at(who, who.route, verdict, runner.admission, runner.started, clock.now(), None)
                flight.far_attempts += 1
                continue
            for loser in list(racing):
                loser.cancel()
                await asyncio.wait((loser,))  # its end, whatever it is; a cancellation of this task still propagates
                lost = racing.pop(loser)
                engine.cancelled(lost.flight, lost.admission, lost.started, lost.tick)
                flight.far_attempts += 1
            if who is not flight:
                engine.adopt(flight, who)
            return Raced(Tried(verdict, reply is not None, reply), runner.admission, runner.started, runner.tick)


async def _send(engine: Engine, flight: Flight, now: float) -> Tried:
    verdict, reply = await engine.send(flight)
    return Tried(verdict, reply is not None, reply)


async def run_unary(engine: Engine, flight: Flight) -> ReachResponse:
    """One unary request through :func:`drive`: a won attempt is settled and answered at once."""
    won = await drive(engine, flight, _send, hedge=True)
    if isinstance(won, ReachResponse):
        return won
    engine.settle(flight, won.admission, won.tried.verdict, won.duration)
    engine.won(flight, won.duration)
    engine.record_at(flight, flight.route, won.tried.verdict, won.admission, won.started, won.ended, None)
    return engine.respond(flight, "success", won.tried.reply.data if won.tried.reply else None, None, won.tried.reply)
