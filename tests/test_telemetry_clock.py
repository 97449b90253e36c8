"""One clock in a trace: state changes (timed by the policies' monotonic clock) carry the trace's wall-clock time."""

from __future__ import annotations

import random

from core_fakes import FakeAgent, FakeRouter, make_agent

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.model import ReachRequest, ReachTrace
from reach_plugins.telemetry.spans import EVENT_BREAKER
from reach_plugins.testing.clock import FakeClock

UPTIME_ORIGIN = 1_700_000_000.0
"""Where a real monotonic clock's zero sits on the wall clock (boot time): its readings are ~1.7e9 s smaller."""


class BootClock(FakeClock):
    """FakeClock whose monotonic readings count from boot, as ``time.monotonic`` does, not from the epoch."""

    def monotonic(self) -> float:
        return self.now() - UPTIME_ORIGIN


class Traces:
    def __init__(self) -> None:
        self.all: list[ReachTrace] = []

    def emit(self, trace: ReachTrace) -> None:
        self.all.append(trace)


async def test_breaker_events_are_timed_like_every_other_trace_event() -> None:
    """The breaker transition's ``at`` falls inside its request's wall-clock time (started_at .. its end)."""
    clock = BootClock()
    fake = FakeAgent(clock)
    router = FakeRouter([make_agent(instances=1)])
    sink = Traces()
    pipeline = Pipeline(router=router, transport=fake.transport, clock=clock, rng=random.Random(0), sink=sink)
    router.is_available = pipeline.is_available
    fake.default("503")
    for _ in range(10):
        await pipeline.run(ReachRequest(capability="query_order", payload={"order_id": "A1"}))
        clock.advance(0.1)
    moved = [(trace, event) for trace in sink.all for event in trace.events if event["event"] == EVENT_BREAKER]
    assert len(moved) == 1
    trace, event = moved[0]
    ended = trace.started_at + trace.duration_ms / 1000.0
    assert trace.started_at <= event["at"] <= ended
