"""Fleet-wide quotas: GCRA and leases in one Lua script on real Redis (and the memory twin), layer naming,
priority shedding, a killed holder's lease expiring, the local fallback while Redis is down, and the pipeline."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from servers import Server

from reach_plugins import AgentDescriptor, ReachClient
from reach_plugins.attempts.quotas import Quotas
from reach_plugins.config.loader import parse_config
from reach_plugins.config.quotas import QuotaConfig
from reach_plugins.errors import ConfigError, RateLimited, from_wire
from reach_plugins.model import ErrorInfo, ReachRequest
from reach_plugins.policy.gcra import QuotaLayer
from reach_plugins.registry import MemoryRegistry
from reach_plugins.stores.quotas import MemoryQuotaStore, QuotaStore, layers_of
from reach_plugins.stores.redis_quotas import RedisQuotaStore
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, MockTransport

Store = Callable[[Callable[[], float]], QuotaStore]


def fresh_prefix() -> str:
    return f"quota-test:{uuid.uuid4().hex}:"


@pytest.fixture(params=["memory", "redis"])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """A factory of quota stores on a given clock: in memory, or the Lua script on the real test Redis."""
    opened: list[Any] = []

    def make(clock: Callable[[], float]) -> QuotaStore:
        if request.param == "memory":
            return MemoryQuotaStore(clock=clock)
        client = aioredis.Redis.from_url(request.getfixturevalue("redis_url"), socket_timeout=2.0)
        opened.append(client)
        return RedisQuotaStore(client, prefix=fresh_prefix(), clock=clock)

    yield make
    for client in opened:
        await client.aclose()


def layer(
    name: str = "tenant", *, rate: float | None = 10.0, burst: int = 4, concurrency: int | None = None
) -> QuotaLayer:
    return QuotaLayer(name, f"k-{name}", f"the {name}", f"quotas.{name}", rate, burst, concurrency)


class Ticks:
    """A hand-moved clock for the stores (a real one never enters these tests)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_gcra_admits_the_burst_then_the_rate(make_store: Store) -> None:
    """Burst 4 at 10/s: four back to back, the fifth refused with retry_after 0.1 s; 0.1 s later one more passes."""
    ticks = Ticks()
    store = make_store(ticks)
    limit = layer(rate=10.0, burst=4)
    verdicts = [await store.acquire([limit], 1.0, f"l{n}", 5.0) for n in range(5)]
    assert verdicts[:4] == [None] * 4
    refused = verdicts[4]
    assert refused is not None and refused.kind == "rate" and refused.layer.name == "tenant"
    assert refused.retry_after == pytest.approx(0.1, abs=1e-6)
    ticks.now += 0.0999
    assert await store.acquire([limit], 1.0, "early", 5.0) is not None
    ticks.now += 0.0002
    assert await store.acquire([limit], 1.0, "on-time", 5.0) is None
    assert await store.acquire([limit], 1.0, "again", 5.0) is not None


async def test_sustained_demand_gets_the_rate_plus_the_burst(make_store: Store) -> None:
    """Offered 50/s over 9.98 s against 10/s burst 4: the burst at once, then one each 0.1 s: 4 + 99 (no drift)."""
    ticks = Ticks()
    store = make_store(ticks)
    limit = layer(rate=10.0, burst=4)
    admitted = 0
    for n in range(500):
        ticks.now = 1000.0 + n * 0.02
        admitted += await store.acquire([limit], 1.0, f"l{n}", 5.0) is None
    assert admitted == 4 + 99


async def test_a_refusal_by_one_layer_charges_no_other(make_store: Store) -> None:
    """The tenant layer refusing leaves the global layer untouched: another tenant still gets the global burst."""
    ticks = Ticks()
    store = make_store(ticks)
    fleet = layer("global", rate=10.0, burst=4)
    small = QuotaLayer("tenant", "k-small", "tenant 'small'", "quotas.tenants.small", 10.0, 1, None)
    assert await store.acquire([fleet, small], 1.0, "a", 5.0) is None
    for n in range(5):
        refused = await store.acquire([fleet, small], 1.0, f"b{n}", 5.0)
        assert refused is not None and refused.layer.name == "tenant"
    other = QuotaLayer("tenant", "k-other", "tenant 'other'", "quotas.tenants.other", 10.0, 10, None)
    passed = [await store.acquire([fleet, other], 1.0, f"c{n}", 5.0) is None for n in range(4)]
    assert passed == [True, True, True, False]


async def test_concurrency_leases_are_released_or_expire(make_store: Store) -> None:
    """Two slots: a third call is refused (kind concurrency); a release frees one; an unreleased lease frees at
    its expiry."""
    ticks = Ticks()
    store = make_store(ticks)
    slots = layer("agent", rate=None, concurrency=2)
    assert await store.acquire([slots], 1.0, "a", 5.0) is None
    assert await store.acquire([slots], 1.0, "b", 30.0) is None
    refused = await store.acquire([slots], 1.0, "c", 5.0)
    assert refused is not None and refused.kind == "concurrency" and refused.layer.name == "agent"
    await store.release([slots], "a")
    assert await store.acquire([slots], 1.0, "c", 5.0) is None
    assert await store.acquire([slots], 1.0, "d", 5.0) is not None
    ticks.now += 5.01  # "c" expires ("b" holds on for 30 s)
    assert await store.acquire([slots], 1.0, "d", 5.0) is None
    assert await store.acquire([slots], 1.0, "e", 5.0) is not None


async def test_a_renewed_lease_holds_its_slot_a_released_one_is_not_revived(make_store: Store) -> None:
    """One slot: a lease renewed before its expiry still holds it past the first ttl; renewing a released
    lease does not take the slot back."""
    ticks = Ticks()
    store = make_store(ticks)
    slots = layer("tenant", rate=None, concurrency=1)
    assert await store.acquire([slots], 1.0, "a", 10.0) is None
    ticks.now += 8.0
    await store.renew([slots], "a", 10.0)
    ticks.now += 7.0  # 15 s after the acquire, 7 s after the renewal
    refused = await store.acquire([slots], 1.0, "b", 10.0)
    assert refused is not None and refused.kind == "concurrency"
    await store.release([slots], "a")
    await store.renew([slots], "a", 10.0)
    assert await store.acquire([slots], 1.0, "b", 10.0) is None


async def test_a_lower_priority_share_is_shed_first(make_store: Store) -> None:
    """Share 0.5 of burst 10 and of 4 slots: batch calls stop at 5 back to back and 2 in flight, online go on."""
    ticks = Ticks()
    store = make_store(ticks)
    rate = layer(rate=10.0, burst=10)
    batch = [await store.acquire([rate], 0.5, f"b{n}", 5.0) is None for n in range(7)]
    assert batch == [True] * 5 + [False] * 2
    online = [await store.acquire([rate], 1.0, f"o{n}", 5.0) is None for n in range(6)]
    assert online == [True] * 5 + [False]
    slots = layer("agent", rate=None, concurrency=4)
    assert [await store.acquire([slots], 0.5, f"s{n}", 5.0) is None for n in range(3)] == [True, True, False]
    assert [await store.acquire([slots], 1.0, f"t{n}", 5.0) is None for n in range(3)] == [True, True, False]


async def test_contested_budget_goes_to_online_uncontested_batch_gets_the_rate(make_store: Store) -> None:
    """Online and batch each offering 20/s to a 10/s budget: online gets ~all of it, batch ~none; batch alone
    still gets the full 10/s."""
    ticks = Ticks()
    store = make_store(ticks)
    limit = layer(rate=10.0, burst=10)
    got = {"online": 0, "batch": 0}
    for n in range(200):  # 5 s, the two interleaved
        ticks.now = 1000.0 + n * 0.025
        priority, share = ("online", 1.0) if n % 2 == 0 else ("batch", 0.5)
        got[priority] += await store.acquire([limit], share, f"l{n}", 5.0) is None
    assert got["online"] >= 50 and got["batch"] <= 5 + 1, got
    ticks.now += 10.0
    alone = 0
    for n in range(100):
        ticks.now += 0.05
        alone += await store.acquire([limit], 0.5, f"m{n}", 5.0) is None
    assert alone >= 5 * 10 - 1


CONFIG: dict[str, Any] = {
    "global": {"rate": 1000},
    "tenants": {
        "demo": {"rate": 3, "burst": 3, "agents": {"orders": {"rate": 1, "burst": 1}}},
        "cheap": {"rate": 100, "priority": "batch"},
    },
    "other": {"concurrency": 1},
}


def request(tenant: str | None, priority: str = "online") -> ReachRequest:
    return ReachRequest(capability="query_order", tenant=tenant, priority=priority)  # type: ignore[arg-type]


async def test_refusals_name_their_layer_and_when_to_retry() -> None:
    """The agent layer refuses demo's second call to orders, the tenant layer its fourth call anywhere; the
    error says which layer, whose budget and the config key, and survives the wire."""
    clock = FakeClock()
    quotas = Quotas(QuotaConfig.model_validate(CONFIG), clock=clock)
    await quotas.acquire(request("demo"), "orders", 10.0)
    with pytest.raises(RateLimited) as agent_refusal:
        await quotas.acquire(request("demo"), "orders", 10.0)
    assert agent_refusal.value.layer == "agent" and agent_refusal.value.retry_after == pytest.approx(1.0)
    assert "quotas.tenants.demo.agents.orders" in agent_refusal.value.message
    await quotas.acquire(request("demo"), "billing", 10.0)
    await quotas.acquire(request("demo"), "billing", 10.0)
    with pytest.raises(RateLimited) as tenant_refusal:
        await quotas.acquire(request("demo"), "billing", 10.0)
    assert tenant_refusal.value.layer == "tenant" and "tenant 'demo'" in tenant_refusal.value.message
    wire = ErrorInfo(type="rate_limited", message=tenant_refusal.value.message, retry_after=0.25)
    again = from_wire(wire)
    assert isinstance(again, RateLimited) and again.layer == "tenant" and again.retry_after == 0.25


async def test_unlisted_tenants_share_one_budget_and_key() -> None:
    """Tenants missing from ``tenants:`` (and a request naming none) draw from ``other``: one key for all."""
    config = QuotaConfig.model_validate(CONFIG)
    keys = {layers_of(config, tenant, "orders")[1].key for tenant in ("x", "y", "default")}
    assert len(keys) == 1
    quotas = Quotas(config, clock=FakeClock())
    await quotas.acquire(request("x"), "orders", 10.0)
    with pytest.raises(RateLimited) as refused:
        await quotas.acquire(request(None), "orders", 10.0)
    assert refused.value.layer == "tenant" and "quotas.other" in refused.value.message


async def test_a_batch_tenant_is_judged_as_batch_whatever_its_calls_say() -> None:
    """A tenant with ``priority: batch`` gets the batch share even for calls marked online."""
    config = QuotaConfig.model_validate(CONFIG)
    assert config.share("online", "cheap") == 0.5 and config.share("online", "demo") == 1.0
    assert config.share("batch", "demo") == 0.5


def test_bad_quota_config_names_the_key() -> None:
    """A quota without rate or concurrency, a share above 1, a misspelt key, a reserved tenant name: ConfigError
    naming the path or the rule."""
    agents = [{"name": "orders", "endpoints": ["http://127.0.0.1:9"], "capabilities": ["query_order"]}]
    cases = [
        ({"tenants": {"demo": {"burst": 3}}}, "quotas.tenants.demo"),
        ({"priorities": {"batch": 2}}, "quotas.priorities"),
        ({"global": {"rat": 10}}, "quotas.global"),
        ({"tenants": {"*other": {"rate": 1}}}, "reserved"),
    ]
    for quotas, path in cases:
        with pytest.raises(ConfigError) as refused:
            parse_config({"agents": agents, "quotas": quotas})
        assert path in refused.value.message, refused.value.message
    loaded = parse_config({"agents": agents, "quotas": {"global": {"rate": 5}}})
    assert loaded.quotas is not None and loaded.quotas.global_ is not None and loaded.quotas.global_.rate == 5


ORDERS: dict[str, Any] = {
    "name": "orders",
    "endpoints": ["http://127.0.0.1:9"],
    "capabilities": [{"name": "query_order"}],
}


def echo(call: Call) -> dict[str, Any]:
    return {"ok": True}


@pytest.mark.parametrize("hop", [False, True])
async def test_the_client_applies_quotas_unless_a_hop_owns_the_request(hop: bool) -> None:
    """Through ReachClient: the third call of a burst-2 tenant is refused and never sent; over a gateway or node
    transport (owns_retries) the client leaves the quota to the hop and sends all three."""
    registry = MemoryRegistry()
    await registry.register_agent(AgentDescriptor.model_validate(ORDERS))
    transport = MockTransport(echo, owns_retries=hop)
    config = QuotaConfig.model_validate({"tenants": {"demo": {"rate": 1, "burst": 2}}})
    client = ReachClient(registry, transport, tenant="demo", quotas=config, clock=FakeClock())
    try:
        assert (await client.reach("query_order")).ok and (await client.reach("query_order")).ok
        if hop:
            assert (await client.reach("query_order")).ok
        else:
            with pytest.raises(RateLimited) as refused:
                await client.reach("query_order")
            assert refused.value.layer == "tenant"
        assert len(transport.calls) == (3 if hop else 2)
    finally:
        await client.aclose()


HOLDER = """
import asyncio, sys
from reach_plugins.attempts.quotas import Quotas
from reach_plugins.config.quotas import QuotaConfig
from reach_plugins.model import ReachRequest

async def main() -> None:
    config = QuotaConfig.model_validate({"store": sys.argv[1], "tenants": {"demo": {"concurrency": 1}}})
    quotas = Quotas(config)
    await quotas.acquire(ReachRequest(capability="hold", tenant="demo"), "orders", float(sys.argv[2]))
    print("held", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_killed_holder_frees_its_slot_at_the_lease_expiry(redis_url: str) -> None:
    """A process holding the tenant's only slot is killed -9: the slot stays taken until its lease (deadline
    0.5 s + 2 s grace) expires on Redis's clock, then another process gets it."""
    store = f"{redis_url}?prefix={fresh_prefix()}"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, store, "0.5"], stdout=subprocess.PIPE, text=True)
    quotas = Quotas(QuotaConfig.model_validate({"store": store, "tenants": {"demo": {"concurrency": 1}}}))
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(holder.stdout.readline), 60)
        assert line.strip() == "held"
        holder.kill()
        holder.wait(10)
        killed = time.monotonic()
        with pytest.raises(RateLimited) as refused:
            await quotas.acquire(request("demo"), "orders", 5.0)
        assert refused.value.layer == "tenant" and refused.value.retry_after is not None
        while True:
            try:
                lease = await quotas.acquire(request("demo"), "orders", 5.0)
                break
            except RateLimited:
                assert time.monotonic() - killed < 10.0, "the dead holder's lease never expired"
                await asyncio.sleep(0.1)
        assert lease is not None and time.monotonic() - killed < 2.5 + 1.0
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
        await quotas.aclose()


async def test_redis_down_each_process_enforces_its_share_never_unlimited(
    private_redis: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis killed: calls are judged on this process's 1/4 share (burst 8 -> 2, concurrency 8 -> 2), with a
    warning and the fallback metric; Redis back: after ``recheck`` the shared budget is used again."""
    reader = InMemoryMetricReader()
    store = f"redis://127.0.0.1:{private_redis.port}/0?prefix={fresh_prefix()}"
    config = QuotaConfig.model_validate(
        {
            "store": store,
            "tenants": {"demo": {"rate": 4, "burst": 8}, "busy": {"concurrency": 8}},
            "fallback": {"processes": 4, "recheck": "1s"},
        }
    )
    clock = FakeClock()
    quotas = Quotas(config, clock=clock, meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        assert await quotas.acquire(request("demo"), "orders", 5.0) is not None
        private_redis.stop(crash=True)
        with caplog.at_level(logging.WARNING, logger="reach_plugins.quotas"):
            admitted = 0
            for _ in range(10):
                try:
                    await quotas.acquire(request("demo"), "orders", 5.0)
                    admitted += 1
                except RateLimited as exc:
                    assert exc.layer == "tenant" and "1 requests/s (burst 2)" in exc.message
            leases = []
            for _ in range(3):
                try:
                    leases.append(await quotas.acquire(request("busy"), "orders", 5.0))
                except RateLimited as exc:
                    assert exc.layer == "tenant"
        assert admitted == 2 and len(leases) == 2
        assert quotas.on_fallback
        assert any("enforces 1/4 of every quota" in record.getMessage() for record in caplog.records)
        data = reader.get_metrics_data()
        assert data is not None
        counted = [
            point.value
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "reach.quota.fallbacks"
            for point in metric.data.data_points  # type: ignore[union-attr]
        ]
        assert counted == [13]
        private_redis.start()
        clock.advance(1.01)
        assert await quotas.acquire(request("demo"), "orders", 5.0) is not None
        assert not quotas.on_fallback
    finally:
        await quotas.aclose()


async def test_a_stream_holds_its_concurrency_slot_until_it_ends() -> None:
    """A tenant with one slot: while a stream is open another call is refused (concurrency), once it ends one
    passes."""
    registry = MemoryRegistry()
    await registry.register_agent(AgentDescriptor.model_validate(ORDERS))
    config = QuotaConfig.model_validate({"tenants": {"demo": {"concurrency": 1}}})
    client = ReachClient(registry, MockTransport(echo), tenant="demo", quotas=config, clock=FakeClock())
    try:
        events = client.stream("query_order")
        first = await anext(events)
        assert first is not None
        with pytest.raises(RateLimited) as refused:
            await client.reach("query_order")
        assert refused.value.layer == "tenant" and "calls in flight" in refused.value.message
        async for _ in events:
            pass
        assert (await client.reach("query_order")).ok
    finally:
        await client.aclose()
