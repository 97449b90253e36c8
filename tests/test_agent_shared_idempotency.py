"""Agent-side idempotency shared across instances (DESIGN 11.2): claim first, "in progress" elsewhere, namespaces."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from test_agent_sdk import body

from reach_plugins.agent import ReachAgent
from reach_plugins.agent.handlers import ReachContext

DEAD_REDIS = "redis://127.0.0.1:1/0?timeout=0.2"


def instance(store: str, executed: list[str], gate: asyncio.Event | None = None, **options: Any) -> ReachAgent:
    """One instance of a ``tickets`` agent recording each completed execution."""
    agent = ReachAgent("tickets", idempotency=store, tokens="open", **options)

    @agent.capability("create_ticket")
    async def create_ticket(title: str, ctx: ReachContext) -> dict[str, Any]:
        if gate is not None:
            await gate.wait()
        executed.append(title)
        return {"ticket": f"T-{len(executed)}", "scope": ctx.idempotency_scope}

    @agent.capability("close_ticket")
    async def close_ticket(title: str) -> str:
        executed.append(f"close {title}")
        return "closed"

    return agent


def http(agent: ReachAgent) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://agent")


@pytest.fixture
def shared(redis_url: str) -> str:
    return f"{redis_url}?prefix=reach-test:{uuid.uuid4().hex}:"


async def test_a_key_claimed_on_one_instance_is_not_executed_on_another(shared: str) -> None:
    """While A runs a key, B answers 503 "not executed" with Retry-After; afterwards B replays A's result."""
    executed: list[str] = []
    gate = asyncio.Event()
    a, b = instance(shared, executed, gate), instance(shared, executed)
    request, headers = body("create_ticket", {"title": "printer"}), {"Idempotency-Key": "k1", "X-Tenant": "acme"}
    async with http(a) as to_a, http(b) as to_b:
        first = asyncio.create_task(to_a.post("/reach", json=request, headers=headers))
        await asyncio.sleep(0.2)
        busy = await to_b.post("/reach", json=request, headers=headers)
        assert busy.status_code == 503 and busy.json()["error"]["type"] == "backpressure"
        assert "not executed" in busy.json()["error"]["message"] and busy.headers["Retry-After"]
        gate.set()
        done = await first
        again = await to_b.post("/reach", json=request, headers=headers)
    assert executed == ["printer"]
    assert again.json()["data"] == done.json()["data"] and again.headers["Idempotent-Replayed"] == "true"


async def test_keys_are_namespaced_by_tenant_agent_and_capability(shared: str) -> None:
    """One key under another tenant or capability is another operation; the scope names all three."""
    executed: list[str] = []
    agent = instance(shared, executed)
    async with http(agent) as client:
        for tenant, capability in [("acme", "create_ticket"), ("globex", "create_ticket"), ("acme", "close_ticket")]:
            headers = {"Idempotency-Key": "same", "X-Tenant": tenant}
            reply = await client.post("/reach", json=body(capability, {"title": "t"}), headers=headers)
            assert reply.status_code == 200
    assert executed == ["t", "t", "close t"]


async def test_descriptor_declares_shared_idempotency_only_with_a_shared_store(shared: str) -> None:
    """Redis-backed agents say ``idempotency.shared``; memory-backed ones do not (callers read it to fail over)."""
    assert instance(shared, []).descriptor().idempotency.shared is True
    assert instance("memory://", []).descriptor().idempotency.shared is False


async def test_unreachable_store_answers_not_executed() -> None:
    """If the key cannot be claimed the handler does not run; the answer is retryable and says why."""
    executed: list[str] = []
    async with http(instance(DEAD_REDIS, executed)) as client:
        reply = await client.post(
            "/reach", json=body("create_ticket", {"title": "x"}), headers={"Idempotency-Key": "k"}
        )
    assert reply.status_code == 503 and "not executed" in reply.json()["error"]["message"]
    assert executed == []


async def test_a_result_committed_by_the_handler_is_answered_instead_of_a_second_run(shared: str) -> None:
    """The transaction hook: a key the handler committed with its effect is never run again."""
    executed: list[str] = []
    ledger: dict[str, Any] = {}

    async def committed(scope: str) -> Any:
        return ledger.get(scope)

    agent = instance(shared, executed, committed=committed)
    headers = {"Idempotency-Key": "k9", "X-Tenant": "acme"}
    ledger["acme\x1ftickets\x1fcreate_ticket\x1fk9"] = {"ticket": "T-from-ledger"}
    async with http(agent) as client:
        reply = await client.post("/reach", json=body("create_ticket", {"title": "x"}), headers=headers)
    assert reply.json()["data"] == {"ticket": "T-from-ledger"} and executed == []
