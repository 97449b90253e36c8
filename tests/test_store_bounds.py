"""Every store, found by discovery: tenants never see each other's entries, entries and bytes stay bounded.

The store classes are the subclasses of the two bases (``BoundedStore`` for memory, ``RedisStore`` for Redis)
found after importing every module of the library, so a new store is covered as soon as it exists: the
first test fails until it has a driver below. A driver writes an entry of about ``size`` bytes for a
tenant's id and tells whether a tenant's id is still there, through each store's own interface.
"""

from __future__ import annotations

import importlib
import pkgutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis

import reach_plugins
from reach_plugins.errors import ConfigError, EntryTooLarge
from reach_plugins.model import ReachResponse
from reach_plugins.node.tickets import Tickets
from reach_plugins.routing.affinity import SessionTable as PinTable
from reach_plugins.stores.budget import MIB, BoundedStore, Budget, LruTable, json_size
from reach_plugins.stores.dedup import MemoryDedupStore
from reach_plugins.stores.keys import DEFAULT_TENANT, SEP, ScopedKey
from reach_plugins.stores.redis import RedisStore
from reach_plugins.stores.redis_dedup import RedisDedupStore
from reach_plugins.stores.redis_sessions import RedisSessions
from reach_plugins.stores.redis_snapshots import RedisSnapshotStore
from reach_plugins.stores.sessions import MemorySessions, session_key
from reach_plugins.stores.sessiontable import SessionTable, snapshot_name
from reach_plugins.stores.snapshots import MemorySnapshotStore
from reach_plugins.stores.urls import open_store
from reach_plugins.testing.clock import FakeClock

Put = Callable[[Any, str, str, int], Awaitable[None]]
Seen = Callable[[Any, str, str], Awaitable[bool]]


def discovered(base: type) -> set[type]:
    """Every concrete subclass of ``base`` once all of the library's modules are imported (Dify's aside)."""
    for module in pkgutil.walk_packages(reach_plugins.__path__, "reach_plugins."):
        if "dify" not in module.name:
            importlib.import_module(module.name)
    found: set[type] = set()
    pending = list(base.__subclasses__())
    while pending:
        kind = pending.pop()
        found.add(kind)
        pending.extend(kind.__subclasses__())
    return found


def answer(size: int) -> ReachResponse:
    return ReachResponse(request_id="r", status="success", data="x" * size, agent="a", instance="a-0")


def dedup_key(tenant: str, name: str) -> ScopedKey:
    return ScopedKey(tenant, "dedup", f"cap{SEP}{name}")


async def dedup_put(store: Any, tenant: str, name: str, size: int) -> None:
    await store.begin(dedup_key(tenant, name), "h", 300)
    await store.complete(dedup_key(tenant, name), answer(size))


async def dedup_seen(store: Any, tenant: str, name: str) -> bool:
    return await store.wait(dedup_key(tenant, name), 0) is not None


async def sessions_put(store: Any, tenant: str, name: str, size: int) -> None:
    await store.claim_pin(session_key(tenant, name), "agent", "i" * size)
    await store.open(session_key(tenant, name))


async def sessions_seen(store: Any, tenant: str, name: str) -> bool:
    alive: bool = await store.is_alive(session_key(tenant, name))
    return alive


async def pins_put(store: Any, tenant: str, name: str, size: int) -> None:
    store.pin(session_key(tenant, name), "cap", "agent", "i" * size)


async def pins_seen(store: Any, tenant: str, name: str) -> bool:
    return store.get(session_key(tenant, name)) is not None


async def states_put(store: Any, tenant: str, name: str, size: int) -> None:
    store.state(tenant, name)["v"] = "x" * size
    store.state(tenant, name)  # a state is sized when its conversation is touched again


async def states_seen(store: Any, tenant: str, name: str) -> bool:
    return snapshot_name(session_key(tenant, name)) in store


async def snapshots_put(store: Any, tenant: str, name: str, size: int) -> None:
    await store.save("agent", {snapshot_name(session_key(tenant, name)): {"v": "x" * size}})


async def snapshots_seen(store: Any, tenant: str, name: str) -> bool:
    return snapshot_name(session_key(tenant, name)) in await store.load("agent")


_TICKETS: dict[tuple[int, str, str], str] = {}
"""The ticket each driver call got, by (store, tenant, id): tickets are named by the node, not the caller."""


async def tickets_put(store: Any, tenant: str, name: str, size: int) -> None:
    ticket = _TICKETS[id(store), tenant, name] = store.issue(None, tenant)
    await store.complete(ticket, answer(size), tenant)
    result = await store.wait(ticket, 0, tenant)
    if result.error is not None and result.error.type == EntryTooLarge.code:
        raise EntryTooLarge(result.error.message)


async def tickets_seen(store: Any, tenant: str, name: str) -> bool:
    ticket = _TICKETS.get((id(store), tenant, name))
    try:
        return ticket is not None and await store.wait(ticket, 0, tenant) is not None
    except KeyError:
        return False


@dataclass(frozen=True)
class Driver:
    make: Callable[..., Any]
    put: Put
    seen: Seen


MEMORY: dict[type, Driver] = {
    MemoryDedupStore: Driver(lambda budget: MemoryDedupStore(budget=budget, clock=FakeClock()), dedup_put, dedup_seen),
    MemorySessions: Driver(lambda budget: MemorySessions(budget=budget), sessions_put, sessions_seen),
    PinTable: Driver(lambda budget: PinTable(budget=budget), pins_put, pins_seen),
    SessionTable: Driver(lambda budget: SessionTable(budget=budget), states_put, states_seen),
    MemorySnapshotStore: Driver(lambda budget: MemorySnapshotStore(budget=budget), snapshots_put, snapshots_seen),
    Tickets: Driver(lambda budget: Tickets(budget=budget), tickets_put, tickets_seen),
}
REDIS: dict[type, Driver] = {
    RedisDedupStore: Driver(
        lambda client, limit: RedisDedupStore(client, prefix=fresh_prefix(), max_value_bytes=limit),
        dedup_put,
        dedup_seen,
    ),
    RedisSessions: Driver(
        lambda client, limit: RedisSessions(client, prefix=fresh_prefix(), max_value_bytes=limit),
        sessions_put,
        sessions_seen,
    ),
    RedisSnapshotStore: Driver(
        lambda client, limit: RedisSnapshotStore(client, prefix=fresh_prefix(), max_value_bytes=limit),
        snapshots_put,
        snapshots_seen,
    ),
}


def name_of(kind: type) -> str:
    """``module.Class`` (two classes are named SessionTable: the router's pins and the agent's states)."""
    return f"{kind.__module__.rsplit('.', 1)[-1]}.{kind.__qualname__}"


def fresh_prefix() -> str:
    return f"reach-test:{uuid.uuid4().hex}:"


def test_every_store_class_has_a_driver() -> None:
    """Discovery finds each memory and Redis store, and each has a driver here (a new store must add one)."""
    assert discovered(BoundedStore) == set(MEMORY)
    assert discovered(RedisStore) == set(REDIS)


@pytest.mark.parametrize("kind", list(MEMORY), ids=name_of)
def test_a_memory_store_cannot_be_built_without_a_budget(kind: type) -> None:
    """No bound, no store: the constructor requires budget=Budget(max_entries=..., max_bytes=...)."""
    with pytest.raises(TypeError, match="budget"):
        kind()


@pytest.mark.parametrize("kind", list(MEMORY), ids=name_of)
async def test_memory_store_keeps_tenants_apart(kind: type) -> None:
    """Tenant B asking for tenant A's id finds nothing; A finds its own."""
    driver = MEMORY[kind]
    store = driver.make(Budget(max_entries=100, max_bytes=MIB))
    await driver.put(store, "acme", "same", 10)
    assert await driver.seen(store, "acme", "same")
    assert not await driver.seen(store, "globex", "same")


@pytest.mark.parametrize("kind", list(MEMORY), ids=name_of)
async def test_memory_store_is_bounded_in_entries(kind: type) -> None:
    """Past max_entries the least recently used entries go: 50 writes keep 5, the latest among them."""
    driver = MEMORY[kind]
    store = driver.make(Budget(max_entries=5, max_bytes=MIB))
    for i in range(50):
        await driver.put(store, "acme", f"id-{i}", 10)
    assert store.entries == 5
    assert await driver.seen(store, "acme", "id-49")
    assert not await driver.seen(store, "acme", "id-0")


@pytest.mark.parametrize("kind", list(MEMORY), ids=name_of)
async def test_memory_store_is_bounded_in_bytes(kind: type) -> None:
    """A flood of 4 KiB values into a 64 KiB budget stays under 64 KiB, counted and measured entry by entry."""
    driver = MEMORY[kind]
    budget = Budget(max_entries=10_000, max_bytes=64 * 1024)
    store = driver.make(budget)
    for i in range(200):
        await driver.put(store, "acme", f"id-{i}", 4096)
    kept = [i for i in range(200) if await driver.seen(store, "acme", f"id-{i}")]
    assert store.bytes <= budget.max_bytes
    assert 0 < len(kept) * 4096 <= budget.max_bytes
    assert kept[-1] == 199


@pytest.mark.parametrize("kind", list(MEMORY), ids=name_of)
async def test_memory_store_refuses_an_entry_over_its_byte_bound(kind: type) -> None:
    """An entry larger than max_bytes alone is refused with EntryTooLarge; the store stays within its bound."""
    driver = MEMORY[kind]
    budget = Budget(max_entries=100, max_bytes=16 * 1024)
    store = driver.make(budget)
    await driver.put(store, "acme", "small", 10)
    with pytest.raises(EntryTooLarge, match="max_bytes"):
        await driver.put(store, "acme", "huge", 32 * 1024)
    assert store.bytes <= budget.max_bytes
    assert await driver.seen(store, "acme", "small")


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.Redis.from_url(redis_url, socket_timeout=2.0)
    yield client
    await client.aclose()


@pytest.mark.parametrize("kind", list(REDIS), ids=name_of)
async def test_redis_store_keeps_tenants_apart(kind: type, redis_client: Any) -> None:
    """On the real Redis too, tenant B never sees tenant A's entry for the same id."""
    driver = REDIS[kind]
    store = driver.make(redis_client, MIB)
    await driver.put(store, "acme", "same", 10)
    assert await driver.seen(store, "acme", "same")
    assert not await driver.seen(store, "globex", "same")
    await store.aclose()


@pytest.mark.parametrize("kind", list(REDIS), ids=name_of)
async def test_redis_store_refuses_a_value_over_its_byte_bound(kind: type, redis_client: Any) -> None:
    """A value longer than max_value_bytes is refused with EntryTooLarge, and nothing of it is readable."""
    driver = REDIS[kind]
    store = driver.make(redis_client, 16 * 1024)
    with pytest.raises(EntryTooLarge, match="max_value_bytes"):
        await driver.put(store, "acme", "huge", 32 * 1024)
    assert not await driver.seen(store, "acme", "huge")
    await store.aclose()


async def test_redis_keys_lead_with_the_tenant(redis_client: Any) -> None:
    """A Redis entry's key is the prefix, then the tenant (ScopedKey's one encoding); besides, only the dataset's
    epoch marker."""
    prefix = fresh_prefix()
    store = RedisDedupStore(redis_client, prefix=prefix)
    await dedup_put(store, "acme", "k", 10)
    keys = [key.decode() for key in await redis_client.keys(f"{prefix}*")]
    assert keys.count(f"{prefix}dedup:epoch") == 1
    keys.remove(f"{prefix}dedup:epoch")
    assert keys == [f"{prefix}{dedup_key('acme', 'k').encode()}"] and keys[0].startswith(f"{prefix}acme{SEP}")
    await store.aclose()


def test_a_key_cannot_be_built_without_a_tenant() -> None:
    """ScopedKey refuses an empty or missing tenant; a request without one is the named default tenant's."""
    with pytest.raises(ConfigError, match="tenant"):
        ScopedKey("", "session", "s1")
    with pytest.raises(ConfigError, match="tenant"):
        ScopedKey(None, "session", "s1")  # type: ignore[arg-type]
    assert ScopedKey.of(None, "session", "s1").tenant == DEFAULT_TENANT
    key = ScopedKey("acme", "dedup", f"cap{SEP}k")
    assert ScopedKey.decode(key.encode()) == key


def test_json_size_counts_a_model_as_its_json() -> None:
    """The size estimate of a response is the length of its JSON dump."""
    assert json_size(answer(100)) == len(answer(100).model_dump_json())


async def test_a_response_too_large_to_replay_leaves_its_key_unknown(redis_client: Any) -> None:
    """A keyed call ran but its response is over the bound: the key stays unknown, never free to run again."""
    for store in (
        MemoryDedupStore(budget=Budget(max_entries=10, max_bytes=4096), clock=FakeClock()),
        RedisDedupStore(redis_client, prefix=fresh_prefix(), max_value_bytes=4096),
    ):
        key = dedup_key("acme", "order-1")
        assert (await store.begin(key, "h", 300)).state == "new"
        with pytest.raises(EntryTooLarge):
            await store.complete(key, answer(8192))
        assert (await store.begin(key, "h", 300)).state == "unknown"
        await store.aclose()


def test_a_redis_url_sets_the_value_bound(redis_url: str) -> None:
    """?max_value_bytes= in a store URL bounds that store's values; a bad one is a ConfigError naming it."""
    store = open_store(f"{redis_url}?max_value_bytes=1000")
    assert isinstance(store, RedisDedupStore) and store.max_value_bytes == 1000
    with pytest.raises(ConfigError, match="max_value_bytes"):
        open_store(f"{redis_url}?max_value_bytes=0")


def test_one_tenants_flood_pushes_out_its_own_entries_never_anothers() -> None:
    """Past the byte bound the heaviest tenant pays: beta's one record outlives acme's flood (new finding of the
    hostile re-test: a shared LRU let acme's 0.9 MB replies evict beta's key, and beta's retry ran again)."""
    evicted: list[ScopedKey] = []
    budget = Budget(max_entries=1_000, max_bytes=10_000)
    table: LruTable[str] = LruTable(budget, "dedup", lambda key, _value: evicted.append(key))
    beta = ScopedKey("beta", "dedup", "charge-1")
    table.put(beta, "x" * 400)
    for n in range(200):
        table.put(ScopedKey("acme", "dedup", f"k{n}"), "y" * 400)
        assert table.bytes <= 10_000
    assert table.get(beta) == "x" * 400
    assert evicted and {key.tenant for key in evicted} == {"acme"}


def test_past_the_entry_bound_the_tenant_with_most_entries_pays() -> None:
    """The entry bound evicts from the tenant holding the most entries, its least recently used first."""
    table: LruTable[int] = LruTable(Budget(max_entries=4, max_bytes=1 << 20), "session")
    table.put(ScopedKey("beta", "session", "b0"), 0)
    for n in range(3):
        table.put(ScopedKey("acme", "session", f"a{n}"), n)
    table.get(ScopedKey("acme", "session", "a0"))  # a0 used again: a1 is acme's oldest now
    table.put(ScopedKey("acme", "session", "a3"), 3)
    assert ScopedKey("beta", "session", "b0") in table
    assert ScopedKey("acme", "session", "a1") not in table
    assert [key.id for key in table] == ["b0", "a2", "a0", "a3"]
    table.pop(ScopedKey("beta", "session", "b0"))
    assert table.bytes == sum(len("acme") + len("session") + len(k) + 2 + 1 for k in ("a2", "a0", "a3"))
