"""The a2a adapter against a genuine A2A 0.3 agent (``a2a-sdk`` 0.3.26, tests/peers/a2a03_server.py).

The 1.x SDK's compat mode is tested in test_peers_a2a.py; this is the older
SDK itself, as agents still deployed on 0.3 run it.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from peer_servers import A2A03_PYTHON, peer

from reach_plugins import ReachClient
from reach_plugins.model import AgentDescriptor
from reach_plugins.registry.memory import MemoryRegistry
from transports.direct import DirectTransport


@pytest.fixture(scope="module")
def a2a03_peer() -> Iterator[str]:
    with peer("a2a03_server.py", "/.well-known/agent-card.json", python=A2A03_PYTHON) as url:
        yield url


@pytest.fixture
async def reach(a2a03_peer: str) -> AsyncIterator[ReachClient]:
    registry = MemoryRegistry()
    await registry.register_agent(
        AgentDescriptor(name="peer03", protocol="a2a", endpoints=[a2a03_peer], capabilities=["ask_peer"])
    )
    async with ReachClient(registry=registry, transport=DirectTransport()) as client:
        yield client


def session() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


async def test_a_0_3_card_is_reached_with_message_send(reach: ReachClient) -> None:
    """A 0.3 card (url, no supportedInterfaces) is spoken with message/send."""
    response = await reach.reach("ask_peer", {"query": "hello"}, session_id=session())
    assert (response.status, response.data["reply_content"]) == ("success", "echo: hello")


async def test_input_required_is_continued_on_0_3(reach: ReachClient) -> None:
    """The session's next reach continues the input-required task with its taskId."""
    conversation = session()
    question = await reach.reach("ask_peer", {"query": "ask"}, session_id=conversation)
    answer = await reach.reach("ask_peer", {"query": "B2"}, session_id=conversation)
    assert question.data["reply_content"] == "Which order?"
    assert answer.data["reply_content"] == "order B2 is on its way"
    assert answer.data["raw_meta"]["task_id"] == question.data["raw_meta"]["task_id"]


async def test_status_text_is_streamed_on_0_3(reach: ReachClient) -> None:
    """message/stream of a status-only completion carries the status text before end."""
    events = [event async for event in reach.stream("ask_peer", {"query": "status only"}, session_id=session())]
    assert [e.data["reply_content"] for e in events if e.kind == "data"] == ["done: status only"]
    assert events[-1].kind == "end"


async def test_an_executor_error_runs_once_on_0_3(reach: ReachClient, a2a03_peer: str) -> None:
    """-32603 from the 0.3 SDK is not retried without a key: the executor ran once."""
    before = httpx.get(f"{a2a03_peer}/executions").json().get("crash", 0)
    response = await reach.reach("ask_peer", {"query": "crash"})
    assert response.status == "fail"
    assert httpx.get(f"{a2a03_peer}/executions").json().get("crash", 0) - before == 1
