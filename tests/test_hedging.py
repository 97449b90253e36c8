"""Hedged attempts on virtual time: who may be hedged, when the hedge goes, the first answer wins, the loser is cut."""

from __future__ import annotations

import random

import pytest
from core_fakes import FakeAgent, FakeRouter, make_agent

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.model import AgentDescriptor, Capability, Hedging, Idempotency, ReachRequest
from reach_plugins.policy.hedging import hedge_delay, hedging_of
from reach_plugins.policy.latency import WINDOW, Latencies
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.dedup import MemoryDedupStore
from reach_plugins.testing.clock import FakeClock

HEDGING = Hedging(max_delay=0.5, min_samples=10)


def setup(agent: AgentDescriptor) -> tuple[FakeClock, FakeAgent, Pipeline]:
    clock = FakeClock()
    fake = FakeAgent(clock, honours_idempotency=True)
    router = FakeRouter([agent])
    store = MemoryDedupStore(budget=DEFAULT_BUDGET, clock=clock)
    pipeline = Pipeline(router=router, transport=fake.transport, store=store, clock=clock, rng=random.Random(5))
    router.is_available = pipeline.is_available
    return clock, fake, pipeline


def shared_agent(**fields: object) -> AgentDescriptor:
    return make_agent(idempotency=Idempotency(shared=True), hedging=HEDGING, **fields)  # type: ignore[arg-type]


def order(op: str, **fields: object) -> ReachRequest:
    return ReachRequest(capability="query_order", payload={"op": op}, timeout_ms=3000, **fields)  # type: ignore[arg-type]


async def test_keyed_call_to_shared_idempotency_agent_is_hedged_and_the_first_answer_wins() -> None:
    """The first instance takes 5 s, deadline 3 s: the hedge at max_delay answers; both attempts are recorded."""
    clock, fake, pipeline = setup(shared_agent())
    fake.script("orders-0", "slow:5")
    start = clock.now()
    response = await pipeline.run(order("op-1", idempotency_key="k-1"), trace=True)
    assert response.ok and response.instance != "orders-0"
    assert clock.now() - start == pytest.approx(HEDGING.max_delay + fake.latency)
    assert response.trace is not None
    outcomes = [(a.instance, a.outcome, a.delivery) for a in response.trace.attempts]
    assert outcomes == [("orders-0", "cancelled", "unknown"), (response.instance, "success", "answered")]
    assert response.attempts == 2
    await clock.sleep(10)
    assert fake.executions["op-1"] == 1  # the slow one was cancelled before it ran; the key guards it anyway


async def test_unkeyed_write_is_never_hedged() -> None:
    """The same slow instance without a key (a write, not declared safe): one attempt, cut at the deadline."""
    _, fake, pipeline = setup(shared_agent())
    fake.script("orders-0", "slow:5")
    response = await pipeline.run(order("op-2", metadata={}))
    assert response.status == "timeout"
    assert [call.instance.instance_id for call in fake.calls] == ["orders-0"]


async def test_keyed_call_to_agent_without_shared_idempotency_is_not_hedged() -> None:
    """Each instance keeps its own keys: a second instance could run the key again, so no hedge."""
    _, fake, pipeline = setup(make_agent(hedging=HEDGING))
    fake.script("orders-0", "slow:5")
    await pipeline.run(order("op-3", idempotency_key="k-3"))
    assert [call.instance.instance_id for call in fake.calls] == ["orders-0"]


async def test_a_conversation_turn_is_not_hedged() -> None:
    """A call with a session id stays with its conversation's instance: no hedge moves it."""
    _, fake, pipeline = setup(shared_agent())
    fake.script("orders-0", "slow:5")
    await pipeline.run(order("op-7", idempotency_key="k-7", session_id="conv-1"))
    assert [call.instance.instance_id for call in fake.calls] == ["orders-0"]


async def test_safe_capability_is_hedged_without_a_key() -> None:
    """A read declared ``safe`` may run twice: hedged without a key."""
    agent = make_agent(capability=Capability(name="query_order", safe=True), hedging=HEDGING)
    _, fake, pipeline = setup(agent)
    fake.script("orders-0", "slow:5")
    response = await pipeline.run(order("op-4"))
    assert response.ok and response.instance != "orders-0"


async def test_hedge_delay_follows_the_capability_latency_percentile() -> None:
    """After enough fast answers the hedge goes at their p95 (10 ms), not at max_delay."""
    clock, fake, pipeline = setup(shared_agent())
    for n in range(HEDGING.min_samples):
        assert (await pipeline.run(order(f"warm-{n}", idempotency_key=f"w-{n}"))).ok
    turn = [call.instance.instance_id for call in fake.calls][-1]
    nxt = f"orders-{(int(turn[-1]) + 1) % 3}"
    fake.script(nxt, "slow:5")
    start = clock.now()
    response = await pipeline.run(order("op-5", idempotency_key="k-5"))
    assert response.ok and response.instance != nxt
    assert clock.now() - start == pytest.approx(2 * fake.latency)


async def test_a_failed_attempt_leaves_the_race_to_the_other() -> None:
    """The hedge is refused (backpressure) while the slow first attempt still runs: the first one answers."""
    _, fake, pipeline = setup(shared_agent())
    fake.script("orders-0", "slow:1")
    fake.script("orders-1", "backpressure:1")
    fake.script("orders-2", "backpressure:1")
    response = await pipeline.run(order("op-6", idempotency_key="k-6"), trace=True)
    assert response.ok and response.instance == "orders-0"
    assert response.trace is not None
    assert [a.outcome for a in response.trace.attempts] == ["backpressure", "success"]


def test_hedge_delay_is_the_percentile_of_recent_latencies_within_bounds() -> None:
    """Nearest-rank p95 over the window, max_delay until min_samples, clamped to [min_delay, max_delay]."""
    latencies = Latencies()
    policy = Hedging(min_delay=0.02, max_delay=0.4, min_samples=20)
    assert hedge_delay(latencies, "a", "c", policy) == 0.4
    for n in range(1, WINDOW + 1):
        latencies.record("a", "c", n / 1000.0)
    assert hedge_delay(latencies, "a", "c", policy) == pytest.approx(0.95 * WINDOW / 1000.0)
    for _ in range(WINDOW):
        latencies.record("a", "c", 0.001)
    assert hedge_delay(latencies, "a", "c", policy) == 0.02
    for _ in range(WINDOW):
        latencies.record("a", "c", 9.0)
    assert hedge_delay(latencies, "a", "c", policy) == 0.4


def test_who_may_be_hedged() -> None:
    """safe -> yes; keyed + shared idempotency -> yes; keyed alone, or an unkeyed write -> no; no policy -> no."""
    write, read = Capability(name="w"), Capability(name="r", safe=True)
    shared = AgentDescriptor(name="a", idempotency=Idempotency(shared=True), hedging=HEDGING)
    own = AgentDescriptor(name="b", hedging=HEDGING)
    assert hedging_of(shared, write, keyed=True) is HEDGING
    assert hedging_of(shared, write, keyed=False) is None
    assert hedging_of(own, write, keyed=True) is None
    assert hedging_of(own, read, keyed=False) is HEDGING
    assert hedging_of(AgentDescriptor(name="c"), read, keyed=True) is None


async def test_a_slow_instance_whose_attempts_lose_their_races_is_still_cut_and_ejected() -> None:
    """orders-0 turns slow (5 s) once the hedge delay is short: every attempt of it is cancelled by a hedge after
    ~20 ms, yet those censored latencies get it ejected by the outlier detector; no call fails."""
    _, fake, pipeline = setup(shared_agent())
    for n in range(HEDGING.min_samples):
        assert (await pipeline.run(order(f"warm-{n}", idempotency_key=f"w-{n}"))).ok
    fake.default("slow:5", "orders-0")
    shares: list[float] = []
    for n in range(200):
        response = await pipeline.run(order(f"op-{n}", idempotency_key=f"s-{n}"))
        assert response.ok and response.instance != "orders-0"
        share, why = pipeline.standing("orders", "orders-0")
        shares.append(share)
        if share == 0.0:
            break
    assert shares[-1] == 0.0 and why is not None and why.startswith("outlier ejected"), (shares, why)
    assert pipeline.standing("orders", "orders-1") == (1.0, None)
    sent = fake.sent["orders-0"]
    for n in range(20):
        assert (await pipeline.run(order(f"after-{n}", idempotency_key=f"a-{n}"))).ok
    assert fake.sent["orders-0"] == sent, "ejected: no attempt goes there"
