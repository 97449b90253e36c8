"""Agent-side idempotency: one execution per Idempotency-Key, single flight, conflicts, expiry, lost replies."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from faultproxy import FaultProxy
from test_agent_sdk import Client, Clock, body, build_agent
from transport_conformance import make_call

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.agent.idempotency import scope
from reach_plugins.errors import ConnectionLost, Retryable
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.dedup import MemoryDedupStore
from reach_plugins.testing.clock import FakeClock
from transports.direct import DirectTransport


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    agent, executed = build_agent()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://agent") as http:
        yield http, agent, executed


async def test_same_idempotency_key_executes_once(client: Client) -> None:
    """A retried call with the same Idempotency-Key gets the stored reply and does not run again."""
    http, _, executed = client
    request = body("create_ticket", {"wo_number": "W7"})
    first = await http.post("/reach", json=request, headers={"Idempotency-Key": "wo-W7"})
    second = await http.post("/reach", json=request, headers={"Idempotency-Key": "wo-W7"})
    assert executed == ["W7"]
    assert second.json() == first.json()
    assert second.headers["Idempotent-Replayed"] == "true"


async def test_concurrent_duplicates_share_one_execution() -> None:
    """Two concurrent calls with one key run the handler once, and both get its result."""
    agent = ReachAgent("slow", tokens="open")
    started, release = asyncio.Event(), asyncio.Event()
    runs: list[int] = []

    @agent.capability("charge")
    async def charge(amount: int) -> int:
        runs.append(amount)
        started.set()
        await release.wait()
        return amount

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://127.0.0.1") as http:
        request = body("charge", {"amount": 5})
        calls = [asyncio.create_task(http.post("/reach", json=request, headers={"Idempotency-Key": "c1"}))]
        calls.append(asyncio.create_task(http.post("/reach", json=request, headers={"Idempotency-Key": "c1"})))
        await started.wait()
        release.set()
        replies = await asyncio.gather(*calls)
    assert runs == [5]
    assert [reply.json()["data"] for reply in replies] == [5, 5]


async def test_same_key_with_another_payload_conflicts(client: Client) -> None:
    """Reusing a key for a different payload is a 409 conflict, and the second payload does not run."""
    http, _, executed = client
    await http.post("/reach", json=body("create_ticket", {"wo_number": "W1"}), headers={"Idempotency-Key": "k"})
    response = await http.post(
        "/reach", json=body("create_ticket", {"wo_number": "W2"}), headers={"Idempotency-Key": "k"}
    )
    assert response.status_code == 409
    assert "different payload" in response.json()["error"]["message"]
    assert executed == ["W1"]


async def test_a_handler_that_raised_is_stored_and_a_retryable_one_is_not() -> None:
    """A crashed execution is kept (its key answers the same failure, no second run); a Retryable one runs again."""
    agent = ReachAgent("ledger", tokens="open")
    runs: list[str] = []

    @agent.capability("post")
    def post(entry: str) -> None:
        runs.append(entry)
        raise Retryable("ledger busy") if entry == "busy" else RuntimeError("ledger down")

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://127.0.0.1") as http:
        answers = [
            await http.post("/reach", json=body("post", {"entry": entry}), headers={"Idempotency-Key": entry})
            for entry in ("down", "down", "busy", "busy")
        ]
    assert runs == ["down", "busy", "busy"]
    assert answers[1].json()["error"] == answers[0].json()["error"]
    assert answers[1].headers["Idempotent-Replayed"] == "true"
    assert [answer.json()["error"]["type"] for answer in answers] == ["handler_failed"] * 2 + ["handler_retryable"] * 2


async def test_stored_replies_expire_after_the_window() -> None:
    """Past the idempotency window the same key executes again."""
    clock = Clock()
    agent, executed = build_agent(idempotency_window=60.0, clock=clock)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://127.0.0.1") as http:
        request = body("create_ticket", {"wo_number": "W1"})
        await http.post("/reach", json=request, headers={"Idempotency-Key": "k"})
        clock.now += 59
        await http.post("/reach", json=request, headers={"Idempotency-Key": "k"})
        clock.now += 2
        await http.post("/reach", json=request, headers={"Idempotency-Key": "k"})
    assert executed == ["W1", "W1"]


async def test_lost_reply_then_retry_executes_once() -> None:
    """Over a real wire: the agent ran, the reply was lost, the retry with the same key gets the stored result."""
    agent, executed = build_agent()
    with BackgroundServer(agent.app) as server:
        async with FaultProxy((server.host, server.port)) as proxy, DirectTransport() as transport:
            call = make_call(proxy.url, "create_ticket", {"wo_number": "W9"}, idempotency_key="wo-W9")
            proxy.mode = "lose_reply"
            with pytest.raises(ConnectionLost):
                await transport.send(call)
            proxy.mode = "pass"
            reply = await transport.send(call)
    assert reply.data["ticket"] == "T-W9"
    assert executed == ["W9"]


async def test_a_lapsed_claim_is_outcome_unknown_never_a_fresh_run() -> None:
    """An instance died holding the key (its lease passed): the next request with it is not run again; the answer
    is ``outcome_unknown`` and the key stays unknown (a retry gets the same answer, still without a run)."""
    clock = FakeClock()
    store = MemoryDedupStore(budget=DEFAULT_BUDGET, clock=clock)
    agent, executed = build_agent(idempotency=store)
    request = body("create_ticket", {"wo_number": "W9"})
    fingerprint = json.dumps(request["payload"], sort_keys=True)
    await store.begin(scope(None, "orders", "create_ticket", "wo-W9"), fingerprint, 5.0, window=300)
    clock.advance(6)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://127.0.0.1") as http:
        for _ in range(2):
            answer = await http.post("/reach", json=request, headers={"Idempotency-Key": "wo-W9"})
            assert answer.json()["error"]["type"] == "outcome_unknown", answer.text
    assert executed == []
