"""Streamed replies through the same driver: retried only until the first event has been passed on.

Three tiers of time, all kept here on the core's clock (the one place a
stream is timed, whatever the transport): the first event must come within
the attempt's time and ``ttfbt`` (time to first byte) when set; after that
each gap between events is bounded by ``stream_idle`` (and by the request's
deadline only when the caller set one), so a long, lively stream is never
cut by a total timeout — the seeds' half-finished answers. Every stream ends
with exactly one ``end`` or ``error`` event.

Past the first event, a relay task reads the stream and hands events on in
batches (:mod:`reach_plugins.policy.batching`): at most ``max_delay`` late, the
first event never delayed, the rest flushed with the ``end`` or ``error``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from reach_plugins.attempts.driver import Tried, drive
from reach_plugins.attempts.engine import Engine
from reach_plugins.attempts.flight import Flight
from reach_plugins.errors import ReachError
from reach_plugins.model import ErrorInfo, ReachResponse
from reach_plugins.policy.batching import BatchPolicy, StreamBatcher, streamed_chars
from reach_plugins.policy.classify import SUCCESS, Verdict, classify_exception, classify_reply
from reach_plugins.policy.deadline import per_attempt_timeout, timeouts_for
from reach_plugins.transport import EventStream, Reply, StreamEvent


@dataclass(slots=True)
class StreamTally:
    """How a stream went, for its span and trace: its status, its error, and what it handed to the caller."""

    status: str = "pending"
    error: ErrorInfo | None = None
    events: int = 0
    """Data events handed to the caller."""
    chars: int = 0
    """Characters of text those events carried (:func:`~reach_plugins.policy.batching.streamed_chars`)."""

    def count(self, batch: list[StreamEvent]) -> list[StreamEvent]:
        """Count the data events and characters of ``batch`` on its way to the caller."""
        for event in batch:
            if event.kind == "data":
                self.events += 1
                self.chars += streamed_chars(event.data)
        return batch


def classify_event(event: StreamEvent) -> Verdict:
    """``data``/``end`` succeed; an ``error`` event is classified like a failed reply."""
    if event.kind != "error":
        return SUCCESS
    error = event.error or ErrorInfo(type="transient", message="the stream reported an error without details")
    return classify_reply(Reply(status="fail", error=error))


def _final(tally: StreamTally, response: ReachResponse) -> list[StreamEvent]:
    """The one-event batch of a stream that never started: the error of the request's final answer."""
    tally.status, tally.error = response.status, response.error
    return [StreamEvent("error", error=response.error)]


def first_event_limit(engine: Engine, flight: Flight, started: float) -> tuple[float, float]:
    """``(attempt timeout, moment the first event is due)``: the attempt's time, shortened by ``ttfbt`` if set."""
    route = flight.route
    timeout = flight.deadline.attempt_timeout(started, per_attempt_timeout(route.agent, route.capability))
    ttfbt = timeouts_for(route.agent, route.capability).ttfbt
    return timeout, started + (timeout if ttfbt is None else min(timeout, ttfbt))


async def _open(engine: Engine, flight: Flight, started: float) -> Tried:
    """Start the stream and wait for its first event within the attempt's time and ``ttfbt``."""
    timeout, due = first_event_limit(engine, flight, started)
    events = engine.transport.stream(engine.prepare(flight, timeout, started))
    try:
        async with engine.clock.timeout_at(due):
            first = await anext(events)
    except StopAsyncIteration:
        first = StreamEvent("end")
    except (ReachError, TimeoutError) as exc:
        if isinstance(exc, ReachError) and exc.refused:
            await events.aclose()
            raise
        return Tried(classify_exception(exc), False, events=events)
    except BaseException:
        await events.aclose()
        raise
    return Tried(engine.refusal_of(flight.route, classify_event(first)), True, events=events, first=first)


def _error_of(verdict: Verdict) -> StreamEvent:
    return StreamEvent("error", error=verdict.error or ErrorInfo(type=verdict.outcome, message=verdict.outcome))


async def stream_attempts(
    engine: Engine, flight: Flight, tally: StreamTally, *, explicit_deadline: bool, batching: BatchPolicy
) -> AsyncGenerator[list[StreamEvent], None]:
    """Yield, in batches, the events of the first attempt whose stream starts well; sets ``tally.status``.

    The first event goes out alone and at once; the last batch carries the ``end`` or ``error`` event.
    """
    clock = engine.clock
    won = await drive(engine, flight, _open)
    if isinstance(won, ReachResponse):
        yield _final(tally, won)
        return
    admission, events, first = won.admission, won.tried.events, won.tried.first
    assert events is not None and first is not None  # an opened stream that won has both
    settled = False
    relay: _Relay | None = None
    try:
        batcher = StreamBatcher(batching)
        batcher.add(first, won.ended)
        yield tally.count(batcher.take())
        verdict = SUCCESS
        if first.kind != "end":
            relay = _Relay(engine, flight, events, batcher, explicit_deadline)
            async for batch in relay.batches():
                yield tally.count(batch)
            verdict = relay.verdict
        end = clock.now()
        engine.settle(flight, admission, verdict, won.duration)
        settled = True
        engine.record_at(flight, flight.route, verdict, admission, won.started, end, None)
        tail = batcher.take()
        if verdict.ok:
            tally.status = "success"
            if first.kind != "end":
                tail.append(StreamEvent("end"))
        else:
            tally.status = "timeout" if verdict.outcome == "timeout" else "fail"
            tally.error = verdict.error
            tail.append(_error_of(verdict))
        if tail:
            yield tally.count(tail)
    finally:
        if not settled:
            engine.abandon(admission)
        if relay is not None:
            await relay.stop()
        await events.aclose()


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
        events: EventStream,
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
    engine: Engine, flight: Flight, events: EventStream, explicit_deadline: bool
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
            why = "the request's deadline passed mid-stream"
            if not cut_by_deadline:
                why = f"no event for {idle:g}s (stream_idle)"
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
