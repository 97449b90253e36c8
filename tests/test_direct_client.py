"""ReachClient + DirectTransport end to end: every protocol against real servers, and the core acting on wire faults."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from faultproxy import FaultProxy
from test_direct_adapters import a2a_agent, fake_app, openai_agent, raw_agent

from reach_plugins import ReachClient, SyncReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import BusinessError
from reach_plugins.model import Auth
from reach_plugins.registry.memory import MemoryRegistry
from transports.direct import DirectTransport

orders = ReachAgent("orders")
executed: list[str] = []


@orders.capability("create_ticket", idempotency_key="${params.wo_number}")
def create_ticket(wo_number: str) -> dict[str, str]:
    """Open an after-sales ticket (runs once per work order)."""
    executed.append(wo_number)
    if wo_number.startswith("closed"):
        raise BusinessError("work order closed already")
    return {"ticket": f"T-{wo_number}"}


@pytest.fixture(scope="module")
def fakes() -> Iterator[BackgroundServer]:
    with BackgroundServer(fake_app()) as server:
        yield server


@pytest.fixture(scope="module")
def agent_server() -> Iterator[BackgroundServer]:
    with BackgroundServer(orders.app) as server:
        yield server


@pytest.fixture
async def proxy(agent_server: BackgroundServer) -> AsyncIterator[FaultProxy]:
    async with FaultProxy((agent_server.host, agent_server.port)) as proxy:
        yield proxy


@pytest.fixture(params=["aiohttp", "httpx"])
async def client(
    request: pytest.FixtureRequest, fakes: BackgroundServer, proxy: FaultProxy
) -> AsyncIterator[ReachClient]:
    registry = MemoryRegistry()
    bearer = Auth(type="bearer", value_env="OPENAI_KEY")
    assistant = openai_agent(fakes.url).model_copy(update={"auth": bearer})
    for descriptor in (assistant, raw_agent(fakes.url), a2a_agent(fakes.url)):
        await registry.register_agent(descriptor)
    await registry.register_agent(orders.descriptor(proxy.url))
    transport = DirectTransport(engine=request.param)
    async with ReachClient(registry=registry, transport=transport, environ={"OPENAI_KEY": "sk-test"}) as reach:
        yield reach


@pytest.mark.parametrize(
    ("capability", "payload", "reply"),
    [
        ("chat", {"input": "hi"}, "fake-gpt-4 heard: hi"),
        ("ask", {"query": "where is A1"}, "shipped (s-1)"),
        ("search_kb", {"query": "refunds"}, "answer to refunds"),
    ],
)
async def test_every_protocol_answers_normalised(
    client: ReachClient, capability: str, payload: dict[str, str], reply: str
) -> None:
    """openai-compatible, raw-http and a2a agents all answer in reply_content through the client."""
    response = await client.reach(capability, payload, session_id="s-1", timeout_ms=3000)
    assert response.status == "success", response.error
    assert response.data["reply_content"] == reply


async def test_reach_agent_answers_through_the_client(client: ReachClient) -> None:
    """A Python function served by the SDK is reached by capability name."""
    number = work_order()
    response = await client.reach("create_ticket", {"wo_number": number}, timeout_ms=3000)
    assert (response.status, response.data, response.agent) == ("success", {"ticket": f"T-{number}"}, "orders")


def work_order(prefix: str = "W") -> str:
    """A work order number no other test (or engine run) has used: the agent remembers keys."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_business_error_is_not_retried(client: ReachClient) -> None:
    """A business refusal comes back once, as a business failure, without a second execution."""
    number = work_order("closed")
    response = await client.reach("create_ticket", {"wo_number": number}, timeout_ms=3000)
    assert response.error is not None
    assert (response.status, response.error.type) == ("fail", "business")
    assert executed.count(number) == 1


async def test_reset_connection_is_retried(client: ReachClient, proxy: FaultProxy) -> None:
    """A connection reset before the agent answered is retried by the core and then succeeds."""
    proxy.mode, proxy.times = "reset", 1
    response = await client.reach("create_ticket", {"wo_number": work_order()}, timeout_ms=3000)
    assert response.status == "success", response.error
    assert response.attempts == 2


async def test_lost_reply_is_retried_without_a_second_execution(client: ReachClient, proxy: FaultProxy) -> None:
    """The agent ran but its reply was lost: the retry carries the same key and gets the stored result."""
    number = work_order()
    proxy.mode, proxy.times = "lose_reply", 1
    response = await client.reach("create_ticket", {"wo_number": number}, idempotency_key=number, timeout_ms=3000)
    assert response.status == "success", response.error
    assert response.data == {"ticket": f"T-{number}"}
    assert executed.count(number) == 1


async def test_agent_down_is_a_clean_failure(client: ReachClient, proxy: FaultProxy) -> None:
    """With the only instance refusing connections the client returns a failure, not a library exception."""
    await proxy.down()
    response = await client.reach("create_ticket", {"wo_number": work_order()}, timeout_ms=1000)
    assert response.status in ("fail", "timeout")
    assert response.error is not None


async def test_stalled_agent_ends_in_a_timeout_within_the_deadline(client: ReachClient, proxy: FaultProxy) -> None:
    """An agent that swallows requests costs the caller its deadline, then a timeout, never a hang."""
    proxy.mode = "blackhole"
    response = await client.reach("create_ticket", {"wo_number": work_order()}, timeout_ms=500)
    assert response.status == "timeout"


async def test_stream_through_the_client_is_normalised(client: ReachClient) -> None:
    """client.stream yields an openai-compatible agent's chunks as deltas, the finish reason, then end."""
    events = [event async for event in client.stream("chat", {"input": "red green"}, timeout_ms=3000)]
    data = [event.data for event in events if event.kind == "data"]
    assert [chunk["reply_content"] for chunk in data] == ["red", "green", ""]
    assert data[-1]["raw_meta"]["finish_reason"] == "stop"
    assert events[-1].kind == "end"


async def test_one_transport_serves_a_blocking_and_an_async_client(agent_server: BackgroundServer) -> None:
    """One DirectTransport keeps a pool per loop: a SyncReachClient and a ReachClient share it, in any order."""
    registry = MemoryRegistry()
    await registry.register_agent(orders.descriptor(agent_server.url))
    transport = DirectTransport()
    client, blocking = ReachClient(registry, transport), SyncReachClient(registry, transport)
    first = blocking.reach("create_ticket", {"wo_number": f"mix-{uuid.uuid4().hex[:6]}"})
    second = await client.reach("create_ticket", {"wo_number": f"mix-{uuid.uuid4().hex[:6]}"})
    third = blocking.reach("create_ticket", {"wo_number": f"mix-{uuid.uuid4().hex[:6]}"})
    assert [r.status for r in (first, second, third)] == ["success"] * 3
    await asyncio.to_thread(blocking.close)
    await client.aclose()
