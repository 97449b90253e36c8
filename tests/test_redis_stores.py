"""The Redis stores: dedup (the shared conformance suite), session liveness, snapshots, outages and restarts.

Unit behaviour runs on fakeredis (with Lua) and again on the real test Redis;
cross-process behaviour uses two stores with separate clients on the real one.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis
from dedup_store_conformance import DedupStoreConformance, K, StoreFactory, answer, key
from faultproxy import FaultProxy
from servers import Server, free_port

from reach_plugins import AgentDescriptor, ReachClient
from reach_plugins.errors import BackendUnavailable, ConfigError, InvalidPayload, SessionClosed
from reach_plugins.registry import MemoryRegistry
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.stores.redis import connect
from reach_plugins.stores.redis_dedup import RedisDedupStore
from reach_plugins.stores.redis_sessions import RedisSessions
from reach_plugins.stores.redis_snapshots import RedisSnapshotStore
from reach_plugins.stores.sessions import SessionStore, session_key
from reach_plugins.stores.urls import open_sessions, open_store
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import MockTransport

S1 = session_key(None, "s-1")
"""Conversation ``s-1`` of a request that names no tenant."""
OUTAGE_BOUND = 2.0
"""Seconds an operation may take to notice a dead Redis (socket timeout 0.5 s, one quick retry)."""


def fresh_prefix() -> str:
    return f"reach-test:{uuid.uuid4().hex}:"


@pytest.fixture(params=["fakeredis", "redis"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A Redis client: fakeredis (Lua enabled), or the real test server."""
    if request.param == "fakeredis":
        opened: Any = fakeredis.FakeAsyncRedis()
    else:
        opened = aioredis.Redis.from_url(request.getfixturevalue("redis_url"), socket_timeout=2.0)
    yield opened
    await opened.aclose()


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[Callable[[], Any]]:
    """A factory of independent clients to the real Redis, one per simulated process."""
    opened: list[Any] = []

    def make() -> Any:
        opened.append(aioredis.Redis.from_url(redis_url, socket_timeout=2.0))
        return opened[-1]

    yield make
    for each in opened:
        await each.aclose()


def dead_redis() -> Any:
    """A client (with the stores' default timeouts) for a port nobody listens on."""
    return connect(f"redis://127.0.0.1:{free_port()}/0")[0]


async def until_true(check: Callable[[], bool], timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def subscribed(redis: Any, prefix: str) -> None:
    """Wait until some process listens for settled claims under ``prefix`` (a waiter is in place)."""
    async with asyncio.timeout(1.0):
        while dict(await redis.pubsub_numsub(f"{prefix}dedup:settled")).get(f"{prefix}dedup:settled".encode(), 0) < 1:
            await asyncio.sleep(0.01)


# ---------------------------------------------------------------------- dedup


class TestRedisDedupStore(DedupStoreConformance):
    """RedisDedupStore passes the same suite as the in-memory store, on fakeredis and on Redis."""

    @pytest.fixture
    async def make_store(self, client: Any) -> AsyncIterator[StoreFactory]:
        stores: list[RedisDedupStore] = []

        def make(clock: FakeClock) -> RedisDedupStore:
            stores.append(RedisDedupStore(client, prefix=fresh_prefix(), clock=clock))
            return stores[-1]

        yield make
        for store in stores:
            await store.aclose()


async def test_waiter_in_another_process_gets_the_result(clients: Callable[[], Any]) -> None:
    """A duplicate waiting in a second process is woken by pub/sub when the first process completes."""
    shared = fresh_prefix()
    first, second = RedisDedupStore(clients(), prefix=shared), RedisDedupStore(clients(), prefix=shared)
    assert (await first.begin(K, "h", 60)).state == "new"
    assert (await second.begin(K, "h", 60)).state == "inflight"
    waiter = asyncio.create_task(second.wait(K, 5))
    await subscribed(first.redis, shared)
    started = time.monotonic()
    await first.complete(K, answer({"ticket": 9}))
    result = await waiter
    assert result is not None and result.data == {"ticket": 9}
    assert time.monotonic() - started < 1.0
    await first.aclose()
    await second.aclose()


async def test_remote_failure_wakes_waiter_with_none(clients: Callable[[], Any]) -> None:
    """When the owning process fails, the other process's waiter gets None and may claim the key."""
    shared = fresh_prefix()
    first, second = RedisDedupStore(clients(), prefix=shared), RedisDedupStore(clients(), prefix=shared)
    await first.begin(K, "h", 60)
    waiter = asyncio.create_task(second.wait(K, 5))
    await subscribed(first.redis, shared)
    await first.fail(K)
    assert await waiter is None
    assert (await second.begin(K, "h", 60)).state == "new"
    await first.aclose()
    await second.aclose()


async def test_late_owner_cannot_overwrite_a_newer_claim(client: Any) -> None:
    """An owner whose claim expired cannot complete or fail the claim another process took since."""
    clock, shared = FakeClock(), fresh_prefix()
    late, newer = (
        RedisDedupStore(client, prefix=shared, clock=clock),
        RedisDedupStore(client, prefix=shared, clock=clock),
    )
    await late.begin(K, "h", 30)
    clock.advance(31)
    assert (await newer.begin(K, "h", 30)).state == "new"
    await late.complete(K, answer("stale"))
    await late.fail(K)
    assert (await newer.begin(K, "h", 30)).state == "inflight"
    await newer.complete(K, answer("fresh"))
    done = await late.begin(K, "h", 30)
    assert done.result is not None and done.result.data == "fresh"


async def test_dedup_fails_closed_when_redis_is_down() -> None:
    """By default a keyed call is refused (BackendUnavailable) when Redis is unreachable, within the bound."""
    store = RedisDedupStore(dead_redis())
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="fails closed"):
        await store.begin(key("wo-7", tenant="tenant"), "h", 60)
    assert time.monotonic() - started < OUTAGE_BOUND
    await store.aclose()


async def test_dedup_fails_open_on_request(caplog: pytest.LogCaptureFixture) -> None:
    """With on_outage='open' the call runs unguarded, with a warning; complete/fail/wait never raise."""
    store = RedisDedupStore(dead_redis(), on_outage="open")
    with caplog.at_level(logging.WARNING):
        assert (await store.begin(K, "h", 60)).state == "new"
        await store.complete(K, answer())
        await store.fail(K)
        assert await store.wait(K, 1) is None
    assert "without dedup" in caplog.text
    await store.aclose()


async def test_dead_link_is_noticed_within_the_bound(redis_url: str) -> None:
    """A Redis that stops answering (blackholed link) fails a claim in about a second, not redis-py's ~10 s."""
    host, port = redis_url.removeprefix("redis://").split("/")[0].split(":")
    async with FaultProxy((host, int(port))) as proxy:
        store = open_store(f"redis://127.0.0.1:{proxy.port}/0?prefix={fresh_prefix()}")
        assert isinstance(store, RedisDedupStore)
        assert (await store.begin(K, "h", 60)).state == "new"
        proxy.mode = "blackhole"
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await store.begin(key("k2"), "h", 60)
        assert time.monotonic() - started < OUTAGE_BOUND
        await store.aclose()


@pytest.mark.parametrize("crash", [False, True], ids=["restart", "crash"])
async def test_stored_result_survives_redis_restart(private_redis: Server, crash: bool) -> None:
    """A result acknowledged before Redis restarts, or is killed, is returned after (append-only file, fsync always)."""
    store = open_store(f"redis://127.0.0.1:{private_redis.port}/0")
    assert isinstance(store, RedisDedupStore)
    await store.begin(K, "h", 300)
    await store.complete(K, answer("kept"))
    private_redis.restart(crash=crash)
    done = await store.begin(K, "h", 300)
    assert done.state == "done" and done.result is not None and done.result.data == "kept"
    assert (await store.begin(key("other"), "h", 300)).state == "new"
    await store.aclose()


# ---------------------------------------------------------------------- sessions


@pytest.fixture
async def sessions(client: Any) -> AsyncIterator[tuple[RedisSessions, FakeClock]]:
    clock = FakeClock()
    store = RedisSessions(client, ttl=60, prefix=fresh_prefix(), clock=clock.now)
    yield store, clock
    await store.aclose()


async def test_sessions_satisfy_the_protocol(sessions: tuple[RedisSessions, FakeClock]) -> None:
    """RedisSessions is a SessionStore."""
    assert isinstance(sessions[0], SessionStore)


async def test_session_lives_while_touched_and_expires_after_ttl(sessions: tuple[RedisSessions, FakeClock]) -> None:
    """A checked session stays alive while touched within the TTL and is refused once the TTL passes."""
    store, clock = sessions
    await store.check(S1)
    clock.advance(50)
    await store.touch(S1)
    clock.advance(50)
    assert await store.is_alive(S1)
    clock.advance(11)
    assert not await store.is_alive(S1)
    with pytest.raises(SessionClosed, match="expired after 60s"):
        await store.check(S1)


async def test_closed_session_is_refused_until_reopened(sessions: tuple[RedisSessions, FakeClock]) -> None:
    """close() makes every check raise SessionClosed; open() starts the conversation again."""
    store, _ = sessions
    await store.open(S1)
    await store.close(S1)
    assert not await store.is_alive(S1)
    with pytest.raises(SessionClosed, match="was closed"):
        await store.check(S1)
    await store.open(S1)
    await store.check(S1)
    assert await store.is_alive(S1)


async def test_close_in_one_process_cancels_calls_in_another(clients: Callable[[], Any]) -> None:
    """A guarded call in process B ends with SessionClosed when process A closes the session; listeners hear once."""
    shared = fresh_prefix()
    here, there = RedisSessions(clients(), prefix=shared), RedisSessions(clients(), prefix=shared)
    heard_here: list[ScopedKey] = []
    heard_there: list[ScopedKey] = []
    here.on_close(heard_here.append)
    there.on_close(heard_there.append)
    await there.check(S1)
    entered = asyncio.Event()

    async def call() -> None:
        async with there.guard(S1):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(call())
    await entered.wait()
    started = time.monotonic()
    await here.close(S1)
    with pytest.raises(SessionClosed, match="closed while the call was in flight"):
        await asyncio.wait_for(task, 2.0)
    assert time.monotonic() - started < 1.0
    await until_true(lambda: heard_there == [S1], 1.0)
    assert heard_here == [S1]
    await here.aclose()
    await there.aclose()


async def test_sessions_fail_open_when_redis_is_down(caplog: pytest.LogCaptureFixture) -> None:
    """By default checks pass (one warning) while Redis is down; close cancels local calls, then raises."""
    store = RedisSessions(dead_redis())
    with caplog.at_level(logging.WARNING):
        await store.check(S1)
        await store.touch(S1)
        assert await store.is_alive(S1)
    assert caplog.text.count("letting calls through") == 1
    entered = asyncio.Event()

    async def call() -> None:
        async with store.guard(S1):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(call())
    await entered.wait()
    with pytest.raises(BackendUnavailable, match="reached only this process"):
        await store.close(S1)
    with pytest.raises(SessionClosed):
        await task
    await store.aclose()


async def test_sessions_fail_closed_on_request() -> None:
    """With on_outage='closed' a check raises BackendUnavailable while Redis is down, within the bound."""
    store = RedisSessions(dead_redis(), on_outage="closed")
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match="sessions fail closed"):
        await store.check(S1)
    assert time.monotonic() - started < OUTAGE_BOUND
    await store.aclose()


# ---------------------------------------------------------------------- snapshots


async def test_snapshots_round_trip_and_merge_instances(client: Any) -> None:
    """Two instances of one agent save their own conversations; a restart loads both."""
    shared = fresh_prefix()
    first, second = RedisSnapshotStore(client, prefix=shared), RedisSnapshotStore(client, prefix=shared)
    await first.save("orders", {"s-1": {"step": 1, "cart": ["a"]}})
    await second.save("orders", {"s-2": {"step": 4}})
    await first.save("tickets", {"s-9": {"open": True}})
    assert await first.load("orders") == {"s-1": {"step": 1, "cart": ["a"]}, "s-2": {"step": 4}}
    assert await second.load("billing") == {}


async def test_snapshots_expire_after_ttl(client: Any) -> None:
    """A conversation's state is dropped ttl seconds after its last save; a newer save keeps it."""
    clock = FakeClock()
    store = RedisSnapshotStore(client, ttl=100, prefix=fresh_prefix(), clock=clock.now)
    await store.save("orders", {"old": {"n": 1}, "kept": {"n": 2}})
    clock.advance(60)
    await store.save("orders", {"kept": {"n": 3}})
    clock.advance(50)
    assert await store.load("orders") == {"kept": {"n": 3}}


async def test_snapshot_state_must_be_json(client: Any) -> None:
    """State that is not JSON is an InvalidPayload naming the conversation."""
    store = RedisSnapshotStore(client, prefix=fresh_prefix())
    with pytest.raises(InvalidPayload, match="'s-1'"):
        await store.save("orders", {"s-1": {"when": object()}})


async def test_snapshots_when_redis_is_down(caplog: pytest.LogCaptureFixture) -> None:
    """Saving raises BackendUnavailable; loading starts empty with a warning."""
    store = RedisSnapshotStore(dead_redis())
    with pytest.raises(BackendUnavailable, match="were not saved"):
        await store.save("orders", {"s-1": {"n": 1}})
    with caplog.at_level(logging.WARNING):
        assert await store.load("orders") == {}
    assert "starts without its saved sessions" in caplog.text


# ---------------------------------------------------------------------- URLs


async def test_urls_open_redis_stores(redis_url: str) -> None:
    """redis:// URLs open the Redis stores with their options; memory:// keeps the in-process ones."""
    store = open_store(f"{redis_url}?on_outage=open&prefix={fresh_prefix()}")
    assert isinstance(store, RedisDedupStore) and store.on_outage == "open"
    live = open_sessions(f"{redis_url}?ttl=90")
    assert isinstance(live, RedisSessions) and (live.ttl, live.on_outage) == (90.0, "open")
    assert not isinstance(open_sessions("memory://"), RedisSessions)
    await store.aclose()
    await live.aclose()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:6379/0?ttl=5", "unknown option ttl"),
        ("redis://127.0.0.1:6379/0?on_outage=maybe", "on_outage must be 'open' or 'closed'"),
        ("redis://127.0.0.1:6379/zero", "db are integers"),
        ("mongodb://127.0.0.1", "supported: memory://, redis://"),
    ],
)
def test_bad_store_urls_name_the_fix(url: str, message: str) -> None:
    """A malformed store URL is a ConfigError that says what to write."""
    with pytest.raises(ConfigError, match=message):
        open_store(url)


async def test_clients_share_redis_sessions(redis_url: str) -> None:
    """Two ReachClients on one sessions URL: a close through one stops the conversation in the other."""
    registry = MemoryRegistry()
    orders = {"name": "orders", "endpoints": ["http://o.test"], "capabilities": ["query_order"]}
    await registry.register_agent(AgentDescriptor.model_validate(orders))
    url = f"{redis_url}?prefix={fresh_prefix()}"
    first = ReachClient(registry=registry, transport=MockTransport(lambda call: {"ok": True}), sessions=url)
    second = ReachClient(registry=registry, transport=MockTransport(lambda call: {"ok": True}), sessions=url)
    assert (await first.reach("query_order", {}, session_id="s-1")).ok
    assert first.sessions is not None and second.sessions is not None
    await second.sessions.close(S1)
    with pytest.raises(SessionClosed):
        await first.reach("query_order", {}, session_id="s-1")
    for client in (first, second):
        await client.aclose()
        assert isinstance(client.sessions, RedisSessions)
        await client.sessions.aclose()
