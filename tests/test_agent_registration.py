"""The agent SDK's lifecycle: registration with heartbeats and sequence numbers, draining, session snapshots."""

from __future__ import annotations

import asyncio
import json

import httpx
from test_agent_sdk import body, build_agent

from reach_plugins.agent import BackgroundServer, MemorySnapshotStore, ReachAgent, Registration
from reach_plugins.errors import BackendUnavailable
from reach_plugins.model import Instance
from reach_plugins.registry.memory import MemoryRegistry
from reach_plugins.stores.budget import DEFAULT_BUDGET


async def test_registration_heartbeats_with_sequence_numbers() -> None:
    """Registration puts the descriptor and a ready instance; each beat raises the sequence number."""
    registry = MemoryRegistry()
    agent, _ = build_agent()
    registration = Registration(agent, registry, "http://127.0.0.1:8101", instance_id="orders-a")
    await registration.start()
    await registration.beat()
    await registration.beat()
    instance = registry.instances("orders")["orders-a"]
    assert (instance.status, instance.heartbeat_seq, instance.endpoint) == ("ready", 2, "http://127.0.0.1:8101")
    assert registry.agents()["orders"].capability("query_order") is not None
    await registration.stop()
    assert "orders-a" not in registry.instances("orders")


async def test_heartbeat_reports_draining_when_not_ready() -> None:
    """A heartbeat while readiness says no marks the instance draining, so routers skip it."""
    registry = MemoryRegistry()
    agent = ReachAgent("workers", readiness=lambda: False, tokens="open")
    registration = Registration(agent, registry, "http://127.0.0.1:8102", instance_id="w-1")
    await registration.start()
    await registration.beat()
    assert registry.instances("workers")["w-1"].status == "draining"
    await registration.stop()


async def test_heartbeat_loop_waits_the_interval_and_reregisters() -> None:
    """The loop sleeps health_check.interval between beats, and registers again if the registry forgot it."""
    registry = MemoryRegistry()
    agent, _ = build_agent()
    slept: list[float] = []
    done = asyncio.Event()

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 2:
            await registry.deregister_instance("orders", "orders-b")
        if len(slept) == 4:
            done.set()
            await asyncio.Event().wait()

    registration = Registration(agent, registry, "http://h:1", instance_id="orders-b", sleep=fake_sleep)
    await registration.start()
    await done.wait()
    assert slept == [10.0] * 4
    assert registry.instances("orders")["orders-b"].heartbeat_seq == registration.seq
    await registration.stop()


async def test_serving_registers_drains_and_restores_sessions() -> None:
    """Under uvicorn the app registers on start, deregisters on stop, and keeps session state across restarts."""
    registry = MemoryRegistry()
    store = MemorySnapshotStore(budget=DEFAULT_BUDGET)
    for expected in (1, 2):
        agent, _ = build_agent(snapshots=store)
        agent.register_on_startup(registry, "http://127.0.0.1:8103", instance_id="orders-c")
        with BackgroundServer(agent.app) as server:
            assert "orders-c" in registry.instances("orders")
            async with httpx.AsyncClient(base_url=server.url) as http:
                response = await http.post("/reach", json=body("create_ticket", {"wo_number": "W1"}, session_id="s"))
        assert response.json()["data"]["n"] == expected
        assert "orders-c" not in registry.instances("orders")
        assert json.loads(json.dumps(await store.load("orders"))) == {"s": {"tickets": expected}}


async def test_registry_down_at_start_is_retried_in_the_background() -> None:
    """A registry that cannot be reached at start does not stop the agent: start() returns, registration is retried
    after 0.5 s, 1 s, 2 s... until it succeeds, then heartbeats go on at the interval."""

    class DownAtFirst(MemoryRegistry):
        refusals = 3

        async def register_instance(self, instance: Instance) -> None:
            if self.refusals:
                self.refusals -= 1
                raise BackendUnavailable("etcd at 127.0.0.1:9 could not write an instance: unavailable")
            await super().register_instance(instance)

    registry = DownAtFirst()
    agent, _ = build_agent()
    slept: list[float] = []
    beating = asyncio.Event()

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        if registration.registered:
            beating.set()
            await asyncio.Event().wait()

    registration = Registration(agent, registry, "http://127.0.0.1:8104", instance_id="orders-d", sleep=fake_sleep)
    await registration.start()
    assert not registration.registered
    await beating.wait()
    assert slept == [0.5, 1.0, 2.0, 10.0]
    assert registry.instances("orders")["orders-d"].status == "ready"
    await registration.stop()
    assert "orders-d" not in registry.instances("orders")
