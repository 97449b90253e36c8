"""Streamed replies through the same core: retried only until the first event has been passed on.

Three tiers of time: the first event must come within the attempt's time;
after that each gap between events is bounded by ``stream_idle`` (and by the
request's deadline only when the caller set one), so a long, lively stream is
never cut by a total timeout — the seeds' half-finished answers. Every stream
ends with exactly one ``end`` or ``error`` event.

Past the first event, a relay task reads the stream and hands events on in
batches (:mod:`reach_plugins.policy.batching`): at most ``max_delay`` late, the
first event never delayed, the rest flushed with the ``end`` or ``error``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from reach_plugins.attempts.engine import Engine
from reach_plugins.attempts.flight import Flight
from reach_plugins.errors import OutcomeUnknown, ReachError
from reach_plugins.model import ErrorInfo, ReachResponse
from reach_plugins.policy.batching import BatchPolicy, StreamBatcher, streamed_chars
from reach_plugins.policy.classify import SUCCESS, Verdict, classify_exception, classify_reply
from reach_plugins.policy.deadline import per_attempt_timeout, timeouts_for
from reach_plugins.telemetry.spans import EVENT_RETRY
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


def _final(flight: Flight, response: ReachResponse) -> list[StreamEvent]:
    """The one-event batch of a stream that never started: the error of the request's final answer."""
    flight.status, flight.error = response.status, response.error
    return [StreamEvent("error", error=response.error)]


async def _open(
    engine: Engine, flight: Flight, started: float
) -> tuple[AsyncIterator[StreamEvent], StreamEvent, Verdict, bool]:
    """Start the stream and wait for its first event within the attempt's time; the last item: did anyone answer."""
    route = flight.route
    timeout = flight.deadline.attempt_timeout(started, per_attempt_timeout(route.agent, route.capability))
    events = engine.transport.stream(engine.prepare(flight, timeout, started))
    try:
        async with engine.clock.timeout_at(started + timeout):
            first = await anext(events)
    except StopAsyncIteration:
        first = StreamEvent("end")
    except (ReachError, TimeoutError) as exc:
        if isinstance(exc, ReachError) and exc.refused:
            await _close(events)
            raise
        verdict = classify_exception(exc)
        return events, _error_of(verdict), verdict, False
    except BaseException:
        await _close(events)
        raise
    return events, first, classify_event(first), True


def _error_of(verdict: Verdict) -> StreamEvent:
    return StreamEvent("error", error=verdict.error or ErrorInfo(type=verdict.outcome, message=verdict.outcome))


async def stream_attempts(
    engine: Engine, flight: Flight, *, explicit_deadline: bool, batching: BatchPolicy
) -> AsyncGenerator[list[StreamEvent], None]:
    """Yield, in batches, the events of the first attempt whose stream starts well; sets ``flight.status``.

    The first event goes out alone and at once; the last batch carries the ``end`` or ``error`` event.
    """
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
            why = f"no instance could take the retry: {exc.message}"
            yield _final(flight, engine.give_up(flight, last, None, why))
            return
        started = clock.now()
        try:
            events, first, verdict, answered = await _open(engine, flight, started)
        except BaseException:
            engine.abandon(admission)
            raise
        opened = clock.now()
        flight.far_attempts += 1
        if not verdict.ok:
            await _close(events)
            tried = flight.route
            step = engine.decide(flight, verdict, admission, opened)
            again = step.action == "retry" and not verdict.unreachable
            engine.settle(flight, admission, verdict, opened - started, again=again, answered=answered)
            engine.record_at(flight, tried, verdict, admission, started, opened, step.plan.delay)
            if step.action != "retry" and step.action != "fail_over":
                why, out_of_time = step.plan.why, step.plan.out_of_time
                yield _final(flight, engine.give_up(flight, verdict, None, why, out_of_time=out_of_time))
                return
            last = verdict
            if step.action == "fail_over":
                continue
            delay = step.plan.delay or 0.0
            flight.rec.event(EVENT_RETRY, opened, attempt=flight.attempts, delay_ms=delay * 1000.0)
            await clock.sleep(delay)
            if verdict.unreachable or not admission.breaker.available(clock.monotonic()):
                try:
                    engine.fail_over(flight, f"{flight.route.instance.instance_id} failed before its first event")
                except ReachError as exc:
                    if isinstance(exc, OutcomeUnknown) or not admission.breaker.available(clock.monotonic()):
                        why = f"no other instance: {exc.message}"
                        yield _final(flight, engine.give_up(flight, verdict, None, why))
                        return
            continue
        settled = False
        relay: _Relay | None = None
        try:
            batcher = StreamBatcher(batching)
            batcher.add(first, opened)
            yield _counted(flight, batcher.take())
            verdict = SUCCESS
            if first.kind != "end":
                relay = _Relay(engine, flight, events, batcher, explicit_deadline)
                async for batch in relay.batches():
                    yield _counted(flight, batch)
                verdict = relay.verdict
            end = clock.now()
            engine.settle(flight, admission, verdict, opened - started)
            settled = True
            engine.record(flight, verdict, admission, started, end, None)
            tail = batcher.take()
            if verdict.ok:
                flight.status = "success"
                if first.kind != "end":
                    tail.append(StreamEvent("end"))
            else:
                flight.status = "timeout" if verdict.outcome == "timeout" else "fail"
                flight.error = verdict.error
                tail.append(_error_of(verdict))
            if tail:
                yield _counted(flight, tail)
            return
        finally:
            if not settled:
                engine.abandon(admission)
            if relay is not None:
                await relay.stop()
            await _close(events)


def _counted(flight: Flight, batch: list[StreamEvent]) -> list[StreamEvent]:
    """Count the data events and characters handed to the caller (span attributes and trace of the stream)."""
    for event in batch:
        if event.kind == "data":
            flight.streamed_events += 1
            flight.streamed_chars += streamed_chars(event.data)
    return batch


class _Relay:
    """Reads the rest of a started stream in a task of its own and hands it on in batches.

    The caller's task then wakes once per batch rather than once per event.
    The reading task stops at a full batch until the caller takes it, so a slow
    caller slows the agent down (TCP backpressure) instead of filling memory.
    """

    def __init__(
        self,
        engine: Engine,
        flight: Flight,
        events: AsyncIterator[StreamEvent],
        batcher: StreamBatcher,
        explicit_deadline: bool,
    ) -> None:
        self._clock = engine.clock
        self._batcher = batcher
        self._wake = asyncio.Event()
        """Set by the reader when the caller must look: a batch is due now, or a new one started (arm its timer)."""
        self._due_now = False
        self._taken = asyncio.Event()
        self.verdict: Verdict = SUCCESS
        """How the stream ended: success (``end``), or the verdict of its failure."""
        follower = _follow(engine, flight, events, explicit_deadline)
        self._task = asyncio.get_running_loop().create_task(self._read(follower))

    async def _read(self, follower: AsyncGenerator[StreamEvent | Verdict, None]) -> None:
        batcher = self._batcher
        try:
            async for item in follower:
                if isinstance(item, Verdict):
                    self.verdict = item
                    return
                if batcher.add(item, self._clock.now()):
                    self._due_now = True
                    self._wake.set()
                elif batcher.pending == 1:
                    self._wake.set()
                while batcher.full:
                    self._taken.clear()
                    await self._taken.wait()
        finally:
            await follower.aclose()
            self._wake.set()

    async def batches(self) -> AsyncIterator[list[StreamEvent]]:
        """Each batch once it is due; returns when the stream is over, leaving the last events buffered."""
        batcher, task = self._batcher, self._task
        while True:
            if not self._due_now:
                due = batcher.due()
                try:
                    if due is None:
                        await self._wake.wait()
                    else:
                        async with self._clock.timeout_at(due):
                            await self._wake.wait()
                except TimeoutError:
                    self._due_now = True
                self._wake.clear()
            if task.done():
                break
            if self._due_now:
                self._due_now = False
                batch = batcher.take()
                self._taken.set()
                if batch:
                    yield batch
        task.result()

    async def stop(self) -> None:
        """Stop reading (the caller left, or the stream is over) before the stream itself is closed."""
        if not self._task.done():
            self._task.cancel()
        await asyncio.wait({self._task})


async def _follow(
    engine: Engine, flight: Flight, events: AsyncIterator[StreamEvent], explicit_deadline: bool
) -> AsyncGenerator[StreamEvent | Verdict, None]:
    """Data events after the first, then a Verdict if the stream did not end cleanly with ``end``."""
    clock = engine.clock
    route = flight.route
    idle = timeouts_for(route.agent, route.capability).stream_idle
    while True:
        now = clock.now()
        limit = now + idle
        cut_by_deadline = explicit_deadline and flight.deadline.at < limit
        if cut_by_deadline:
            limit = flight.deadline.at
        try:
            async with clock.timeout_at(limit):
                event = await anext(events)
        except StopAsyncIteration:
            return
        except TimeoutError:
            why = "the request's deadline passed mid-stream" if cut_by_deadline else f"no event for {idle:g}s"
            yield Verdict("timeout", ErrorInfo(type="timeout", message=f"stream cut: {why}"), overload=True)
            return
        except ReachError as exc:
            yield classify_exception(exc)
            return
        if event.kind == "error":
            yield classify_event(event)
            return
        if event.kind == "end":
            return
        yield event
