"""The conformance suite every Registry backend passes (memory, file, and etcd in a later issue).

Use it by subclassing :class:`RegistryConformance` in a ``test_*.py`` module and
providing a ``make_registry`` fixture: an async factory taking a
:class:`FakeClock` and returning an empty, ready :class:`Registry`. The suite
talks to the backend only through the Registry protocol, judges liveness with
the fake clock (it never sleeps) and waits for watch events with a timeout
(an etcd backend delivers them asynchronously).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from reach_plugins.config.loader import TenantConfig
from reach_plugins.errors import ConfigError, RequestError
from reach_plugins.model import AgentDescriptor, HealthCheck, Instance
from reach_plugins.registry import Registry, RegistryEvent

START = 1_000_000.0
EVENT_TIMEOUT = 2.0


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


RegistryFactory = Callable[[FakeClock], Awaitable[Registry]]


def agent(name: str, *capabilities: str, endpoints: int = 0, **fields: object) -> AgentDescriptor:
    """A descriptor with ``endpoints`` static instances at distinct fake URLs."""
    return AgentDescriptor.model_validate(
        {
            "name": name,
            "capabilities": list(capabilities),
            "endpoints": [f"http://{name}.test:{8000 + i}" for i in range(endpoints)],
            **fields,
        }
    )


def tracked(agent_name: str, instance_id: str, clock: Callable[[], float], **fields: object) -> Instance:
    """A heartbeat-tracked instance whose last heartbeat is now."""
    return Instance.model_validate(
        {
            "agent": agent_name,
            "instance_id": instance_id,
            "endpoint": f"http://{instance_id}.test",
            "last_heartbeat": clock(),
            **fields,
        }
    )


async def next_events(stream: AsyncIterator[RegistryEvent], count: int) -> list[RegistryEvent]:
    """The next ``count`` events, failing if they do not arrive in time."""
    return [await asyncio.wait_for(anext(stream), EVENT_TIMEOUT) for _ in range(count)]


class RegistryConformance:
    """Behaviour every Registry backend must show."""

    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    async def registry(self, make_registry: RegistryFactory, clock: FakeClock) -> AsyncIterator[Registry]:
        backend = await make_registry(clock)
        yield backend
        await backend.aclose()

    # ------------------------------------------------------------------ agents

    async def test_registered_agent_is_listed_and_fetched(self, registry: Registry) -> None:
        """A registered agent comes back from get(), list() and the synchronous view."""
        orders = agent("orders", "query_order")
        await registry.register_agent(orders)
        assert await registry.get("orders") == orders
        assert [a.name for a in await registry.list()] == ["orders"]
        assert registry.agents()["orders"] == orders

    async def test_says_whether_a_tenant_table_comes_with_it(self, registry: Registry) -> None:
        """The tenants port is part of the contract: a mapping of tenant configs, or None when none comes along."""
        tenants = registry.tenants
        assert tenants is None or all(isinstance(config, TenantConfig) for config in tenants.values())

    async def test_unknown_agent_is_none(self, registry: Registry) -> None:
        """get() of a name nobody registered returns None."""
        assert await registry.get("nobody") is None

    async def test_register_replaces_by_name(self, registry: Registry) -> None:
        """Registering the same name again replaces the descriptor instead of adding one."""
        await registry.register_agent(agent("orders", "query_order"))
        await registry.register_agent(agent("orders", "query_order", "cancel_order"))
        listed = await registry.list()
        assert len(listed) == 1
        assert [c.name for c in listed[0].capabilities] == ["query_order", "cancel_order"]

    async def test_deregister_removes_agent_and_instances(self, registry: Registry) -> None:
        """Deregistering an agent removes it and every instance; an unknown name is a no-op."""
        await registry.register_agent(agent("orders", "query_order", endpoints=2))
        await registry.deregister_agent("orders")
        await registry.deregister_agent("nobody")
        assert await registry.get("orders") is None
        assert dict(registry.instances("orders")) == {}

    async def test_match_by_capability_and_intent(self, registry: Registry) -> None:
        """match() returns offerers of a capability; an intent keeps agents listing it or listing none."""
        await registry.register_agent(agent("refunds", "query_order", intents=["refund"]))
        await registry.register_agent(agent("orders", "query_order"))
        await registry.register_agent(agent("tickets", "create_ticket"))
        assert {a.name for a in await registry.match("query_order")} == {"refunds", "orders"}
        assert {a.name for a in await registry.match("query_order", intent="refund")} == {"refunds", "orders"}
        assert {a.name for a in await registry.match("query_order", intent="track")} == {"orders"}
        assert await registry.match("nothing") == []

    # ------------------------------------------------------------------ instances

    async def test_endpoints_become_static_instances(self, registry: Registry, clock: FakeClock) -> None:
        """Each endpoint is an instance '{name}-{i}' that is alive without heartbeats."""
        await registry.register_agent(agent("orders", "query_order", endpoints=2))
        instances = registry.instances("orders")
        assert sorted(instances) == ["orders-0", "orders-1"]
        assert instances["orders-1"].endpoint == "http://orders.test:8001"
        clock.advance(10_000)
        assert all(registry.is_alive(inst, clock()) for inst in instances.values())

    async def test_static_instance_marked_down_is_not_alive(self, registry: Registry, clock: FakeClock) -> None:
        """A static instance with status 'down' is not alive."""
        down = Instance(agent="orders", instance_id="o-down", endpoint="http://o.test", status="down")
        await registry.register_agent(agent("orders", "query_order", instances=[down]))
        assert not registry.is_alive(registry.instances("orders")["o-down"], clock())

    async def test_descriptor_listing_another_agents_instance_is_refused(self, registry: Registry) -> None:
        """An instance is who it is filed under: agent rogue listing an instance that says agent echo is a
        ConfigError naming both, and nothing is registered (issue 24)."""
        forged = Instance(agent="echo", instance_id="echo-9", endpoint="http://127.0.0.1:9")
        with pytest.raises(ConfigError, match="instance 'echo-9' says agent 'echo'"):
            await registry.register_agent(agent("rogue", "query_order", instances=[forged]))
        assert "rogue" not in registry.agents() and registry.instances("echo") == {}

    async def test_instance_of_unknown_agent_is_refused(self, registry: Registry, clock: FakeClock) -> None:
        """Registering an instance before its agent is a RequestError that says to register the agent."""
        with pytest.raises(RequestError, match="register the agent first"):
            await registry.register_instance(tracked("ghost", "ghost-1", clock))

    async def test_register_and_deregister_instance(self, registry: Registry, clock: FakeClock) -> None:
        """A registered instance appears in the view and disappears when deregistered."""
        await registry.register_agent(agent("orders", "query_order"))
        await registry.register_instance(tracked("orders", "o-1", clock))
        assert list(registry.instances("orders")) == ["o-1"]
        await registry.deregister_instance("orders", "o-1")
        assert dict(registry.instances("orders")) == {}

    async def test_replacing_agent_keeps_registered_instances(self, registry: Registry, clock: FakeClock) -> None:
        """Re-registering an agent keeps heartbeat-tracked instances and re-derives the static ones."""
        await registry.register_agent(agent("orders", "query_order", endpoints=2))
        await registry.register_instance(tracked("orders", "o-live", clock))
        await registry.register_agent(agent("orders", "query_order", endpoints=1))
        assert sorted(registry.instances("orders")) == ["o-live", "orders-0"]

    # ------------------------------------------------------------------ heartbeats and liveness

    async def test_heartbeat_updates_load_status_and_seq(self, registry: Registry, clock: FakeClock) -> None:
        """A heartbeat records its sequence number, time, load and status."""
        await registry.register_agent(agent("orders", "query_order"))
        await registry.register_instance(tracked("orders", "o-1", clock))
        clock.advance(5)
        await registry.heartbeat("orders", "o-1", 1, load=0.4, status="draining")
        inst = registry.instances("orders")["o-1"]
        assert (inst.heartbeat_seq, inst.last_heartbeat, inst.load, inst.status) == (1, clock(), 0.4, "draining")

    async def test_health_moves_when_a_heartbeat_reports_another_status(
        self, registry: Registry, clock: FakeClock
    ) -> None:
        """``health`` (what the router's pools are kept by) moves when an instance reports another status, so a
        pool holding it looks again without polling."""
        await registry.register_agent(agent("orders", "query_order"))
        await registry.register_instance(tracked("orders", "o-1", clock))
        await registry.heartbeat("orders", "o-1", 1, load=0.2)
        before = registry.health
        await registry.heartbeat("orders", "o-1", 2, status="draining")
        assert registry.health > before

    async def test_stale_heartbeat_is_ignored(self, registry: Registry, clock: FakeClock) -> None:
        """A heartbeat whose seq is not above the last one changes nothing."""
        await registry.register_agent(agent("orders", "query_order"))
        await registry.register_instance(tracked("orders", "o-1", clock))
        await registry.heartbeat("orders", "o-1", 7, load=0.1)
        clock.advance(3)
        await registry.heartbeat("orders", "o-1", 7, load=0.9)
        await registry.heartbeat("orders", "o-1", 2, load=0.9)
        inst = registry.instances("orders")["o-1"]
        assert (inst.heartbeat_seq, inst.load, inst.last_heartbeat) == (7, 0.1, clock() - 3)

    async def test_heartbeat_for_unknown_instance_is_refused(self, registry: Registry) -> None:
        """A heartbeat nobody registered is a RequestError telling the instance to register again."""
        await registry.register_agent(agent("orders", "query_order"))
        with pytest.raises(RequestError, match="register the instance again"):
            await registry.heartbeat("orders", "o-9", 1)

    async def test_heartbeat_load_out_of_range_is_refused(self, registry: Registry, clock: FakeClock) -> None:
        """A load outside [0, 1] is a RequestError naming the instance."""
        await registry.register_agent(agent("orders", "query_order"))
        await registry.register_instance(tracked("orders", "o-1", clock))
        with pytest.raises(RequestError, match="orders/o-1"):
            await registry.heartbeat("orders", "o-1", 1, load=1.5)

    async def test_instance_dies_after_missed_heartbeats_and_comes_back(
        self, registry: Registry, clock: FakeClock
    ) -> None:
        """Down after missed_heartbeats x interval without a heartbeat; alive again on the next one."""
        check = HealthCheck(interval=2.0, missed_heartbeats=3)
        await registry.register_agent(agent("orders", "query_order", health_check=check))
        await registry.register_instance(tracked("orders", "o-1", clock))
        clock.advance(6.0)
        assert registry.is_alive(registry.instances("orders")["o-1"], clock())
        clock.advance(0.5)
        assert not registry.is_alive(registry.instances("orders")["o-1"], clock())
        await registry.heartbeat("orders", "o-1", 1)
        assert registry.is_alive(registry.instances("orders")["o-1"], clock())

    async def test_default_health_check_is_three_intervals(self, registry: Registry, clock: FakeClock) -> None:
        """Without a health_check block an instance survives 3 x 10 s of silence, not more."""
        await registry.register_agent(agent("orders", "query_order"))
        await registry.register_instance(tracked("orders", "o-1", clock))
        clock.advance(30.0)
        assert registry.is_alive(registry.instances("orders")["o-1"], clock())
        clock.advance(1.0)
        assert not registry.is_alive(registry.instances("orders")["o-1"], clock())

    # ------------------------------------------------------------------ revision

    async def test_revision_moves_on_changes_not_on_heartbeats(self, registry: Registry, clock: FakeClock) -> None:
        """Agent and instance changes raise the revision; heartbeats leave it alone."""
        start = registry.revision
        await registry.register_agent(agent("orders", "query_order"))
        after_agent = registry.revision
        await registry.register_instance(tracked("orders", "o-1", clock))
        after_instance = registry.revision
        await registry.heartbeat("orders", "o-1", 1, load=0.5, status="draining")
        assert start < after_agent < after_instance == registry.revision
        await registry.deregister_instance("orders", "o-1")
        assert registry.revision > after_instance

    async def test_identical_registration_changes_nothing(self, registry: Registry) -> None:
        """Registering the very same descriptor again keeps the revision."""
        await registry.register_agent(agent("orders", "query_order", endpoints=1))
        before = registry.revision
        await registry.register_agent(agent("orders", "query_order", endpoints=1))
        assert registry.revision == before

    # ------------------------------------------------------------------ watch

    async def test_watch_reports_changes_in_order(self, registry: Registry, clock: FakeClock) -> None:
        """Watch yields agent and instance events in the order the changes happened, revisions growing."""
        stream = registry.watch()
        await registry.register_agent(agent("orders", "query_order", endpoints=1))
        await registry.register_instance(tracked("orders", "o-1", clock))
        await registry.deregister_instance("orders", "o-1")
        await registry.deregister_agent("orders")
        events = await next_events(stream, 6)
        assert [(e.kind, e.agent, e.instance_id) for e in events] == [
            ("agent_put", "orders", None),
            ("instance_put", "orders", "orders-0"),
            ("instance_put", "orders", "o-1"),
            ("instance_deleted", "orders", "o-1"),
            ("instance_deleted", "orders", "orders-0"),
            ("agent_deleted", "orders", None),
        ]
        revisions = [e.revision for e in events]
        assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions)

    async def test_every_watcher_sees_every_event(self, registry: Registry) -> None:
        """Two watch streams each receive the same events."""
        first, second = registry.watch(), registry.watch()
        await registry.register_agent(agent("orders", "query_order"))
        assert [e.kind for e in await next_events(first, 1)] == ["agent_put"]
        assert [e.kind for e in await next_events(second, 1)] == ["agent_put"]

    async def test_watch_starts_at_call_time(self, registry: Registry) -> None:
        """A stream created before a change sees it even if iteration starts later."""
        stream = registry.watch()
        await registry.register_agent(agent("orders", "query_order"))
        await registry.register_agent(agent("tickets", "create_ticket"))
        assert [e.agent for e in await next_events(stream, 2)] == ["orders", "tickets"]

    async def test_aclose_ends_watch_streams(self, make_registry: RegistryFactory, clock: FakeClock) -> None:
        """Closing the registry ends every open watch stream."""
        backend = await make_registry(clock)
        stream = backend.watch()
        await backend.aclose()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(stream), EVENT_TIMEOUT)
