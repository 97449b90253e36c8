"""Bounded waiting for a quota (``quotas.waits``): the wait decision on a fake clock, Quotas waiting its turn
without holding or charging anything, and the public API on real Redis: online callers wait, batch ones are shed."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader

from reach_plugins import AgentDescriptor, ReachClient
from reach_plugins.attempts.quotas import Quotas
from reach_plugins.config.loader import parse_config
from reach_plugins.config.quotas import QuotaConfig
from reach_plugins.errors import ConfigError, RateLimited
from reach_plugins.model import ReachRequest
from reach_plugins.policy.gcra import QuotaLayer, Refusal
from reach_plugins.policy.quota_wait import MAX_RECHECKS, QuotaWait
from reach_plugins.registry import MemoryRegistry
from reach_plugins.telemetry.spans import EVENT_QUOTA_WAIT
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, MockTransport

LAYER = QuotaLayer("tenant", "k", "tenant 'demo'", "quotas.tenants.demo", 10.0, 2, 1)


def rate(retry_after: float) -> Refusal:
    return Refusal(LAYER, "rate", retry_after)


# --------------------------------------------------------------------------- the decision, sans IO


def test_a_rate_refusal_sleeps_its_retry_after_while_it_fits_the_wait() -> None:
    """Wait 0.3 s: a 0.1 s retry_after is slept at 0 and at 0.2 s; at 0.25 s it would end past the wait: refused."""
    wait = QuotaWait.start(0.0, max_wait=0.3, remaining=5.0)
    assert wait.delay(rate(0.1), 0.0) == 0.1
    assert wait.delay(rate(0.1), 0.2) == 0.1
    assert wait.delay(rate(0.1), 0.25) is None
    assert wait.delay(rate(0.4), 0.0) is None


def test_the_deadline_bounds_the_wait_and_no_wait_means_refused_at_once() -> None:
    """A wait never reaches the deadline (0.2 s left: 0.15 s is slept, 0.2 s is not); a zero wait sleeps nothing."""
    short = QuotaWait.start(0.0, max_wait=1.0, remaining=0.2)
    assert short.delay(rate(0.15), 0.0) == 0.15
    assert short.delay(rate(0.2), 0.0) is None
    assert QuotaWait.start(0.0, max_wait=0.0, remaining=5.0).delay(rate(1e-6), 0.0) is None


def test_rechecks_are_bounded() -> None:
    """After MAX_RECHECKS re-checks a call is refused even with wait left."""
    wait = QuotaWait.start(0.0, max_wait=10.0, remaining=60.0)
    for _ in range(MAX_RECHECKS):
        assert wait.delay(rate(0.01), 0.0) == 0.01
        wait = wait.again()
    assert wait.rechecked == MAX_RECHECKS and wait.delay(rate(0.01), 0.0) is None


def test_a_concurrency_refusal_waits_at_most_the_rest_of_its_wait() -> None:
    """A slot frees when a call ends (no prediction): wait until retry_after or the wait's end, the sooner."""
    wait = QuotaWait.start(0.0, max_wait=0.25, remaining=5.0)
    assert wait.delay(Refusal(LAYER, "concurrency", 1.0), 0.0) == 0.25
    assert wait.delay(Refusal(LAYER, "concurrency", 0.1), 0.0) == 0.1
    assert wait.delay(Refusal(LAYER, "concurrency", 1.0), 0.25) is None


def test_waits_are_per_priority_lowered_to_the_tenant_ceiling_and_bounded() -> None:
    """``waits`` per priority (missing: 0); a ``priority: batch`` tenant waits as batch; a wait over 10 s or a
    misspelt priority is a ConfigError naming the key."""
    config = QuotaConfig.model_validate(
        {"tenants": {"demo": {"rate": 10}, "cheap": {"rate": 10, "priority": "batch"}}, "waits": {"online": "250ms"}}
    )
    assert config.wait("online", "demo") == 0.25 and config.wait("batch", "demo") == 0.0
    assert config.wait("online", "cheap") == 0.0
    agents = [{"name": "orders", "endpoints": ["http://127.0.0.1:9"], "capabilities": ["query_order"]}]
    cases = [({"online": "30s"}, "quotas.waits.online: a quota wait of 30s"), ({"onlin": "1s"}, "quotas.waits.onlin")]
    for waits, message in cases:
        with pytest.raises(ConfigError) as refused:
            parse_config({"agents": agents, "quotas": {"waits": waits}})
        assert message in refused.value.message, refused.value.message


# --------------------------------------------------------------------------- Quotas on a fake clock

WAITING: dict[str, Any] = {"tenants": {"demo": {"rate": 10, "burst": 2}}, "waits": {"online": "250ms"}}


def request(priority: str = "online") -> ReachRequest:
    return ReachRequest(capability="query_order", tenant="demo", priority=priority)  # type: ignore[arg-type]


def wait_points(reader: InMemoryMetricReader) -> list[HistogramDataPoint]:
    data = reader.get_metrics_data()
    assert data is not None
    return [
        point
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == "reach.quota.waits"
        for point in metric.data.data_points
        if isinstance(point, HistogramDataPoint)
    ]


async def test_online_calls_wait_their_turn_and_the_one_past_its_wait_is_refused() -> None:
    """10/s burst 2, online wait 0.25 s, five calls at once: two pass, two wait 0.1 and 0.2 s, the fifth (0.3 s
    away) is refused after waiting 0.2 s; a batch call (no wait) is refused at once; reach.quota.waits has them."""
    clock = FakeClock(1000.0)
    reader = InMemoryMetricReader()
    quotas = Quotas(QuotaConfig.model_validate(WAITING), clock=clock, meter_provider=MeterProvider([reader]))
    start = clock.monotonic()
    outcomes = await asyncio.gather(
        *(quotas.acquire(request(), "orders", 5.0) for _ in range(5)), return_exceptions=True
    )
    leases = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
    refused = [outcome for outcome in outcomes if isinstance(outcome, RateLimited)]
    assert sorted(round(lease.waited, 6) for lease in leases if lease is not None) == [0.0, 0.0, 0.1, 0.2]
    assert len(refused) == 1 and "after waiting 0.2s" in refused[0].message
    assert clock.monotonic() - start == pytest.approx(0.2)
    with pytest.raises(RateLimited) as batch:
        await quotas.acquire(request("batch"), "orders", 5.0)
    assert "after waiting" not in batch.value.message and clock.monotonic() - start == pytest.approx(0.2)
    points = {point.attributes["outcome"]: point for point in wait_points(reader) if point.attributes}
    assert points["admitted"].count == 2 and points["admitted"].sum == pytest.approx(0.3)
    assert points["refused"].count == 1 and points["refused"].sum == pytest.approx(0.2)


async def test_a_wait_never_runs_into_the_deadline() -> None:
    """With 0.05 s to its deadline, a call 0.1 s from its turn is refused at once, whatever its wait."""
    clock = FakeClock(1000.0)
    quotas = Quotas(QuotaConfig.model_validate(WAITING), clock=clock)
    start = clock.monotonic()
    await quotas.acquire(request(), "orders", 5.0)
    await quotas.acquire(request(), "orders", 5.0)
    with pytest.raises(RateLimited) as refused:
        await quotas.acquire(request(), "orders", 0.05)
    assert "after waiting" not in refused.value.message and clock.monotonic() == start


async def test_a_slot_waiter_holds_nothing_and_wakes_when_one_is_given_back() -> None:
    """One slot, online wait 0.25 s: a second call waits holding no lease, and is admitted as soon as the first
    gives its slot back (0.1 s), not at the end of its wait; a third, with nobody releasing, is refused at 0.25 s."""
    clock = FakeClock(1000.0)
    config = QuotaConfig.model_validate({"tenants": {"demo": {"concurrency": 1}}, "waits": {"online": 0.25}})
    quotas = Quotas(config, clock=clock)
    first = await quotas.acquire(request(), "orders", 5.0)
    assert first is not None
    (slots,) = first.layers
    waiter = asyncio.create_task(quotas.acquire(request(), "orders", 5.0))
    await clock.sleep(0.1)
    assert not waiter.done() and quotas.local.ledger.held(slots, clock.monotonic()) == 1
    await quotas.release(first)
    second = await waiter
    assert second is not None and second.waited == pytest.approx(0.1) and second.rechecks == 1
    start = clock.monotonic()
    with pytest.raises(RateLimited) as refused:
        await quotas.acquire(request(), "orders", 5.0)
    assert refused.value.layer == "tenant" and clock.monotonic() - start == pytest.approx(0.25)


# --------------------------------------------------------------------------- the public API, real Redis

RATE = 20.0
BURST = 2
CLUMP = 3
"""Calls sent at once, every ``CLUMP / RATE`` s: on average the rate, in bursts above the burst allowance."""
CLUMPS = 14


def echo(call: Call) -> dict[str, Any]:
    return {"ok": True}


async def offer(client: ReachClient, priority: str) -> tuple[list[float], int, float]:
    """Send CLUMPS clumps of CLUMP calls on an open-loop schedule: each admitted call's wait (s), the refusals, and
    the seconds from the first send to the last answer."""
    waits: list[float] = []
    refusals = 0

    async def one() -> None:
        nonlocal refusals
        try:
            answer = await client.reach("query_order", trace=True, priority=priority)
        except RateLimited:
            refusals += 1
            return
        assert answer.ok and answer.trace is not None
        waited = [event["waited_ms"] for event in answer.trace.events if event["event"] == EVENT_QUOTA_WAIT]
        waits.append(waited[0] / 1000.0 if waited else 0.0)

    first = time.monotonic()
    tasks = []
    for n in range(CLUMPS):
        await asyncio.sleep(max(0.0, first + n * CLUMP / RATE - time.monotonic()))
        tasks += [asyncio.create_task(one()) for _ in range(CLUMP)]
    await asyncio.gather(*tasks)
    return waits, refusals, time.monotonic() - first


async def test_online_callers_wait_instead_of_being_refused_batch_callers_are_shed(redis_url: str) -> None:
    """A 20 req/s burst-2 tenant quota on Redis, clumps of 3 every 0.15 s (the rate on average): online callers
    with a 300 ms wait get 0 refusals; without a wait, and batch callers (wait 0) with it, are refused; every run
    admits within GCRA's bound rate × window + burst."""
    registry = MemoryRegistry()
    orders = {"name": "orders", "endpoints": ["http://127.0.0.1:9"], "capabilities": [{"name": "query_order"}]}
    await registry.register_agent(AgentDescriptor.model_validate(orders))
    figures: dict[str, tuple[list[float], int, float]] = {}
    runs: list[tuple[str, dict[str, str], str]] = [
        ("waiting", {"online": "300ms"}, "online"),
        ("no wait", {}, "online"),
        ("batch", {"online": "300ms", "batch": "0s"}, "batch"),
    ]
    for name, waits, priority in runs:
        store = f"{redis_url}?prefix=quota-wait-{uuid.uuid4().hex}:"
        config = {"store": store, "tenants": {"demo": {"rate": RATE, "burst": BURST}}, "waits": waits}
        async with ReachClient(
            registry, MockTransport(echo), tenant="demo", quotas=QuotaConfig.model_validate(config)
        ) as client:
            figures[name] = await offer(client, priority)
    for name, (admitted, refusals, window) in figures.items():
        assert len(admitted) + refusals == CLUMP * CLUMPS
        assert len(admitted) <= RATE * window + BURST, (name, len(admitted), window)
    waited = sorted(figures["waiting"][0])
    quantiles = statistics.quantiles(waited, n=100)
    print(
        f"\nrefusals of {CLUMP * CLUMPS} calls: waiting {figures['waiting'][1]}, no wait {figures['no wait'][1]}, "
        f"batch {figures['batch'][1]}; online wait p50 {quantiles[49] * 1000:.1f} ms, p99 {quantiles[98] * 1000:.1f} ms"
    )
    assert figures["waiting"][1] == 0
    assert figures["no wait"][1] > 0 and figures["batch"][1] > 0
    assert max(waited) <= 0.3
