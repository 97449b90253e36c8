"""When the shared dedup store is unreachable: keyed calls are refused unless the agent guards keys itself."""

from __future__ import annotations

from typing import Any

import pytest

from reach_plugins import AgentDescriptor, ReachClient, ReachRequest, errors
from reach_plugins.registry import MemoryRegistry
from reach_plugins.transport import Call, MockTransport

DEAD_REDIS = "redis://127.0.0.1:1/0?timeout=0.2"


@pytest.fixture
async def registry() -> MemoryRegistry:
    reg = MemoryRegistry()
    await reg.register_agent(
        AgentDescriptor.model_validate(
            {
                "name": "tickets",
                "endpoints": ["http://tickets-a"],
                "capabilities": [
                    {"name": "create_ticket", "idempotency_key": "${params.wo_number}", "retryable": False},
                    {"name": "query_ticket", "idempotency_key": "${params.wo_number}"},
                ],
            }
        )
    )
    return reg


def answer(call: Call) -> dict[str, Any]:
    return {"ok": call.request.capability}


async def test_non_retryable_call_is_not_sent_without_dedup(registry: MemoryRegistry) -> None:
    """A side-effecting call whose key cannot be checked is refused, naming the backend; nothing is sent."""
    transport = MockTransport(answer)
    client = ReachClient(registry, transport, store=DEAD_REDIS)
    with pytest.raises(errors.BackendUnavailable, match="fails closed"):
        await client.reach("create_ticket", {"wo_number": "WO-1"})
    assert transport.calls == []
    await client.aclose()


async def test_retryable_call_is_refused_too(registry: MemoryRegistry) -> None:
    """Retryable or not, a keyed call whose key cannot be checked is not sent (it would run unguarded)."""
    transport = MockTransport(answer)
    client = ReachClient(registry, transport, store=DEAD_REDIS)
    with pytest.raises(errors.BackendUnavailable):
        await client.reach("query_ticket", {"wo_number": "WO-1"})
    assert transport.calls == []
    await client.aclose()


async def keyed_agent(*, shared: bool) -> MemoryRegistry:
    """A registry with one ``tickets`` agent whose ``create_ticket`` is keyed, declaring ``shared`` or not."""
    registry = MemoryRegistry()
    await registry.register_agent(
        AgentDescriptor.model_validate(
            {
                "name": "tickets",
                "endpoints": ["http://tickets-a"],
                "idempotency": {"shared": shared},
                "capabilities": [{"name": "create_ticket", "idempotency_key": "${params.wo_number}"}],
            }
        )
    )
    return registry


async def test_agent_with_shared_idempotency_guards_the_call_and_trace_says_so() -> None:
    """An agent declaring shared idempotency checks the key itself: the call goes ahead and its trace says why."""
    registry = await keyed_agent(shared=True)
    transport = MockTransport(answer)
    client = ReachClient(registry, transport, store=DEAD_REDIS)
    resp = await client.reach("create_ticket", {"wo_number": "WO-1"}, trace=True)
    assert resp.ok and len(transport.calls) == 1
    assert resp.trace is not None
    assert [e["event"] for e in resp.trace.events] == ["reach.dedup_unavailable"]
    await client.aclose()


@pytest.mark.parametrize("shared", [False, True])
async def test_the_same_rule_holds_in_a_gateway_or_node(shared: bool) -> None:
    """A server's forwarder (the gateway's and the node's core) refuses or proceeds exactly like the client."""
    from reach_plugins.server.forwarder import Forwarder
    from reach_plugins.stores.urls import open_store

    registry = await keyed_agent(shared=shared)
    transport = MockTransport(answer)
    forwarder = Forwarder(registry, tenants={}, transport=transport, store=open_store(DEAD_REDIS))
    request = ReachRequest(capability="create_ticket", payload={"wo_number": "WO-1"})
    if shared:
        assert (await forwarder.run(request)).ok and len(transport.calls) == 1
    else:
        with pytest.raises(errors.BackendUnavailable):
            await forwarder.run(request)
        assert transport.calls == []
    await forwarder.aclose()
