"""ReachClient through its public API, with the in-memory MockTransport."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from reach_plugins import AgentDescriptor, ReachClient, SyncReachClient, errors
from reach_plugins.config.loader import TenantConfig
from reach_plugins.registry import FileRegistry, MemoryRegistry
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.sessions import MemorySessions, session_key
from reach_plugins.transport import Call, MockTransport

ORDERS: dict[str, Any] = {
    "name": "orders",
    "endpoints": ["http://orders-a", "http://orders-b"],
    "capabilities": [
        {
            "name": "query_order",
            "params_schema": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "lines": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["order_id"],
            },
        }
    ],
}


def echo(call: Call) -> dict[str, Any]:
    return {"instance": call.instance.instance_id, **call.request.payload}


@pytest.fixture
async def registry() -> MemoryRegistry:
    reg = MemoryRegistry()
    await reg.register_agent(AgentDescriptor.model_validate(ORDERS))
    return reg


async def test_reach_routes_by_capability_and_reports_where(registry: MemoryRegistry) -> None:
    """A reach names a capability and comes back with the agent and instance that served it."""
    transport = MockTransport(echo)
    client = ReachClient(registry, transport, tenant="demo")
    resp = await client.reach("query_order", {"order_id": "A1"}, trace=True)
    assert resp.status == "success" and resp.agent == "orders"
    assert resp.data == {"instance": resp.instance, "order_id": "A1"}
    assert transport.calls[0].request.tenant == "demo"
    assert resp.trace is not None and resp.trace.route is not None and resp.trace.route.agent == "orders"
    await client.aclose()


async def test_session_stays_on_one_instance(registry: MemoryRegistry) -> None:
    """Every call of one session lands on the same instance."""
    client = ReachClient(registry, MockTransport(echo))
    served = {(await client.reach("query_order", {"order_id": "A1"}, session_id="s-7")).instance for _ in range(20)}
    assert len(served) == 1
    await client.aclose()


async def test_unknown_capability_names_closest(registry: MemoryRegistry) -> None:
    """A misspelt capability fails before sending and suggests the closest known name."""
    transport = MockTransport(echo)
    client = ReachClient(registry, transport)
    with pytest.raises(errors.UnknownCapability, match="query_order"):
        await client.reach("query_ordr", {"order_id": "A1"})
    assert transport.calls == []


async def test_invalid_payload_names_the_field(registry: MemoryRegistry) -> None:
    """A payload that breaks params_schema is refused, naming the field, and nothing is sent."""
    transport = MockTransport(echo)
    client = ReachClient(registry, transport)
    with pytest.raises(errors.InvalidPayload, match=r"lines\[1\]"):
        await client.reach("query_order", {"order_id": "A1", "lines": [1, "two"]})
    with pytest.raises(errors.InvalidPayload, match="order_id"):
        await client.reach("query_order", {})
    assert transport.calls == []


async def test_tenant_not_allowed_is_refused(tmp_path: Path) -> None:
    """A tenant whose allow-list lacks the agent gets PermissionDenied; nothing is sent."""
    config = tmp_path / "agents.yaml"
    config.write_text(
        "agents:\n"
        "  - name: orders\n    endpoints: [http://orders-a]\n    capabilities: [query_order]\n"
        "  - name: tickets\n    endpoints: [http://tickets-a]\n    capabilities: [create_ticket]\n"
        "tenants:\n  demo:\n    agents: [tickets]\n"
    )
    transport = MockTransport(echo)
    client = ReachClient(f"file://{config}", transport, tenant="demo")
    with pytest.raises(errors.PermissionDenied, match="demo"):
        await client.reach("query_order", {"order_id": "A1"})
    assert (await client.reach("create_ticket", {})).status == "success"
    assert [c.agent.name for c in transport.calls] == ["tickets"]
    await client.aclose()


async def test_nobody_healthy_says_why(registry: MemoryRegistry) -> None:
    """When every instance is down, NoHealthyAgent lists why each candidate was skipped."""
    for instance in list(registry.instances("orders").values()):
        await registry.register_instance(instance.model_copy(update={"status": "down"}))
    client = ReachClient(registry, MockTransport(echo))
    with pytest.raises(errors.NoHealthyAgent) as caught:
        await client.reach("query_order", {"order_id": "A1"})
    assert set(caught.value.reasons) == {"orders/orders-0", "orders/orders-1"}


def test_blocking_client_outside_a_loop(registry: MemoryRegistry) -> None:
    """SyncReachClient blocks and returns the response from plain synchronous code."""
    with SyncReachClient(registry, MockTransport(echo)) as client:
        assert client.reach("query_order", {"order_id": "A2"}).data["order_id"] == "A2"


async def test_blocking_client_inside_a_running_loop(registry: MemoryRegistry) -> None:
    """SyncReachClient also works when called from a thread that already runs an event loop (its own loop)."""
    with SyncReachClient(registry, MockTransport(echo)) as client:
        assert client.reach("query_order", {"order_id": "A3"}).ok
        assert client.client._loop is not asyncio.get_running_loop()


def test_blocking_client_streams_and_raises_like_the_async_one(registry: MemoryRegistry) -> None:
    """The blocking stream yields the same events; a refusal raises the same class."""
    with SyncReachClient(registry, MockTransport(echo)) as client:
        events = list(client.stream("query_order", {"order_id": "A4"}))
        with pytest.raises(errors.UnknownCapability):
            client.reach("launch_rocket")
    assert [event.kind for event in events] == ["data", "end"]


async def test_a_client_serves_one_event_loop(registry: MemoryRegistry) -> None:
    """A ReachClient used from a second running loop refuses with a named error instead of hanging."""
    client = ReachClient(registry, MockTransport(echo))
    await client.reach("query_order", {"order_id": "A5"})

    def elsewhere() -> str:
        async def other_loop() -> str:
            try:
                await client.reach("query_order", {"order_id": "A6"})
            except errors.ConfigError as exc:
                return exc.message
            return "no error"

        return asyncio.run(other_loop())

    message = await asyncio.to_thread(elsewhere)
    assert "serves another event loop" in message and "SyncReachClient" in message
    await client.aclose()


async def test_candidates_lists_healthy_instances_and_sends_nothing(registry: MemoryRegistry) -> None:
    """candidates() answers who could take a request now, best first, bounded by limit, without sending."""
    transport = MockTransport(echo)
    client = ReachClient(registry, transport)
    request = client.request("query_order", {"order_id": "A1"})
    assert sorted(route.instance.instance_id for route in await client.candidates(request)) == [
        "orders-0",
        "orders-1",
    ]
    assert len(await client.candidates(request, limit=1)) == 1
    with pytest.raises(errors.UnknownCapability):
        await client.candidates(client.request("query_ordr"))
    assert transport.calls == []
    await client.aclose()


async def test_candidates_from_another_loop_are_refused(registry: MemoryRegistry) -> None:
    """The router is asked on the client's loop only: candidates() from a second loop is a ConfigError."""
    client = ReachClient(registry, MockTransport(echo))
    await client.reach("query_order", {"order_id": "A5"})

    async def other_loop() -> str:
        try:
            await client.candidates(client.request("query_order", {"order_id": "A6"}))
        except errors.ConfigError as exc:
            return exc.message
        return "no error"

    message = await asyncio.to_thread(asyncio.run, other_loop())
    assert "serves another event loop" in message
    await client.aclose()


async def test_close_session_refuses_later_calls_and_drops_the_pins(registry: MemoryRegistry) -> None:
    """close_session() closes the conversation in the store and forgets its pins in the router."""
    transport = MockTransport(echo)
    client = ReachClient(registry, transport, sessions=MemorySessions(budget=DEFAULT_BUDGET))
    assert (await client.reach("query_order", {"order_id": "A1"}, session_id="chat-9")).ok
    assert client.router.sessions.get(session_key(None, "chat-9")) is not None
    await client.close_session("chat-9")
    assert client.router.sessions.get(session_key(None, "chat-9")) is None
    with pytest.raises(errors.SessionClosed, match="chat-9"):
        await client.reach("query_order", {"order_id": "A1"}, session_id="chat-9")
    assert len(transport.calls) == 1
    await client.aclose()


async def test_close_session_without_a_store_names_the_fix(registry: MemoryRegistry) -> None:
    """A client built without sessions= cannot close a conversation: the ConfigError says to pass sessions=."""
    client = ReachClient(registry, MockTransport(echo))
    with pytest.raises(errors.ConfigError, match="sessions="):
        await client.close_session("chat-1")
    await client.aclose()


def test_a_registry_with_tenants_gives_them_unless_the_client_has_its_own(tmp_path: Path) -> None:
    """The registry's tenants port (a YAML file's tenants:) is the client's table; tenants= overrides it."""
    config = tmp_path / "agents.yaml"
    config.write_text("agents: []\ntenants:\n  demo:\n    agents: '*'\n")
    registry = FileRegistry(config)
    assert ReachClient(registry, MockTransport(echo)).tenants is registry.tenants
    assert ReachClient(MemoryRegistry(), MockTransport(echo)).tenants is None
    own: dict[str, TenantConfig] = {}
    assert ReachClient(registry, MockTransport(echo), tenants=own).tenants is own


async def test_closed_session_sends_nothing(registry: MemoryRegistry) -> None:
    """A reach for a closed conversation raises SessionClosed and never reaches an agent."""
    sessions = MemorySessions(budget=DEFAULT_BUDGET)
    transport = MockTransport(echo)
    client = ReachClient(registry, transport, sessions=sessions)
    assert (await client.reach("query_order", {"order_id": "A1"}, session_id="chat-1")).ok
    await sessions.close(session_key(None, "chat-1"))
    with pytest.raises(errors.SessionClosed, match="chat-1"):
        await client.reach("query_order", {"order_id": "A1"}, session_id="chat-1")
    assert len(transport.calls) == 1


async def test_closing_a_session_cancels_calls_in_flight(registry: MemoryRegistry) -> None:
    """A call in flight for a conversation that closes is cancelled with SessionClosed."""
    sessions = MemorySessions(budget=DEFAULT_BUDGET)
    started = asyncio.Event()

    async def slow(call: Call) -> dict[str, Any]:
        started.set()
        await asyncio.Event().wait()
        return {}

    client = ReachClient(registry, MockTransport(slow), sessions=sessions)
    task = asyncio.create_task(client.reach("query_order", {"order_id": "A1"}, session_id="chat-2"))
    await started.wait()
    await sessions.close(session_key(None, "chat-2"))
    with pytest.raises(errors.SessionClosed, match="in flight"):
        await task


async def test_expired_session_is_refused(registry: MemoryRegistry) -> None:
    """A conversation idle past its TTL is expired: SessionClosed, nothing sent."""
    now = [1000.0]
    sessions = MemorySessions(budget=DEFAULT_BUDGET, ttl=60, clock=lambda: now[0])
    transport = MockTransport(echo)
    client = ReachClient(registry, transport, sessions=sessions)
    await client.reach("query_order", {"order_id": "A1"}, session_id="chat-3")
    now[0] += 61
    with pytest.raises(errors.SessionClosed, match="expired"):
        await client.reach("query_order", {"order_id": "A1"}, session_id="chat-3")
    assert len(transport.calls) == 1


async def test_header_breaking_values_are_refused_before_sending(registry: MemoryRegistry) -> None:
    """An idempotency key or session id with control characters is InvalidPayload naming the field; nothing sent."""
    transport = MockTransport(echo)
    client = ReachClient(registry, transport)
    with pytest.raises(errors.InvalidPayload, match="idempotency_key"):
        await client.reach("query_order", {"order_id": "A1"}, idempotency_key="WO-1\r\nX-Evil: 1")
    with pytest.raises(errors.InvalidPayload, match="session_id"):
        await client.reach("query_order", {"order_id": "A1"}, session_id="s\x00")
    assert transport.calls == []


def test_a_blocking_call_from_the_blocking_clients_own_loop_is_refused(registry: MemoryRegistry) -> None:
    """Blocking on the private loop from that loop would deadlock: a named error says to await instead."""
    with SyncReachClient(registry, MockTransport(echo)) as client:

        async def inside() -> str:
            try:
                client.reach("query_order", {"order_id": "A7"})
            except errors.ConfigError as exc:
                return exc.message
            return "no error"

        message = client.bridge.run(inside())
    assert "wait on itself forever" in message
