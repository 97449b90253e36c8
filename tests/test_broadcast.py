"""Broadcast / aggregate: top-k candidates at once, early completion, stragglers cancelled, who answered."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hop_support import TOKENS, Agent, demo_tenants, serve_agents, write_config

from reach_plugins import AgentDescriptor, ReachClient, ReachResponse, errors
from reach_plugins.agent import BackgroundServer
from reach_plugins.client.broadcast import summary_of
from reach_plugins.demo.panel import Expert, panel_agent
from reach_plugins.gateway import create_app
from reach_plugins.registry import MemoryRegistry
from reach_plugins.transport import Call, MockTransport
from reach_plugins.wire.headers import PREFER, SUMMARY_BYTES, TARGET
from transports.gateway import GatewayTransport


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[tuple[list[Agent], Path]]:
    """Three instances of orders (a, b, c = orders-0, -1, -2), each holding until its own gate opens."""
    with serve_agents(("orders", "a"), ("orders", "b"), ("orders", "c")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agent.url for agent in agents]}, demo_tenants())
        yield agents, config


def client_for(config: Path, **options: Any) -> ReachClient:
    return ReachClient(str(config), tenant="demo", environ=TOKENS, **options)


async def test_first_success_completes_early_and_cancels_the_stragglers(trio: tuple[list[Agent], Path]) -> None:
    """With aggregate 'first', the first answer ends the broadcast; the two still holding are cancelled."""
    agents, config = trio
    agents[0].gate.set()
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with client_for(config) as client:
        result = await client.broadcast("hold", {"n": 1, "seconds": 30}, k=3, aggregate="first", timeout_ms=20_000)
    elapsed = loop.time() - started
    assert result.status == "success" and result.needed == 1
    assert result.answered == ["orders/orders-0"] and result.data == [{"n": 1, "by": "a"}]
    assert sorted(result.cancelled) == ["orders/orders-1", "orders/orders-2"]
    assert sorted(result.targets) == ["orders/orders-0", "orders/orders-1", "orders/orders-2"]
    assert elapsed < 10


async def test_quorum_waits_for_a_majority(trio: tuple[list[Agent], Path]) -> None:
    """A quorum of three is two answers; the third target is cancelled."""
    agents, config = trio
    agents[0].gate.set()
    agents[2].gate.set()
    async with client_for(config) as client:
        result = await client.broadcast("hold", {"n": 2, "seconds": 30}, k=3, aggregate="quorum", timeout_ms=20_000)
    assert result.status == "success" and result.needed == 2
    assert sorted(result.answered) == ["orders/orders-0", "orders/orders-2"]
    assert result.cancelled == ["orders/orders-1"]


async def test_all_lists_every_answer_including_failures(trio: tuple[list[Agent], Path]) -> None:
    """'all' waits for every target; one refusal makes it fail, and the response still lists all three."""
    _, config = trio
    async with client_for(config) as client:
        good = await client.broadcast("pick", {"refuse": []}, k=3, aggregate="all")
        mixed = await client.broadcast("pick", {"refuse": ["b"]}, k=3, aggregate="all")
    assert good.status == "success" and sorted(item["by"] for item in good.data) == ["a", "b", "c"]
    assert mixed.status == "fail" and len(mixed.responses) == 3 and mixed.cancelled == []
    refused = [response for response in mixed.responses if not response.ok]
    assert [response.instance for response in refused] == ["orders-1"]
    assert refused[0].error is not None and refused[0].error.type == "business"


async def test_first_n_fails_as_soon_as_it_cannot_be_met(trio: tuple[list[Agent], Path]) -> None:
    """first_n with n=2: two refusals out of three make success impossible, so it ends without the third."""
    _, config = trio
    async with client_for(config) as client:
        result = await client.broadcast("pick", {"refuse": ["a", "b", "c"]}, k=3, aggregate="first_n", n=2)
    assert result.status == "fail" and result.needed == 2
    assert len(result.responses) + len(result.cancelled) == 3 and len(result.responses) >= 2


async def test_deadline_ends_a_broadcast_with_timeout(trio: tuple[list[Agent], Path]) -> None:
    """'all' with one target still holding at the deadline ends as timeout; it never counts as an answer."""
    agents, config = trio
    agents[0].gate.set()
    agents[1].gate.set()
    async with client_for(config) as client:
        result = await client.broadcast("hold", {"n": 3, "seconds": 30}, k=3, aggregate="all", timeout_ms=400)
    assert result.status == "timeout"
    assert "orders/orders-2" not in [f"{r.agent}/{r.instance}" for r in result.successes]
    assert len(result.successes) == 2


async def test_impossible_aggregates_are_refused_before_sending(trio: tuple[list[Agent], Path]) -> None:
    """Asking for more successes than candidates, or k < 1, raises and nothing reaches an agent."""
    agents, config = trio
    async with client_for(config) as client:
        with pytest.raises(errors.NoHealthyAgent, match="only 3 candidate"):
            await client.broadcast("pick", {"refuse": []}, k=5, aggregate="first_n", n=4)
        with pytest.raises(errors.RequestError, match="k >= 1"):
            await client.broadcast("pick", {"refuse": []}, k=0)
        with pytest.raises(errors.RequestError, match="n >= 1"):
            await client.broadcast("pick", {"refuse": []}, aggregate="first_n")
    assert sum(agent.count("pick") for agent in agents) == 0


async def test_broadcast_through_the_gateway_reaches_distinct_instances(trio: tuple[list[Agent], Path]) -> None:
    """Each copy carries its pin to the gateway, which serves it on exactly that instance."""
    agents, config = trio
    with BackgroundServer(create_app(config, environ=TOKENS), proxy_headers=False) as gateway:
        transport = GatewayTransport(gateway.url, token=TOKENS["DEMO_TOKEN"])
        async with client_for(config, transport=transport) as client:
            result = await client.broadcast("pick", {"refuse": []}, k=3, aggregate="all")
    assert result.status == "success"
    assert sorted(result.answered) == ["orders/orders-0", "orders/orders-1", "orders/orders-2"]
    assert sorted(item["by"] for item in result.data) == ["a", "b", "c"]
    assert [agent.count("pick") for agent in agents] == [1, 1, 1]


@pytest.fixture
async def mock_client() -> tuple[ReachClient, MockTransport]:
    registry = MemoryRegistry()
    endpoints = ["http://a", "http://b", "http://c"]
    await registry.register_agent(AgentDescriptor(name="orders", endpoints=endpoints, capabilities=["query_order"]))

    def answer(call: Call) -> dict[str, str]:
        return {"instance": call.instance.instance_id}

    transport = MockTransport(answer)
    return ReachClient(registry, transport), transport


async def test_pins_route_to_the_named_instance(mock_client: tuple[ReachClient, MockTransport]) -> None:
    """A target pin always lands on its instance; an unknown target is refused; an unknown preference is ignored."""
    client, _ = mock_client
    pinned = client.request("query_order").model_copy(update={"metadata": {TARGET: "orders/orders-1"}})
    served = {(await client.send(pinned.model_copy(update={"request_id": str(n)}))).instance for n in range(6)}
    assert served == {"orders-1"}
    with pytest.raises(errors.NoHealthyAgent, match="orders/nope"):
        await client.send(client.request("query_order").model_copy(update={"metadata": {TARGET: "orders/nope"}}))
    preferred = client.request("query_order").model_copy(update={"metadata": {PREFER: "orders/nope"}})
    assert (await client.send(preferred)).ok
    await client.aclose()


async def test_copies_keep_their_own_idempotency_keys(mock_client: tuple[ReachClient, MockTransport]) -> None:
    """An idempotency key is made per target, so dedup never merges the copies of one broadcast."""
    client, transport = mock_client
    result = await client.broadcast("query_order", {}, k=3, aggregate="all", idempotency_key="k-1")
    keys = sorted(call.request.idempotency_key or "" for call in transport.calls)
    assert result.status == "success" and len(transport.calls) == 3
    assert keys == ["k-1@orders/orders-0", "k-1@orders/orders-1", "k-1@orders/orders-2"]
    await client.aclose()


# ----------------------------------------------------------------------------- shared summaries (seed 004, 6.2)


@pytest.fixture
def panel() -> Iterator[tuple[list[Expert], MemoryRegistry]]:
    """Four experts who deliberate 0.3 s, or confirm an answer already in within 10 ms."""
    experts = [Expert(f"e{number}", think=lambda: 0.3) for number in range(4)]
    servers = [BackgroundServer(panel_agent(f"expert-{e.label}", e).app).start() for e in experts]
    registry = MemoryRegistry()
    for expert, server in zip(experts, servers, strict=True):
        registry.put_agent(panel_agent(f"expert-{expert.label}", expert).descriptor(server.url))
    yield experts, registry
    for server in servers:
        server.stop()


async def test_a_later_copy_sees_the_answers_already_in_and_confirms(panel: Any) -> None:
    """share_summary: the second copy starts after the first answer and confirms it; agree ends at two equal answers."""
    experts, registry = panel
    async with ReachClient(registry) as client:
        result = await client.broadcast(
            "answer_question", {"question": "Why?"}, k=4, aggregate="agree", n=2, share_summary=True, stagger=5.0
        )
    assert result.status == "success" and len(result.responses) == 2
    assert result.data[0] == result.data[1] == {"answer": "answer to why?"}
    assert sorted(action for expert in experts for action in expert.did) == ["confirmed", "worked"]
    assert len(result.cancelled) == 2 and set(result.cancelled).isdisjoint(result.answered)


async def test_agree_ends_without_waiting_for_every_answer(panel: Any) -> None:
    """Without summaries every copy deliberates; agree still ends at the first two equal answers, not all four."""
    experts, registry = panel
    async with ReachClient(registry) as client:
        agreed = await client.broadcast("answer_question", {"question": "How?"}, k=4, aggregate="agree")
        disagreeing = await client.broadcast(
            "answer_question", {"question": "How?"}, k=4, aggregate="agree", n=2, agree=lambda data: id(data)
        )
    assert agreed.status == "success" and 2 <= len(agreed.responses) <= 4
    assert disagreeing.status == "fail" and len(disagreeing.responses) == 4
    assert all(expert.did[0] == "worked" for expert in experts)


def test_summary_headers_stay_small_and_ascii() -> None:
    """A summary keeps the newest answers within its byte budget and is printable ASCII (it travels as a header)."""
    responses = [
        ReachResponse(request_id=str(i), status="success", data={"text": "ü" * 400}, agent=f"a{i}") for i in range(40)
    ]
    text = summary_of(responses)
    assert len(text) <= SUMMARY_BYTES and text.isascii() and text.isprintable()
    assert json.loads(text)[-1]["agent"] == "a39"
