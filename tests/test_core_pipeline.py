"""The pipeline's rules, through its public API, on virtual time with a fault-injecting agent."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from core_fakes import FakeAgent, FakeRouter, make_agent

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import BusinessError, DeadlineExceeded, UnknownCapability
from reach_plugins.model import (
    AgentDescriptor,
    Capability,
    Hop,
    ReachRequest,
    RetryPolicy,
    Timeouts,
)
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Credential


def setup(
    *agents: AgentDescriptor, owns_retries: bool = False, **options: Any
) -> tuple[FakeClock, FakeAgent, Pipeline]:
    clock = FakeClock()
    fake = FakeAgent(clock)
    fake.transport.owns_retries = owns_retries
    router = FakeRouter(list(agents) or [make_agent()])
    pipeline = Pipeline(router=router, transport=fake.transport, clock=clock, rng=random.Random(7), **options)
    router.is_available = pipeline.is_available
    return clock, fake, pipeline


def order(**fields: Any) -> ReachRequest:
    return ReachRequest(capability="query_order", payload={"order_id": "A1"}, **fields)


async def test_success_fills_the_response() -> None:
    """A success names agent and instance, counts one attempt and costs the virtual time spent."""
    clock, _, pipeline = setup()
    start = clock.now()
    response = await pipeline.run(order())
    assert response.ok and response.agent == "orders" and response.instance == "orders-0"
    assert response.attempts == 1
    assert response.cost_ms == pytest.approx((clock.now() - start) * 1000)
    assert response.trace is None


@pytest.mark.parametrize("restored", [True, False])
async def test_route_flags_are_copied(restored: bool) -> None:
    """context_restore and degraded come from the route's affinity (restored / degraded), without its decision."""
    clock = FakeClock()
    fake = FakeAgent(clock)
    router = FakeRouter([make_agent()], context_restore=restored, degraded=not restored)
    response = await Pipeline(router=router, transport=fake.transport, clock=clock).run(order())
    assert (response.context_restore, response.degraded) == (restored, not restored)


async def test_call_carries_the_propagation_headers() -> None:
    """Deadline (remaining ms), hops including this one, tenant, retry marker reach the transport."""
    _, fake, pipeline = setup()
    await pipeline.run(order(tenant="acme", timeout_ms=2500, hops=[Hop(agent="desk", capability="triage")]))
    headers = fake.calls[0].headers
    assert headers["X-Reach-Deadline"] == "2500"
    assert headers["X-Reach-Hops"] == "desk/triage,orders/query_order"
    assert headers["X-Tenant"] == "acme"
    assert headers["X-Reach-Retry"] == "upstream"
    assert "Idempotency-Key" not in headers


async def test_attempt_timeout_is_min_of_remaining_and_per_attempt() -> None:
    """Call.timeout is the per-attempt timeout (connect + response) unless less time remains."""
    agent = make_agent(timeouts=Timeouts(connect=1, response=4))
    _, fake, pipeline = setup(agent)
    await pipeline.run(order(timeout_ms=60_000))
    await pipeline.run(order(timeout_ms=2_000))
    assert [call.timeout for call in fake.calls] == [pytest.approx(5.0), pytest.approx(2.0)]


async def test_deadline_sources_in_order() -> None:
    """Explicit deadline, else timeout_ms, else the agent's total, else the default."""
    clock, fake, pipeline = setup(make_agent(timeouts=Timeouts(total=9)), default_timeout=30)
    now = clock.now()
    await pipeline.run(order(deadline=now + 4))
    await pipeline.run(order(timeout_ms=3000))
    await pipeline.run(order())
    remaining = [int(call.headers["X-Reach-Deadline"]) for call in fake.calls]
    assert remaining[0] == pytest.approx(4000, abs=1)
    assert remaining[1:] == [3000, 9000]
    _, fake2, pipeline2 = setup()
    await pipeline2.run(order())
    assert fake2.calls[0].headers["X-Reach-Deadline"] == "30000"


async def test_expired_deadline_raises_before_sending() -> None:
    """A request whose deadline already passed is refused; nothing is sent."""
    clock, fake, pipeline = setup()
    with pytest.raises(DeadlineExceeded):
        await pipeline.run(order(deadline=clock.now() - 1))
    assert fake.calls == []


async def test_transient_failures_are_retried_with_full_jitter() -> None:
    """503, 502, 504 and a reset are retried; delays stay within U(0, min(cap, base*2**n))."""
    _, fake, pipeline = setup()
    fake.script("*", "503", "reset")
    response = await pipeline.run(order(), trace=True)
    assert response.ok and response.attempts == 3
    assert response.trace is not None
    delays = [a.retry_delay_ms for a in response.trace.attempts]
    assert delays[0] is not None and 0 <= delays[0] <= 200
    assert delays[1] is not None and 0 <= delays[1] <= 400
    assert delays[2] is None
    assert [a.outcome for a in response.trace.attempts] == ["transient", "transient", "success"]


@pytest.mark.parametrize("behaviour", ["business", "404", "400"])
async def test_business_errors_are_never_retried(behaviour: str) -> None:
    """error.type business and other 4xx fail at once; raise_for_status gives BusinessError."""
    _, fake, pipeline = setup()
    fake.default(behaviour)
    response = await pipeline.run(order())
    assert response.status == "fail" and len(fake.calls) == 1
    assert response.error is not None and response.error.type == "business"
    with pytest.raises(BusinessError):
        response.raise_for_status()


async def test_invalid_response_is_not_retried_nor_passed_on() -> None:
    """Garbage from the agent fails the request without data and is not retried."""
    _, fake, pipeline = setup()
    fake.default("garbage")
    response = await pipeline.run(order())
    assert response.status == "fail" and response.data is None
    assert response.error is not None and response.error.type == "invalid_response"
    assert len(fake.calls) == 1


async def test_return_schema_violation_is_an_invalid_response() -> None:
    """A success whose data breaks return_schema becomes invalid_response, data withheld."""
    cap = Capability(name="query_order", return_schema={"type": "object", "required": ["status"]})
    _, _, pipeline = setup(make_agent(capability=cap))
    response = await pipeline.run(order())
    assert response.status == "fail" and response.data is None
    assert response.error is not None and "status" in response.error.message


async def test_retry_after_is_honoured() -> None:
    """A 429 with Retry-After 1.5 s delays the next attempt by at least 1.5 s of virtual time."""
    _, fake, pipeline = setup()
    fake.script("*", "429:1.5")
    response = await pipeline.run(order(), trace=True)
    assert response.ok and response.trace is not None
    first, second = response.trace.attempts
    assert second.started_at - (first.started_at + first.duration_ms / 1000) >= 1.5


async def test_backpressure_hint_is_honoured() -> None:
    """An explicit backpressure reply with no other instance to take it is retried after its hinted delay."""
    _, fake, pipeline = setup(make_agent(instances=1))
    fake.script("*", "backpressure:2")
    response = await pipeline.run(order(), trace=True)
    assert response.ok and response.trace is not None
    assert response.trace.attempts[0].outcome == "backpressure"
    assert response.trace.attempts[0].retry_delay_ms == pytest.approx(2000)


async def test_retry_after_past_the_deadline_is_not_waited_for() -> None:
    """If Retry-After would end past the deadline, no retry is made and the answer is a timeout."""
    clock, fake, pipeline = setup()
    fake.script("*", "429:5")
    start = clock.now()
    response = await pipeline.run(order(timeout_ms=3000))
    assert response.status == "timeout" and len(fake.calls) == 1
    assert clock.now() - start < 1


async def test_no_sleep_goes_past_the_deadline_and_attempts_are_reported() -> None:
    """A hanging agent is cut at the deadline; DeadlineExceeded lists the attempts made."""
    clock, fake, pipeline = setup()
    fake.default("hang")
    start = clock.now()
    response = await pipeline.run(order(timeout_ms=1500))
    assert response.status == "timeout"
    assert clock.now() - start == pytest.approx(1.5)
    with pytest.raises(DeadlineExceeded) as caught:
        response.raise_for_status()
    assert len(caught.value.attempts) == 1 and caught.value.attempts[0].outcome == "timeout"


async def test_per_attempt_timeout_leaves_room_for_a_retry() -> None:
    """With a short per-attempt timeout, a hung attempt is cut and the retry succeeds within the deadline."""
    _, fake, pipeline = setup(make_agent(timeouts=Timeouts(connect=0.5, response=1)))
    fake.script("*", "hang")
    response = await pipeline.run(order(timeout_ms=10_000), trace=True)
    assert response.ok and response.trace is not None
    assert [a.outcome for a in response.trace.attempts] == ["timeout", "success"]


async def test_max_attempts_is_configurable_per_capability() -> None:
    """The capability's retry policy overrides the agent's."""
    cap = Capability(name="query_order", retry=RetryPolicy(max_attempts=5))
    _, fake, pipeline = setup(make_agent(capability=cap))
    fake.default("503")
    response = await pipeline.run(order(timeout_ms=60_000))
    assert response.status == "fail" and len(fake.calls) == 5


@pytest.mark.parametrize("upstream, owns", [(True, False), (False, True)])
async def test_one_retry_layer_only(upstream: bool, owns: bool) -> None:
    """retried_upstream or a transport that retries itself means exactly one attempt here."""
    _, fake, pipeline = setup(owns_retries=owns)
    fake.default("503")
    response = await pipeline.run(order(retried_upstream=upstream))
    assert response.status == "fail" and len(fake.calls) == 1
    assert ("X-Reach-Retry" in fake.calls[0].headers) == upstream


@pytest.mark.parametrize("behaviour, sends", [("connect", 3), ("lost", 1), ("reset", 1)])
async def test_not_retryable_capability_is_retried_only_when_never_delivered(behaviour: str, sends: int) -> None:
    """retryable: false without a key: a connect failure is retried, a timeout or reset is not."""
    cap = Capability(name="query_order", retryable=False)
    _, fake, pipeline = setup(make_agent(capability=cap, instances=1))
    fake.default(behaviour)
    await pipeline.run(order())
    assert len(fake.calls) == sends


async def test_connect_failure_fails_over_to_another_instance() -> None:
    """A retry after a connect failure goes to a different instance."""
    _, fake, pipeline = setup()
    fake.default("connect", "orders-0")
    response = await pipeline.run(order())
    assert response.ok and response.instance != "orders-0"
    assert fake.calls[0].instance.instance_id == "orders-0"


async def test_unknown_capability_raises_and_sends_nothing() -> None:
    """A routing refusal propagates as the router's error; nothing is sent."""
    _, fake, pipeline = setup()
    with pytest.raises(UnknownCapability):
        await pipeline.run(ReachRequest(capability="launch_rocket"))
    assert fake.calls == []


async def test_credentials_are_resolved_per_agent_and_tenant() -> None:
    """The credential resolver is asked with (agent, tenant) and its answer rides on the call."""
    asked: list[tuple[str, str | None]] = []

    def resolve(agent: AgentDescriptor, tenant: str | None) -> Credential:
        asked.append((agent.name, tenant))
        return Credential(type="bearer", value="s3cret")

    _, fake, pipeline = setup(credentials=resolve)
    await pipeline.run(order(tenant="acme"))
    assert asked == [("orders", "acme")]
    assert fake.calls[0].credential.value == "s3cret"


async def test_seed_retry_storm_is_capped_by_the_budget() -> None:
    """Seed story (15x storm): during a full outage the budget stops retries, so load stays near 1x."""
    _, fake, pipeline = setup(make_agent(instances=1, circuit_breaker={"min_calls": 1000}))
    fake.default("503")
    for _ in range(200):
        await pipeline.run(order())
    assert len(fake.calls) == 200 + 10, "ten failed retries drain the 20-token budget to half; then none"


async def test_thirty_percent_failures_on_every_instance_are_retried_to_97_percent() -> None:
    """30 % independent transient failures everywhere: retries keep paying off, so ~97.3 % succeed (1 - 0.3**3)."""
    _, fake, pipeline = setup()
    fake.default("flaky:0.3")
    results = [await pipeline.run(order()) for _ in range(2000)]
    failed = sum(not r.ok for r in results)
    expected, sigma = 2000 * 0.3**3, math.sqrt(2000 * 0.3**3 * (1 - 0.3**3))
    assert failed <= expected + 3 * sigma, f"{failed} of 2000 failed (breaker or budget withheld retries)"
    assert all(pipeline.is_available("orders", f"orders-{i}") for i in range(3)), "a flaky instance is not dead"


async def test_a_fifth_of_replies_lost_on_a_single_instance_keyed_calls_still_succeed() -> None:
    """One instance executes every call but loses 20 % of the replies: keyed retries recover all but ~0.8 %."""
    capability = Capability(name="query_order", idempotency_key="${params.order_id}")
    _, fake, pipeline = setup(make_agent(instances=1, capability=capability))
    fake.default("lossy:0.2")
    requests = [
        ReachRequest(capability="query_order", payload={"order_id": f"o{n}", "op": f"o{n}"}) for n in range(1000)
    ]
    results = [await pipeline.run(request) for request in requests]
    failed = sum(not r.ok for r in results)
    expected, sigma = 1000 * 0.2**3, math.sqrt(1000 * 0.2**3 * (1 - 0.2**3))
    assert failed <= expected + 3 * sigma
    assert max(fake.executions.values()) == 1, "the key made every retry a replay, never a second execution"
    assert pipeline.is_available("orders", "orders-0")


async def test_ten_percent_failures_are_fully_retried() -> None:
    """At 10 % transient failures the budget never withholds a retry; only triple failures are lost."""
    _, fake, pipeline = setup()
    fake.default("flaky:0.1")
    results = [await pipeline.run(order()) for _ in range(2000)]
    failed = [r for r in results if not r.ok]
    assert len(failed) <= 6
    assert all(r.attempts == 3 for r in failed)
    assert 1.05 < len(fake.calls) / 2000 < 1.15


async def test_aclose_closes_the_default_store() -> None:
    """aclose() releases the store the pipeline created; a later run still works without stale keys."""
    _, fake, pipeline = setup()
    await pipeline.run(order(idempotency_key="k"))
    await pipeline.aclose()
    await pipeline.run(order(idempotency_key="k"))
    assert len(fake.calls) == 2
