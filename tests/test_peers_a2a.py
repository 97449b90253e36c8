"""The a2a adapter against a real A2A agent built with the official ``a2a-sdk`` 1.x (tests/peers/a2a_server.py).

Each test counts what the agent executed (``GET /executions``), so a retry
that re-runs an executor is seen, not guessed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

import httpx
import pytest
from hop_support import until_true
from peer_servers import peer

from reach_plugins import ReachClient
from reach_plugins.model import AgentDescriptor, Capability
from reach_plugins.registry.memory import MemoryRegistry
from reach_plugins.transport import StreamEvent
from transports.direct import DirectTransport


@pytest.fixture(scope="module")
def a2a_peer() -> Iterator[str]:
    with peer("a2a_server.py", "/.well-known/agent-card.json") as url:
        yield url


def executions(url: str) -> dict[str, int]:
    counts: dict[str, int] = httpx.get(f"{url}/executions").json()
    return counts


async def client_for(url: str, **options: Any) -> ReachClient:
    """A client whose one agent is the peer, reached through its card (or ``protocol_options``)."""
    registry = MemoryRegistry()
    agent = AgentDescriptor(
        name="peer",
        protocol="a2a",
        endpoints=[url],
        capabilities=[Capability(name="ask_peer", retryable=options.pop("retryable", True))],
        protocol_options=options,
    )
    await registry.register_agent(agent)
    return ReachClient(registry=registry, transport=DirectTransport())


@pytest.fixture
async def reach(a2a_peer: str) -> AsyncIterator[ReachClient]:
    """A client of the plain 1.x agent (a card with supportedInterfaces and no url)."""
    client = await client_for(f"{a2a_peer}/v1only")
    yield client
    await client.aclose()


def session() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


async def streamed(client: ReachClient, text: str) -> list[StreamEvent]:
    return [event async for event in client.stream("ask_peer", {"query": text}, session_id=session())]


async def test_a_1x_card_is_reached_with_send_message(reach: ReachClient) -> None:
    """A 1.x card (supportedInterfaces, no url) is spoken with SendMessage: the artifact's text comes back."""
    response = await reach.reach("ask_peer", {"query": "hello there"}, session_id=session())
    assert response.status == "success", response.error
    assert response.data["reply_content"] == "echo: hello there"
    assert response.data["raw_meta"]["state"] == "completed"


async def test_the_0_3_interface_is_spoken_when_preferred(a2a_peer: str) -> None:
    """protocol_options.version 0.3 picks the card's 0.3 interface (message/send), which the 1.x SDK serves too."""
    client = await client_for(a2a_peer, version="0.3")
    try:
        response = await client.reach("ask_peer", {"query": "hello old"}, session_id=session())
        events = await streamed(client, "status old")
    finally:
        await client.aclose()
    assert response.data["reply_content"] == "echo: hello old"
    assert [event.data["reply_content"] for event in events if event.kind == "data"] == ["done: status old"]


async def test_input_required_is_continued_on_the_next_reach_of_the_session(reach: ReachClient) -> None:
    """input-required returns the agent's question; the session's next reach continues that task, not a new one."""
    conversation = session()
    question = await reach.reach("ask_peer", {"query": "ask"}, session_id=conversation)
    answer = await reach.reach("ask_peer", {"query": "A1"}, session_id=conversation)
    assert (question.data["reply_content"], question.data["raw_meta"]["state"]) == ("Which order?", "input-required")
    assert answer.data["reply_content"] == "order A1 is on its way"
    assert answer.data["raw_meta"]["task_id"] == question.data["raw_meta"]["task_id"]
    after = await reach.reach("ask_peer", {"query": "plain"}, session_id=conversation)
    assert after.data["raw_meta"]["task_id"] != question.data["raw_meta"]["task_id"]


async def test_status_message_text_reaches_blocking_and_streaming_callers(reach: ReachClient) -> None:
    """A task that answers only in its final status message: both callers get the text."""
    blocking = await reach.reach("ask_peer", {"query": "status one"}, session_id=session())
    events = await streamed(reach, "status two")
    assert blocking.data["reply_content"] == "done: status one"
    assert [(e.kind, e.data["reply_content"] if e.data else None) for e in events] == [
        ("data", "done: status two"),
        ("end", None),
    ]


async def test_stream_carries_progress_then_artifact_then_end(reach: ReachClient) -> None:
    """Streaming a working task: the status text, the artifact, then end."""
    events = await streamed(reach, "hi")
    data = [(e.data["raw_meta"]["kind"], e.data["reply_content"]) for e in events if e.kind == "data"]
    assert data == [("status-update", "working on it"), ("artifact-update", "echo: hi")]
    assert events[-1].kind == "end"


@pytest.mark.parametrize("key", [None, "with a key"])
async def test_an_executor_error_runs_the_executor_once(reach: ReachClient, a2a_peer: str, key: str | None) -> None:
    """The executor raised: sent with returnImmediately, its task ends failed, a business failure run exactly once
    (with an idempotency key too: the agent ran it and failed, nothing was lost on the way)."""
    before = executions(a2a_peer).get("crash", 0)
    idempotency_key = f"k-{uuid.uuid4().hex}" if key else None
    response = await reach.reach("ask_peer", {"query": "crash"}, session_id=session(), idempotency_key=idempotency_key)
    assert response.status == "fail"
    assert response.error is not None and response.error.type == "business"
    assert executions(a2a_peer).get("crash", 0) - before == 1


async def test_a_failed_task_is_a_business_error_with_its_text(reach: ReachClient, a2a_peer: str) -> None:
    """A task that ends failed is a business failure carrying its status text, executed once."""
    before = executions(a2a_peer).get("refuse", 0)
    response = await reach.reach("ask_peer", {"query": "refuse"})
    assert response.status == "fail"
    assert response.error is not None
    assert (response.error.type, response.error.message) == ("business", "cannot do that")
    assert executions(a2a_peer).get("refuse", 0) - before == 1


async def test_leaving_a_stream_cancels_the_a2a_task(reach: ReachClient, a2a_peer: str) -> None:
    """The caller stops reading a working task's stream: the agent receives CancelTask for that task."""
    before = executions(a2a_peer).get("cancel", 0)
    async with aclosing(reach.stream("ask_peer", {"query": "slow work"}, session_id=session())) as events:
        async for event in events:
            assert event.kind == "data" and event.data["reply_content"] == "working on it"
            break
    await until_true(lambda: asyncio.to_thread(lambda: executions(a2a_peer).get("cancel", 0) - before == 1))
