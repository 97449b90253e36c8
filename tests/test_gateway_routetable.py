"""The route table servers route from: a registry snapshot with a short TTL, dropped on watch events."""

from __future__ import annotations

import asyncio

from hop_support import until

from reach_plugins.gateway import RouteTable
from reach_plugins.model import AgentDescriptor, Instance
from reach_plugins.registry import MemoryRegistry
from reach_plugins.registry.routetable import watch_task


class Clock:
    """A fake monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def orders(*endpoints: str) -> AgentDescriptor:
    return AgentDescriptor(name="orders", endpoints=list(endpoints), capabilities=["query_order"])


async def test_snapshot_is_kept_for_the_ttl() -> None:
    """Without a watch, a registry change shows once the TTL has passed, and the registry is read once per TTL."""
    registry = MemoryRegistry()
    await registry.register_agent(orders("http://a"))
    clock = Clock()
    table = RouteTable(registry, ttl=2.0, clock=clock)
    assert list(table.instances("orders")) == ["orders-0"]
    await registry.register_agent(orders("http://a", "http://b"))
    for _ in range(50):
        assert list(table.instances("orders")) == ["orders-0"]
    clock.now = 2.5
    assert list(table.instances("orders")) == ["orders-0", "orders-1"]
    assert table.refreshes == 2


async def test_watch_events_make_changes_visible_at_once() -> None:
    """Following the registry's watch, a change is visible without waiting out the TTL."""
    registry = MemoryRegistry()
    table = RouteTable(registry, ttl=3600.0, clock=Clock())
    assert "orders" not in table.agents()
    task = watch_task(table, registry)
    try:
        await registry.register_agent(orders("http://a"))
        await until(lambda: "orders" in table.agents())
        await registry.deregister_agent("orders")
        await until(lambda: "orders" not in table.agents())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_revision_moves_only_with_the_registry() -> None:
    """A refresh caused by heartbeats keeps the revision, so the router's per-revision caches survive."""
    registry = MemoryRegistry()
    await registry.register_agent(orders())
    await registry.register_instance(Instance(agent="orders", instance_id="i1", endpoint="http://a"))
    clock = Clock()
    table = RouteTable(registry, ttl=1.0, clock=clock)
    first = table.revision
    await registry.heartbeat("orders", "i1", 1, load=0.5)
    clock.now = 5.0
    assert table.revision == first
    assert table.instances("orders")["i1"].load == 0.5
    await registry.register_instance(Instance(agent="orders", instance_id="i2", endpoint="http://b"))
    table.invalidate()
    assert table.revision == first + 1 and set(table.instances("orders")) == {"i1", "i2"}
