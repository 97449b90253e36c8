"""The circuit breaker: sliding window, open, half-open probes, transitions; and through the pipeline."""

from __future__ import annotations

import itertools
import random

import pytest
from core_fakes import FakeAgent, FakeRouter, make_agent
from hypothesis import given, settings
from hypothesis import strategies as st

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import CircuitOpen
from reach_plugins.model import CircuitBreakerConfig, ReachRequest
from reach_plugins.policy.breaker import BreakerTransition, CircuitBreaker, Permit
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, MockTransport, Reply

T0 = 1_000.0


def breaker(**config: object) -> tuple[CircuitBreaker, list[BreakerTransition]]:
    seen: list[BreakerTransition] = []
    return CircuitBreaker(CircuitBreakerConfig(**config), agent="a", instance="a-0", listener=seen.append), seen


def feed(b: CircuitBreaker, now: float, failures: int, successes: int = 0, duration: float = 0.01) -> None:
    for failed in [True] * failures + [False] * successes:
        permit = b.acquire(now)
        assert permit is not None
        b.record(permit, now, failure=failed, duration=duration)


def test_opens_at_threshold_with_enough_calls() -> None:
    """3 failures in 10 calls (30 %) opens the breaker and reports why."""
    b, seen = breaker()
    feed(b, T0, failures=0, successes=7)
    feed(b, T0, failures=3)
    assert b.state(T0) == "open" and b.acquire(T0) is None
    assert [(t.before, t.after) for t in seen] == [("closed", "open")]
    assert "30%" in seen[0].reason


def test_needs_min_calls() -> None:
    """Nine failures out of nine calls are not enough evidence with min_calls 10."""
    b, seen = breaker()
    feed(b, T0, failures=9)
    assert b.state(T0) == "closed" and seen == []


def test_old_failures_slide_out_of_the_window() -> None:
    """Failures older than the window no longer count."""
    b, _ = breaker()
    feed(b, T0, failures=2, successes=6)
    feed(b, T0 + 61, failures=1, successes=9)
    assert b.state(T0 + 61) == "closed"


def ten_percent_traffic(b: CircuitBreaker) -> None:
    rng = random.Random(5)
    now = T0
    feed(b, now, failures=0, successes=50)
    for _ in range(20_000):
        now += 0.05
        permit = b.acquire(now)
        if permit is not None:
            b.record(permit, now, failure=rng.random() < 0.1, duration=0.01)


def test_seed_breaker_does_not_flap_at_ten_percent() -> None:
    """Seed story: at 10 % random failures the 60 s / 30 % breaker never opens; the seeds' 10 % one flaps."""
    b, seen = breaker()
    ten_percent_traffic(b)
    assert seen == []
    flappy, flaps = breaker(error_threshold=0.1)
    ten_percent_traffic(flappy)
    assert sum(t.after == "open" for t in flaps) > 5


def test_slow_calls_open_the_breaker() -> None:
    """With slow_call_duration set, a slow-call rate at the threshold opens it."""
    b, seen = breaker(slow_call_duration=1.0, slow_call_threshold=0.5)
    feed(b, T0, failures=0, successes=5, duration=2.0)
    feed(b, T0, failures=0, successes=5, duration=0.1)
    assert b.state(T0) == "open" and "slow-call" in seen[0].reason


def test_half_open_admits_probes_and_success_closes() -> None:
    """After open_wait (5 s by default), half_open_probes calls get through; the first success closes it."""
    b, seen = breaker(half_open_probes=2)
    feed(b, T0, failures=10)
    assert b.acquire(T0 + 4.9) is None
    later = T0 + 5
    assert b.available(later)
    probes = [b.acquire(later), b.acquire(later)]
    assert all(p is not None and p.probe for p in probes) and b.acquire(later) is None
    assert not b.available(later)
    first = probes[0]
    assert first is not None
    b.record(first, later + 1, failure=False, duration=0.1)
    assert b.state(later + 1) == "closed"
    assert [t.after for t in seen] == ["open", "half_open", "closed"]


def test_probe_failure_reopens_for_twice_as_long() -> None:
    """A failed probe reopens the breaker for twice the last open time."""
    b, seen = breaker()
    feed(b, T0, failures=10)
    probe = b.acquire(T0 + 5)
    assert probe is not None
    b.record(probe, T0 + 6, failure=True, duration=0.1)
    assert b.state(T0 + 15.9) == "open" and b.state(T0 + 16) == "half_open"
    assert [t.after for t in seen] == ["open", "half_open", "open"]


def test_open_time_doubles_on_each_reopen_up_to_the_cap_and_resets_on_close() -> None:
    """Consecutive re-opens last 5, 10, 20, 40, 60, 60 s; a success closes it and the next open is 5 s again."""
    b, _ = breaker()
    feed(b, T0, failures=10)
    now, lengths = T0, []
    for _ in range(6):
        lengths.append(b.open_for)
        now += b.open_for
        probe = b.acquire(now)
        assert probe is not None
        b.record(probe, now, failure=True, duration=0.1)
    assert lengths == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    now += b.open_for
    probe = b.acquire(now)
    assert probe is not None
    b.record(probe, now, failure=False, duration=0.1)
    feed(b, now, failures=10)
    assert b.state(now) == "open" and b.open_for == 5.0


def test_open_time_is_configurable() -> None:
    """open_wait and max_open_wait set the first open time and the cap."""
    b, _ = breaker(open_wait=2.0, max_open_wait=3.0)
    feed(b, T0, failures=10)
    assert b.state(T0 + 1.9) == "open" and b.state(T0 + 2.0) == "half_open"
    probe = b.acquire(T0 + 2.0)
    assert probe is not None
    b.record(probe, T0 + 2.0, failure=True, duration=0.1)
    assert b.open_for == 3.0


def test_late_results_from_before_a_transition_do_not_decide() -> None:
    """A call admitted while closed that finishes after the breaker opened does not close it."""
    b, _ = breaker()
    early = b.acquire(T0)
    assert early is not None
    feed(b, T0, failures=10)
    b.record(early, T0 + 1, failure=False, duration=0.1)
    assert b.state(T0 + 1) == "open"


def test_released_probe_frees_its_slot() -> None:
    """An abandoned probe gives its slot back."""
    b, _ = breaker(half_open_probes=1)
    feed(b, T0, failures=10)
    probe = b.acquire(T0 + 30)
    assert probe is not None and b.acquire(T0 + 30) is None
    b.release(probe)
    assert b.acquire(T0 + 30) is not None


OPS = st.lists(st.tuples(st.sampled_from(["ok", "fail", "slow", "wait", "abandon"]), st.floats(0, 40)), max_size=120)


@settings(max_examples=60, deadline=None)
@given(OPS, st.integers(1, 4), st.integers(1, 12))
def test_state_machine_invariants(ops: list[tuple[str, float]], probes: int, min_calls: int) -> None:
    """Whatever happens: no admission while open, at most N probes at once, transitions chain and are reported."""
    seen: list[BreakerTransition] = []
    config = CircuitBreakerConfig(half_open_probes=probes, min_calls=min_calls, slow_call_duration=5.0)
    b = CircuitBreaker(config, listener=seen.append)
    now = T0
    held: list[Permit] = []
    for op, amount in ops:
        if op == "wait":
            now += amount
            continue
        state_before = b.state(now)
        permit = b.acquire(now)
        if state_before == "open":
            assert permit is None
        if permit is None:
            continue
        held.append(permit)
        live_probes = sum(1 for p in held if p.probe and p.generation == permit.generation)
        assert live_probes <= probes
        if op == "abandon":
            b.release(held.pop())
        else:
            b.record(held.pop(), now, failure=op == "fail", duration=amount if op == "slow" else 0.1)
    for earlier, later in itertools.pairwise(seen):
        assert earlier.after == later.before and earlier.at <= later.at
    for transition in seen:
        if transition.before == "closed":
            assert transition.after == "open"


# --------------------------------------------------------------------------- through the pipeline


def setup(instances: int = 3) -> tuple[FakeClock, FakeAgent, Pipeline]:
    clock = FakeClock()
    fake = FakeAgent(clock)
    router = FakeRouter([make_agent(instances=instances)])
    pipeline = Pipeline(router=router, transport=fake.transport, clock=clock, rng=random.Random(1))
    router.is_available = pipeline.is_available
    return clock, fake, pipeline


def order(tenant: str | None = None) -> ReachRequest:
    return ReachRequest(capability="query_order", payload={"order_id": "A1"}, tenant=tenant)


async def test_open_instance_is_skipped_by_the_router() -> None:
    """Once an instance's breaker opens, is_available says so and traffic goes elsewhere."""
    _, fake, pipeline = setup()
    fake.default("503", "orders-0")
    for _ in range(60):
        await pipeline.run(order())
    assert not pipeline.is_available("orders", "orders-0")
    before = fake.sent["orders-0"]
    results = [await pipeline.run(order()) for _ in range(30)]
    assert all(r.ok for r in results) and fake.sent["orders-0"] == before


async def test_all_open_raises_circuit_open_without_sending() -> None:
    """When every breaker is open the request is refused with CircuitOpen; nothing is sent."""
    _, fake, pipeline = setup(instances=1)
    fake.default("503")
    for _ in range(10):
        await pipeline.run(order())
    assert not pipeline.is_available("orders", "orders-0")
    sent = len(fake.calls)
    with pytest.raises(CircuitOpen):
        await pipeline.run(order())
    assert len(fake.calls) == sent


async def test_traffic_returns_after_open_wait_and_one_probe() -> None:
    """After recovery, the first probe past open_wait closes the breaker and traffic flows again."""
    clock, fake, pipeline = setup(instances=1)
    fake.default("503")
    for _ in range(10):
        await pipeline.run(order())
    fake.default("ok")
    clock.advance(4.9)
    with pytest.raises(CircuitOpen):
        await pipeline.run(order())
    clock.advance(0.1)
    response = await pipeline.run(order(), trace=True)
    assert response.ok and pipeline.is_available("orders", "orders-0")
    assert response.trace is not None
    moves = [(e["reach.breaker.from"], e["reach.breaker.to"]) for e in response.trace.events if "reach.breaker.to" in e]
    assert moves == [("open", "half_open"), ("half_open", "closed")]


async def test_retry_fails_over_when_the_breaker_opens_mid_request() -> None:
    """Ten requests failed for good on an instance open its breaker; the next one goes to the other instance."""
    _, fake, pipeline = setup(instances=2)
    fake.default("503", "orders-0")
    for _ in range(20):
        await pipeline.run(order())
    response = await pipeline.run(order(), trace=True)
    assert response.ok and response.instance == "orders-1"
    assert response.trace is not None


# --------------------------------------------------------------------------- attribution: per hop, per tenant


async def test_a_hop_that_does_not_answer_opens_its_own_breaker_not_the_instances() -> None:
    """Through a hop, connection failures open the hop's breaker; every agent instance stays available."""
    clock = FakeClock()
    fake = FakeAgent(clock)
    fake.default("connect")
    fake.transport.owns_retries = True
    fake.transport.hop = "http://127.0.0.1:9"
    router = FakeRouter([make_agent(instances=3)])
    pipeline = Pipeline(router=router, transport=fake.transport, clock=clock, rng=random.Random(1))
    router.is_available = pipeline.is_available
    for _ in range(10):
        await pipeline.run(order())
    sent = len(fake.calls)
    with pytest.raises(CircuitOpen, match=r"http://127\.0\.0\.1:9"):
        await pipeline.run(order())
    assert len(fake.calls) == sent
    assert all(pipeline.is_available("orders", f"orders-{i}") for i in range(3))
    fake.default("ok")
    clock.advance(5)
    assert (await pipeline.run(order())).ok


async def test_a_hop_that_answers_with_an_agent_failure_blames_the_instance() -> None:
    """A failure the hop reports (it answered) counts for the instance, as without a hop."""
    clock = FakeClock()
    fake = FakeAgent(clock)
    fake.default("503", "orders-0")
    fake.transport.owns_retries = True
    fake.transport.hop = "http://127.0.0.1:9"
    router = FakeRouter([make_agent(instances=1)])
    pipeline = Pipeline(router=router, transport=fake.transport, clock=clock, rng=random.Random(1))
    router.is_available = pipeline.is_available
    for _ in range(10):
        await pipeline.run(order())
    assert not pipeline.is_available("orders", "orders-0")


async def test_one_tenant_cannot_open_a_breaker_for_another() -> None:
    """Tenant 'evil' makes the only instance fail until its breaker opens; tenant 'good' is still served."""

    def by_tenant(call: Call) -> Reply:
        if call.request.tenant == "evil":
            return Reply(status="fail", status_code=500)
        return Reply(status="success", data={"ok": True})

    router = FakeRouter([make_agent(instances=1)])
    pipeline = Pipeline(router=router, transport=MockTransport(by_tenant), clock=FakeClock())
    for _ in range(10):
        await pipeline.run(order(tenant="evil"))
    with pytest.raises(CircuitOpen):
        await pipeline.run(order(tenant="evil"))
    assert all([(await pipeline.run(order(tenant="good"))).ok for _ in range(20)])


async def test_a_stream_through_a_hop_that_does_not_answer_blames_the_hop() -> None:
    """Streams too: a hop refusing connections opens its own breaker; the agent instances stay available."""
    clock = FakeClock()
    fake = FakeAgent(clock)
    fake.default("connect")
    fake.transport.owns_retries = True
    fake.transport.hop = "grpc://127.0.0.1:9"
    router = FakeRouter([make_agent(instances=2)])
    pipeline = Pipeline(router=router, transport=fake.transport, clock=clock, rng=random.Random(1))
    router.is_available = pipeline.is_available
    for _ in range(10):
        events = [event async for event in pipeline.stream(order())]
        assert events[-1].kind == "error"
    with pytest.raises(CircuitOpen, match="grpc://127"):
        [event async for event in pipeline.stream(order())]
    assert all(pipeline.is_available("orders", f"orders-{i}") for i in range(2))
