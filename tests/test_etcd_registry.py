"""EtcdRegistry against a real etcd: the conformance suite, leases, watch propagation, restarts and compaction."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

import aetcd
import pytest
from registry_conformance import FakeClock, RegistryConformance, RegistryFactory, agent, next_events, tracked
from servers import Server, free_port

from reach_plugins.errors import BackendUnavailable, ConfigError, RequestError
from reach_plugins.model import Instance
from reach_plugins.registry import Registry, RegistryEvent, open_registry
from reach_plugins.registry.etcd import EtcdRegistry

LEASE_TTL = 2
"""etcd's minimum lease TTL: the fastest a dead process can leave routing."""


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests sharing one etcd never see each other."""
    return f"/reach-test/{uuid.uuid4().hex}/"


@pytest.fixture
async def raw(etcd_url: str, prefix: str) -> AsyncIterator[aetcd.Client]:
    """A plain aetcd client on the shared etcd; deletes this test's keys afterwards."""
    host, port = address(etcd_url)
    async with aetcd.Client(host, port, timeout=5) as client:
        yield client
        await client.delete_prefix(prefix.encode())


@pytest.fixture
def open_etcd(etcd_url: str, prefix: str) -> RegistryFactory:
    """Open a registry on this test's prefix through ``open_registry`` (URL form)."""

    async def make(clock: FakeClock) -> Registry:
        registry = open_registry(f"{etcd_url}{prefix}", clock=clock)
        assert isinstance(registry, EtcdRegistry)
        await registry.start()
        return registry

    return make


class TestEtcdRegistry(RegistryConformance):
    """EtcdRegistry passes the Registry conformance suite unchanged."""

    @pytest.fixture
    def make_registry(self, open_etcd: RegistryFactory, raw: aetcd.Client) -> RegistryFactory:
        return open_etcd


async def until(stream: AsyncIterator[RegistryEvent], kind: str, timeout: float) -> RegistryEvent:
    """The first event of ``kind`` on ``stream``, failing after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        async for event in stream:
            if event.kind == kind:
                return event
    raise AssertionError(f"watch ended before a {kind} event")


async def put_dead_instance(client: aetcd.Client, prefix: str, instance: Instance) -> None:
    """Write an instance the way a registry does, on a lease nobody keeps alive (a process that died)."""
    lease = await client.lease(LEASE_TTL)
    key = f"{prefix}instances/{instance.agent}/{instance.instance_id}".encode()
    await client.put(key, instance.model_dump_json().encode(), lease=lease.id)


async def test_open_registry_loads_current_state_synchronously(
    open_etcd: RegistryFactory, etcd_url: str, prefix: str, raw: aetcd.Client
) -> None:
    """A registry opened by URL already holds every agent and instance before anything is awaited."""
    clock = FakeClock()
    writer = await open_etcd(clock)
    await writer.register_agent(agent("orders", "query_order"))
    await writer.register_instance(tracked("orders", "o-1", clock))
    reader = open_registry(f"{etcd_url}{prefix}")
    try:
        assert list(reader.instances("orders")) == ["o-1"]
        assert reader.agents()["orders"].name == "orders"
    finally:
        await reader.aclose()
        await writer.aclose()


async def test_change_in_one_registry_reaches_another(open_etcd: RegistryFactory, raw: aetcd.Client) -> None:
    """An instance registered through one registry shows up in a second one's view and watch."""
    clock = FakeClock()
    writer, reader = await open_etcd(clock), await open_etcd(clock)
    stream = reader.watch()
    await writer.register_agent(agent("orders", "query_order"))
    await writer.register_instance(tracked("orders", "o-1", clock))
    event = await until(stream, "instance_put", 2.0)
    assert (event.agent, event.instance_id) == ("orders", "o-1")
    assert reader.is_alive(reader.instances("orders")["o-1"], clock())
    await writer.heartbeat("orders", "o-1", 1, load=0.7)
    await until_true(lambda: reader.instances("orders")["o-1"].load == 0.7, 2.0)
    await writer.aclose()
    await reader.aclose()


async def until_true(check: object, timeout: float) -> None:
    """Poll ``check()`` on the event loop until it holds, failing after ``timeout`` seconds."""
    assert callable(check)
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_expired_lease_removes_instance(open_etcd: RegistryFactory, raw: aetcd.Client, prefix: str) -> None:
    """An instance whose lease is not kept alive is deleted within the TTL, with an instance_deleted event."""
    clock = FakeClock()
    registry = await open_etcd(clock)
    await registry.register_agent(agent("orders", "query_order"))
    stream = registry.watch()
    started = time.monotonic()
    await put_dead_instance(raw, prefix, tracked("orders", "ghost", clock))
    assert (await until(stream, "instance_put", 2.0)).instance_id == "ghost"
    gone = await until(stream, "instance_deleted", LEASE_TTL + 2.0)
    assert gone.instance_id == "ghost"
    assert time.monotonic() - started < LEASE_TTL + 1.5
    assert "ghost" not in registry.instances("orders")
    await registry.aclose()


async def test_keepalive_holds_instances_past_the_ttl(etcd_url: str, prefix: str, raw: aetcd.Client) -> None:
    """A live registry keeps its lease alive (every TTL/3), so its instance outlives the lease TTL."""
    clock = FakeClock()
    registry = EtcdRegistry(*address(etcd_url), prefix=prefix, lease_ttl=LEASE_TTL, clock=clock)
    await registry.register_agent(agent("orders", "query_order"))
    await registry.register_instance(tracked("orders", "o-1", clock))
    found = await raw.get(f"{prefix}instances/orders/o-1".encode())
    assert found is not None and found.lease != 0
    deadline = time.monotonic() + LEASE_TTL * 1.5
    while time.monotonic() < deadline:
        info = await raw.get_lease_info(found.lease)
        assert info.TTL > 0, "the lease expired although the registry is alive"
        await asyncio.sleep(0.1)
    assert "o-1" in registry.instances("orders")
    await registry.aclose()


async def test_aclose_revokes_the_lease_at_once(open_etcd: RegistryFactory, raw: aetcd.Client) -> None:
    """Closing a registry removes its instances for everyone right away, not after the TTL."""
    clock = FakeClock()
    owner, other = await open_etcd(clock), await open_etcd(clock)
    await owner.register_agent(agent("orders", "query_order"))
    await owner.register_instance(tracked("orders", "o-1", clock))
    stream = other.watch()
    await owner.aclose()
    assert (await until(stream, "instance_deleted", 1.0)).instance_id == "o-1"
    assert "orders" in other.agents()
    await other.aclose()


async def test_instance_refused_when_agent_deleted_elsewhere(open_etcd: RegistryFactory, raw: aetcd.Client) -> None:
    """Registering an instance of an agent another process just deregistered is refused."""
    clock = FakeClock()
    first, second = await open_etcd(clock), await open_etcd(clock)
    await first.register_agent(agent("orders", "query_order"))
    await until_true(lambda: "orders" in second.agents(), 2.0)
    await first.deregister_agent("orders")
    with pytest.raises(RequestError, match="register the agent first"):
        await second.register_instance(tracked("orders", "o-1", clock))
    await first.aclose()
    await second.aclose()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("etcd://", "etcd://HOST:PORT"),
        ("etcd://127.0.0.1:2379?ttl=3", "unknown option ttl"),
        ("etcd://127.0.0.1:2379?lease_ttl=1", "lease_ttl must be whole seconds >= 2"),
        ("etcd://127.0.0.1:2379?lease_ttl=soon", "lease_ttl are integers"),
    ],
)
def test_bad_urls_name_the_fix(url: str, message: str) -> None:
    """A malformed etcd URL is a ConfigError saying what to write, before any connection."""
    with pytest.raises(ConfigError, match=message):
        open_registry(url)


def test_unreachable_etcd_is_backend_unavailable() -> None:
    """Opening an etcd URL nobody answers fails within the timeout, naming the address."""
    port = free_port()
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match=f"127.0.0.1:{port}"):
        open_registry(f"etcd://127.0.0.1:{port}?timeout=0.5")
    assert time.monotonic() - started < 3.0


async def test_watch_resumes_after_etcd_restart(private_etcd: Server, caplog: pytest.LogCaptureFixture) -> None:
    """After etcd restarts the watch resumes: new agents arrive and a dead process's instance leaves."""
    caplog.set_level(logging.INFO, "reach_plugins.registry.etcd")
    url = f"etcd://127.0.0.1:{private_etcd.port}/reach/"
    clock = FakeClock()
    reader = open_registry(url, clock=clock)
    writer = open_registry(url, clock=clock)
    await writer.register_agent(agent("orders", "query_order"))
    async with aetcd.Client("127.0.0.1", private_etcd.port, timeout=5) as raw_client:
        await put_dead_instance(raw_client, "/reach/", tracked("orders", "ghost", clock))
    stream = reader.watch()
    assert (await until(stream, "instance_put", 2.0)).instance_id == "ghost"
    private_etcd.restart()
    await writer.register_agent(agent("tickets", "create_ticket"))
    assert (await until(stream, "agent_put", 5.0)).agent == "tickets"
    gone = await until(stream, "instance_deleted", LEASE_TTL + 5.0)
    assert gone.instance_id == "ghost"
    assert dict(reader.instances("orders")) == {}
    assert "watch at" in caplog.text and "lost" in caplog.text and "relisting" not in caplog.text
    await writer.aclose()
    await reader.aclose()


async def test_compacted_history_is_relisted(private_etcd: Server, caplog: pytest.LogCaptureFixture) -> None:
    """A registry whose revision was compacted away relists and reports the difference as events."""
    caplog.set_level(logging.INFO, "reach_plugins.registry.etcd")
    url = f"etcd://127.0.0.1:{private_etcd.port}/reach/"
    clock = FakeClock()
    writer = open_registry(url, clock=clock)
    await writer.register_agent(agent("early", "query_order"))
    late = open_registry(url, clock=clock)
    await writer.register_agent(agent("later", "create_ticket"))
    await writer.deregister_agent("early")
    async with aetcd.Client("127.0.0.1", private_etcd.port, timeout=5) as raw_client:
        current = await raw_client.put(b"/unrelated", b"x")
        await raw_client.compact(current.header.revision)
    stream = late.watch()
    events = await next_events(stream, 2)
    assert {(e.kind, e.agent) for e in events} == {("agent_deleted", "early"), ("agent_put", "later")}
    assert set(late.agents()) == {"later"}
    assert "compacted" in caplog.text
    await writer.aclose()
    await late.aclose()


async def test_etcd_that_lost_its_data_is_relisted(private_etcd: Server) -> None:
    """An etcd that comes back empty (older revision than seen) makes the registry drop what is gone."""
    url = f"etcd://127.0.0.1:{private_etcd.port}/reach/"
    clock = FakeClock()
    reader = open_registry(url, clock=clock)
    writer = open_registry(url, clock=clock)
    for name in ("orders", "tickets", "billing"):
        await writer.register_agent(agent(name, "query_order"))
    stream = reader.watch()
    await until_true(lambda: len(reader.agents()) == 3, 2.0)
    await writer.aclose()
    private_etcd.restart(wipe=True)
    assert {(await until(stream, "agent_deleted", 5.0)).agent for _ in range(3)} == {"orders", "tickets", "billing"}
    assert dict(reader.agents()) == {}
    await reader.aclose()


@pytest.mark.parametrize("skew", [-300.0, 300.0])
async def test_heartbeat_age_is_counted_by_the_reader_not_the_writers_clock(
    open_etcd: RegistryFactory, skew: float
) -> None:
    """A writer whose clock is 300 s behind or ahead: its heartbeats count from when the reader saw them (alive at
    once, down after the 30 s grace without one, alive again at the next), never from the writer's stamp."""
    clock, skewed = FakeClock(), FakeClock()
    skewed.now = clock.now + skew
    writer, reader = await open_etcd(skewed), await open_etcd(clock)
    await writer.register_agent(agent("orders", "query_order"))
    await writer.register_instance(tracked("orders", "o-1", skewed, endpoint="http://127.0.0.1:9"))
    await until_true(lambda: "o-1" in reader.instances("orders"), 5.0)
    assert reader.is_alive(reader.instances("orders")["o-1"], clock.now)
    clock.advance(29)
    await writer.heartbeat("orders", "o-1", 1)
    await until_true(lambda: reader.instances("orders")["o-1"].heartbeat_seq == 1, 5.0)
    clock.advance(29)
    assert reader.is_alive(reader.instances("orders")["o-1"], clock.now)
    clock.advance(2)
    assert not reader.is_alive(reader.instances("orders")["o-1"], clock.now)
    await writer.aclose()
    await reader.aclose()


async def test_a_revoked_lease_is_replaced_and_its_instances_written_again(
    open_etcd: RegistryFactory, raw: aetcd.Client, prefix: str
) -> None:
    """etcd revoking a live process's lease (as on resuming from a hang longer than the TTL) deletes its instance
    keys; the process writes them again at once under a new lease. A key deleted while the lease lives stays gone."""
    clock = FakeClock()
    writer = await open_etcd(clock)
    await writer.register_agent(agent("orders", "query_order"))
    for instance_id in ("o-1", "o-2"):
        await writer.register_instance(tracked("orders", instance_id, clock, endpoint="http://127.0.0.1:9"))
    keys = {i: f"{prefix}instances/orders/{i}".encode() for i in ("o-1", "o-2")}
    first = await raw.get(keys["o-1"])
    assert first is not None and first.lease
    await raw.revoke_lease(first.lease)

    async def rewritten() -> bool:
        found = [await raw.get(key) for key in keys.values()]
        return all(kv is not None and kv.lease not in (0, first.lease) for kv in found)

    await until_async(rewritten, 5.0)
    await raw.delete(keys["o-2"])
    await until_true(lambda: "o-2" not in writer.instances("orders"), 5.0)
    restoring = writer._lease._restoring
    assert restoring is not None
    await restoring
    assert await raw.get(keys["o-2"]) is None
    assert set(writer.instances("orders")) == {"o-1"}
    await writer.aclose()


async def until_async(check: Callable[[], Awaitable[bool]], timeout: float) -> None:
    """Await ``check()`` until it holds, failing after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.01)
