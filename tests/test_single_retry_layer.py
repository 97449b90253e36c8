"""Through a transport that retries on the far side (gateway, node), the caller retries only backpressure."""

from __future__ import annotations

from typing import Any

import pytest

from reach_plugins import AgentDescriptor, ReachClient
from reach_plugins.model import ErrorInfo
from reach_plugins.registry import MemoryRegistry
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, MockTransport, Reply


@pytest.fixture
async def registry() -> MemoryRegistry:
    reg = MemoryRegistry()
    await reg.register_agent(
        AgentDescriptor.model_validate(
            {"name": "orders", "endpoints": ["http://node-a"], "capabilities": ["query_order"]}
        )
    )
    return reg


def scripted(*replies: Reply) -> MockTransport:
    queue = list(replies)

    def answer(call: Call) -> Any:
        return queue.pop(0) if queue else Reply("success", {"ok": True}, agent="orders", instance="orders-9")

    return MockTransport(answer, owns_retries=True)


async def test_transient_failure_is_not_retried_again_by_the_caller(registry: MemoryRegistry) -> None:
    """A 503 the gateway already retried is final for the caller: one send, attempts counted far away."""
    transport = scripted(Reply("fail", error=ErrorInfo(type="transient", message="down"), status_code=503, attempts=3))
    client = ReachClient(registry, transport, clock=FakeClock())
    resp = await client.reach("query_order", {}, timeout_ms=10_000)
    assert resp.status == "fail" and len(transport.calls) == 1 and resp.attempts == 3


async def test_backpressure_is_waited_out_then_retried(registry: MemoryRegistry) -> None:
    """An explicit backpressure reply makes the caller wait the hinted delay and try again within the deadline."""
    clock = FakeClock()
    hint = ErrorInfo(type="backpressure", message="queue full", retry_after=0.5)
    transport = scripted(Reply("fail", error=hint, status_code=429, retry_after=0.5))
    client = ReachClient(registry, transport, clock=clock)
    started = clock.now()
    resp = await client.reach("query_order", {}, timeout_ms=10_000)
    assert resp.ok and len(transport.calls) == 2
    assert clock.now() - started >= 0.5
    assert resp.instance == "orders-9"
