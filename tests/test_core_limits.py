"""Rate limit and backpressure: token bucket, concurrency limiter, adaptive limit; and through the pipeline."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from core_fakes import FakeAgent, FakeRouter, make_agent

from reach_plugins.attempts.limiter import ConcurrencyLimiter
from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import DeadlineExceeded, RateLimited
from reach_plugins.model import Capability, PoolConfig, RateLimit, ReachRequest
from reach_plugins.policy.limits import AdaptiveLimit, TokenBucket
from reach_plugins.testing.clock import FakeClock

T0 = 1_000.0


def test_bucket_allows_a_burst_then_paces() -> None:
    """Burst calls go at once, the next waits 1/rate, and refill tops up to the burst only."""
    bucket = TokenBucket(10, 3, now=T0)
    assert [bucket.reserve(T0, 1.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve(T0, 1.0) == pytest.approx(0.1)
    assert bucket.reserve(T0 + 60, 1.0) == 0.0
    assert [bucket.reserve(T0 + 60, 0) for _ in range(3)] == [0.0, 0.0, None]


def test_bucket_refuses_a_wait_longer_than_max_wait_without_taking_a_token() -> None:
    """A reservation beyond max_wait is refused and leaves no debt behind."""
    bucket = TokenBucket(1, 1, now=T0)
    assert bucket.reserve(T0, 0.5) == 0.0
    assert bucket.reserve(T0, 0.5) is None
    assert bucket.reserve(T0, 1.0) == pytest.approx(1.0)


def test_bucket_refund_returns_the_token() -> None:
    """An abandoned reservation gives its token back."""
    bucket = TokenBucket(1, 1, now=T0)
    bucket.reserve(T0, 0)
    bucket.refund(T0)
    assert bucket.reserve(T0, 0) == 0.0


async def test_limiter_queues_in_order_and_refuses_past_the_queue() -> None:
    """Calls beyond the limit wait FIFO; beyond the queue bound they are refused at once."""
    limiter = ConcurrencyLimiter(1, max_queue=2, name="agent 'x'")
    await limiter.acquire()
    order: list[int] = []

    async def waiter(n: int) -> None:
        await limiter.acquire()
        order.append(n)

    tasks = [asyncio.create_task(waiter(n)) for n in (1, 2)]
    await asyncio.sleep(0)
    with pytest.raises(RateLimited, match="queue is full"):
        await limiter.acquire()
    limiter.release()
    await asyncio.sleep(0)
    limiter.release()
    await asyncio.gather(*tasks)
    assert order == [1, 2] and limiter.in_flight == 1


async def test_cancelled_waiter_leaves_the_queue() -> None:
    """A waiter that gives up no longer holds a queue place nor a slot."""
    limiter = ConcurrencyLimiter(1, max_queue=1)
    await limiter.acquire()
    task = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert limiter.queued == 0
    limiter.release()
    assert limiter.in_flight == 0


async def test_raising_the_limit_wakes_waiters() -> None:
    """Widening the window lets queued calls through."""
    limiter = ConcurrencyLimiter(1, max_queue=5)
    await limiter.acquire()
    task = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    limiter.limit = 2
    await task
    assert limiter.in_flight == 2


def test_adaptive_limit_shrinks_on_overload_once_per_round_trip() -> None:
    """Overload cuts the window multiplicatively, at most once per smoothed round trip."""
    adaptive = AdaptiveLimit(100)
    adaptive.record(T0, 0.5, overload=False, in_flight=100)
    assert adaptive.record(T0 + 1, None, overload=True, in_flight=100) == 90
    assert adaptive.record(T0 + 1.1, None, overload=True, in_flight=100) == 90
    assert adaptive.record(T0 + 2, None, overload=True, in_flight=100) == 81


def test_adaptive_limit_shrinks_when_latency_climbs_and_recovers() -> None:
    """A latency jump narrows the window; healthy, busy traffic widens it back to the maximum."""
    adaptive = AdaptiveLimit(50)
    now = T0
    for _ in range(200):
        now += 0.1
        adaptive.record(now, 0.1, overload=False, in_flight=50)
    for _ in range(20):
        now += 1
        adaptive.record(now, 1.0, overload=False, in_flight=50)
    narrowed = adaptive.limit
    assert narrowed < 50
    for _ in range(50 * 50):
        now += 0.1
        adaptive.record(now, 0.1, overload=False, in_flight=adaptive.limit)
    assert adaptive.limit == 50


def test_adaptive_limit_grows_by_one_per_window_of_successes() -> None:
    """Additive increase is one per round trip (a window's worth of answers), so overload cuts can hold it down."""
    adaptive = AdaptiveLimit(100)
    adaptive.record(T0, None, overload=True, in_flight=100)
    assert adaptive.limit == 90
    for i in range(89):
        adaptive.record(T0 + 1 + i * 0.01, None, overload=False, in_flight=90)
    assert adaptive.limit == 90
    adaptive.record(T0 + 2, None, overload=False, in_flight=90)
    assert adaptive.limit == 91


def test_adaptive_limit_does_not_grow_an_idle_window() -> None:
    """Growth needs the window to be used: a few calls in flight do not widen it."""
    adaptive = AdaptiveLimit(100)
    adaptive.record(T0, None, overload=True, in_flight=1)
    for i in range(100):
        adaptive.record(T0 + 10 + i, 0.1, overload=False, in_flight=1)
    assert adaptive.limit == 90


# --------------------------------------------------------------------------- through the pipeline


def setup(**agent_fields: Any) -> tuple[FakeClock, FakeAgent, Pipeline]:
    clock = FakeClock()
    fake = FakeAgent(clock, latency=1.0)
    router = FakeRouter([make_agent(**agent_fields)])
    return clock, fake, Pipeline(router=router, transport=fake.transport, clock=clock, rng=random.Random(2))


def order() -> ReachRequest:
    return ReachRequest(capability="query_order", payload={"order_id": "A1"})


async def test_rate_limit_waits_within_max_wait() -> None:
    """With qps 1 and burst 1, a second call waits about a second, then goes."""
    clock, fake, pipeline = setup(rate_limit=RateLimit(qps=1, burst=1, max_wait=3))
    fake.latency = 0.0
    start = clock.now()
    await pipeline.run(order())
    await pipeline.run(order())
    assert clock.now() - start == pytest.approx(1.0)
    assert len(fake.calls) == 2


async def test_rate_limit_fails_fast_past_max_wait() -> None:
    """When the bucket cannot free a slot within max_wait, RateLimited is raised and nothing is sent."""
    _, fake, pipeline = setup(rate_limit=RateLimit(qps=1, burst=1, max_wait=0.5))
    fake.latency = 0.0
    await pipeline.run(order())
    with pytest.raises(RateLimited, match="qps"):
        await pipeline.run(order())
    assert len(fake.calls) == 1


async def test_concurrency_limit_turns_overload_into_waiting() -> None:
    """With max_conns 2, extra calls queue and finish later instead of failing."""
    clock, _, pipeline = setup(pool=PoolConfig(max_conns=2))
    start = clock.now()
    results = await asyncio.gather(*(pipeline.run(order()) for _ in range(4)))
    assert all(r.ok for r in results)
    assert clock.now() - start == pytest.approx(2.0)


async def test_concurrency_queue_bound_refuses_the_excess() -> None:
    """Beyond max_conns in flight plus max_conns waiting, calls are refused with RateLimited."""
    _, fake, pipeline = setup(pool=PoolConfig(max_conns=1))
    outcomes = await asyncio.gather(*(pipeline.run(order()) for _ in range(3)), return_exceptions=True)
    assert sum(isinstance(o, RateLimited) for o in outcomes) == 1
    assert len(fake.calls) == 2


async def test_queue_wait_is_bounded_by_max_wait() -> None:
    """A queued call that does not get a slot within max_wait is refused."""
    _, fake, pipeline = setup(pool=PoolConfig(max_conns=1), rate_limit=RateLimit(qps=100, max_wait=0.5))
    fake.latency = 5.0
    outcomes = await asyncio.gather(pipeline.run(order()), pipeline.run(order()), return_exceptions=True)
    assert isinstance(outcomes[1], RateLimited) and len(fake.calls) == 1


async def test_capability_max_concurrency_applies_per_instance() -> None:
    """max_concurrency 1 on one instance: it runs 1 and holds 1 in line (AGENT_QUEUE), so a third call waits."""
    clock, _, pipeline = setup(instances=1, capability=Capability(name="query_order", max_concurrency=1))
    start = clock.now()
    await asyncio.gather(*(pipeline.run(order()) for _ in range(3)))
    assert clock.now() - start == pytest.approx(2.0)


async def test_one_instances_overload_narrows_only_its_own_window() -> None:
    """Backpressure from orders-0 shrinks orders-0's adaptive limit; its peers keep the whole pool's window."""
    _, fake, pipeline = setup(pool=PoolConfig(max_conns=20))
    fake.default("429", "orders-0")
    for _ in range(30):
        await pipeline.run(order())
    guards = pipeline._engine.guards.get(make_agent(pool=PoolConfig(max_conns=20)), 0.0)
    windows = {name: guards.instance(name)[0].limiter.limit for name in ("orders-0", "orders-1", "orders-2")}
    assert windows["orders-0"] < 20 and windows["orders-1"] == windows["orders-2"] == 20, windows
    assert pipeline.is_available("orders", "orders-0"), "overload never opens the breaker"


async def test_a_wait_that_ends_at_the_deadline_sends_nothing() -> None:
    """A rate-limit wait that uses up the whole deadline raises DeadlineExceeded instead of sending late."""
    _, fake, pipeline = setup(rate_limit=RateLimit(qps=1, burst=1, max_wait=3))
    fake.latency = 0.0
    await pipeline.run(order())
    with pytest.raises(DeadlineExceeded, match="waiting for a slot"):
        await pipeline.run(order().model_copy(update={"timeout_ms": 1000}))
    assert len(fake.calls) == 1


async def test_a_slot_freed_exactly_as_a_queue_wait_expires_is_rate_limited_not_a_crash() -> None:
    """max_conns 1: a 3 s call ends at the instant a second call's 3 s wait expires -> RateLimited, slot free."""
    _, fake, pipeline = setup(pool=PoolConfig(max_conns=1), rate_limit=RateLimit(qps=100, max_wait=3))
    fake.latency = 3.0
    outcomes = await asyncio.gather(pipeline.run(order()), pipeline.run(order()), return_exceptions=True)
    assert isinstance(outcomes[1], RateLimited), outcomes[1]
    assert (await pipeline.run(order())).ok, "the slot was given back"


async def test_cancelled_waiter_dropped_by_a_release_leaves_no_trace() -> None:
    """A waiter cancelled and then skipped by a release ends with CancelledError; counts stay exact."""
    limiter = ConcurrencyLimiter(1, max_queue=1)
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    limiter.release()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (limiter.in_flight, limiter.queued) == (0, 0)
    assert limiter.try_acquire()


class SteppingClock(FakeClock):
    """Virtual time whose wall clock (``now``) can step back; its monotonic clock never does."""

    def __init__(self) -> None:
        super().__init__()
        self.offset = 0.0

    def now(self) -> float:
        return super().now() + self.offset

    def monotonic(self) -> float:
        return super().now()

    def timeout_at(self, deadline: float) -> Any:
        return super().timeout_at(deadline - self.offset)


async def test_a_wall_clock_step_back_changes_neither_rate_limit_nor_breaker_timing() -> None:
    """A 1-hour backward step of the wall clock: 50 calls at 10/s all go in ~5 s; an open breaker probes after 5 s."""
    clock = SteppingClock()
    fake = FakeAgent(clock, latency=0.0)
    router = FakeRouter([make_agent(instances=1, rate_limit=RateLimit(qps=10, burst=1, max_wait=3))])
    pipeline = Pipeline(router=router, transport=fake.transport, clock=clock, rng=random.Random(2))
    start = clock.monotonic()
    results = []
    for n in range(50):
        if n == 5:
            clock.offset = -3600.0
        results.append(await pipeline.run(order()))
    assert all(r.ok for r in results)
    assert clock.monotonic() - start == pytest.approx(4.9, abs=0.01)
    fake.default("503")
    for _ in range(22):
        await pipeline.run(order())
    assert not pipeline.is_available("orders", "orders-0"), "22 failures in 72 requests (>= 30 %) open it"
    clock.offset -= 3600.0
    clock.advance(5.0)
    assert pipeline.is_available("orders", "orders-0")


async def test_a_full_instance_window_spills_to_its_peers() -> None:
    """orders-0's window narrowed by its own overload: calls beyond it go to orders-1/2, none is shed."""
    _, fake, pipeline = setup(pool=PoolConfig(max_conns=20))
    guards = pipeline._engine.guards.get(make_agent(pool=PoolConfig(max_conns=20)), 0.0)
    window = guards.instance("orders-0")[0].limiter
    window.limit = window.max_queue = 1
    outcomes = await asyncio.gather(*(pipeline.run(order()) for _ in range(30)), return_exceptions=True)
    assert all(not isinstance(o, BaseException) and o.ok for o in outcomes), outcomes
    assert fake.sent["orders-0"] <= 2 < fake.sent["orders-1"]


async def test_a_timeout_at_the_instances_limit_is_overload_not_a_fault() -> None:
    """Timeouts while orders-0 holds its whole window narrow it and leave its breaker closed; once the window is
    at its narrowest, timeouts count as faults again, so a dead instance is still shut out."""
    _, fake, pipeline = setup(instances=1, pool=PoolConfig(max_conns=4))
    fake.default("hang")
    request = order().model_copy(update={"timeout_ms": 1000})
    await asyncio.gather(*(pipeline.run(request) for _ in range(4)), return_exceptions=True)
    guards = pipeline._engine.guards.get(make_agent(instances=1, pool=PoolConfig(max_conns=4)), 0.0)
    assert guards.instance("orders-0")[0].limiter.limit < 4
    assert pipeline.is_available("orders", "orders-0")
    for _ in range(40):
        await asyncio.gather(pipeline.run(request), return_exceptions=True)
    assert not pipeline.is_available("orders", "orders-0")
