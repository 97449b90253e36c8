"""Long A2A tasks against the official a2a-sdk 1.x agent (tests/peers/a2a_server.py): poll, give up, cancel.

The peer's ``slow`` task works for 30 s unless cancelled. A blocking reach
with ``timeout_ms=2000`` sends the message with ``returnImmediately``, polls
``GetTask`` and, when its time is up, sends ``CancelTask``: the agent's task
ends ``canceled`` instead of running on. The same holds when the caller
leaves a stream and closes its client at once, and when the conversation
closes. Each case runs over JSON-RPC (``/v1only``) and over HTTP+JSON
(``/rest``, a card that offers no JSON-RPC). The peer counts what it served
(``GET /executions``) and the states its store saved (``GET /tasks-of/{context}``).
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hop_support import until_true
from peer_servers import peer

from reach_plugins import ReachClient
from reach_plugins.errors import SessionClosed
from reach_plugins.model import AgentDescriptor, Capability
from reach_plugins.registry.memory import MemoryRegistry
from transports.direct import DirectTransport

BINDINGS = ["/v1only", "/rest"]
"""The JSON-RPC-only agent and the HTTP+JSON-only one."""


@pytest.fixture(scope="module")
def a2a_peer() -> Iterator[str]:
    with peer("a2a_server.py", "/.well-known/agent-card.json") as url:
        yield url


def counts(url: str) -> dict[str, int]:
    found: dict[str, int] = httpx.get(f"{url}/executions").json()
    return found


def states(url: str, context: str) -> list[str]:
    found: list[str] = httpx.get(f"{url}/tasks-of/{context}").json()
    return found


async def client_for(url: str) -> ReachClient:
    registry = MemoryRegistry()
    agent = AgentDescriptor(name="peer", protocol="a2a", endpoints=[url], capabilities=[Capability(name="ask_peer")])
    await registry.register_agent(agent)
    return ReachClient(registry=registry, transport=DirectTransport(), sessions="memory://")


def session() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


async def cancelled(url: str, context: str, before: dict[str, int]) -> None:
    """Wait (bounded) until the agent served one CancelTask and its only task of ``context`` is canceled."""

    def seen() -> bool:
        now = counts(url)
        return now.get("cancel_task", 0) - before.get("cancel_task", 0) == 1 and states(url, context) == [
            "TASK_STATE_CANCELED"
        ]

    await until_true(lambda: asyncio.to_thread(seen), within=10.0)


async def polled(url: str, before: dict[str, int]) -> None:
    """Wait (bounded) until the agent served a GetTask since ``before``."""
    await until_true(lambda: asyncio.to_thread(lambda: counts(url).get("get_task", 0) > before.get("get_task", 0)))


class Unretrieved:
    """Collects what the loop reports as unhandled (``Task exception was never retrieved`` among them)."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.loop = asyncio.get_running_loop()
        self.previous = self.loop.get_exception_handler()
        self.loop.set_exception_handler(lambda loop, report: self.reports.append(report))

    async def settle(self) -> list[str]:
        """Let finalisers run (generators, tasks), restore the handler, and say what was reported."""
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0.05)
        self.loop.set_exception_handler(self.previous)
        return [f"{report.get('message')}: {report.get('exception')!r}" for report in self.reports]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_quick_task_answers_a_blocking_reach(a2a_peer: str, binding: str) -> None:
    """A short task sent with returnImmediately is polled to its answer, over either binding."""
    before = counts(a2a_peer)
    client = await client_for(a2a_peer + binding)
    try:
        response = await client.reach("ask_peer", {"query": "hello there"}, session_id=session())
    finally:
        await client.aclose()
    assert response.status == "success", response.error
    assert response.data["reply_content"] == "echo: hello there"
    assert response.data["raw_meta"]["state"] == "completed"
    after = counts(a2a_peer)
    assert after.get("return_immediately", 0) - before.get("return_immediately", 0) == 1


async def test_http_json_carries_failures_and_streams(a2a_peer: str) -> None:
    """Over HTTP+JSON: an executor crash is a business error run once; a stream gives the artifact, then its end."""
    before = counts(a2a_peer)
    client = await client_for(a2a_peer + "/rest")
    try:
        crashed = await client.reach("ask_peer", {"query": "crash now"}, session_id=session())
        events = [event async for event in client.stream("ask_peer", {"query": "stream me"}, session_id=session())]
    finally:
        await client.aclose()
    assert crashed.status == "fail" and crashed.error is not None and crashed.error.type == "business"
    assert counts(a2a_peer).get("crash", 0) - before.get("crash", 0) == 1
    assert [event.kind for event in events][-1] == "end"
    assert "echo: stream me" in [event.data["reply_content"] for event in events if event.kind == "data"]


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_blocking_reach_of_a_long_task_polls_then_cancels_it(a2a_peer: str, binding: str) -> None:
    """timeout_ms=2000 on a 30 s task: GetTask polled within the deadline, then CancelTask; the task is canceled."""
    before, conversation = counts(a2a_peer), session()
    client = await client_for(a2a_peer + binding)
    started = time.monotonic()
    try:
        response = await client.reach("ask_peer", {"query": "slow work"}, session_id=conversation, timeout_ms=2000)
        took = time.monotonic() - started
        await cancelled(a2a_peer, conversation, before)
    finally:
        await client.aclose()
    assert response.status == "timeout", response
    assert 1.9 <= took < 3.0
    after = counts(a2a_peer)
    assert after.get("slow", 0) - before.get("slow", 0) == 1
    assert after.get("get_task", 0) - before.get("get_task", 0) >= 2
    assert after.get("cancel", 0) - before.get("cancel", 0) == 1


@pytest.mark.parametrize("binding", BINDINGS)
async def test_closing_the_client_right_after_leaving_a_stream_still_cancels(a2a_peer: str, binding: str) -> None:
    """A stream left after its first event, the client closed at once: CancelTask reaches the agent, nothing leaks."""
    before, conversation = counts(a2a_peer), session()
    unretrieved = Unretrieved()
    client = await client_for(a2a_peer + binding)
    events = client.stream("ask_peer", {"query": "slow work"}, session_id=conversation)
    async for event in events:
        assert event.kind == "data" and event.data["reply_content"] == "working on it"
        break
    await client.aclose()
    del events
    await cancelled(a2a_peer, conversation, before)
    assert await unretrieved.settle() == []


async def test_closing_the_session_cancels_a_polled_task(a2a_peer: str) -> None:
    """close_session while a blocking reach polls: the reach ends and CancelTask reaches the agent."""
    before, conversation = counts(a2a_peer), session()
    client = await client_for(a2a_peer + "/v1only")
    try:
        reach = asyncio.ensure_future(
            client.reach("ask_peer", {"query": "slow work"}, session_id=conversation, timeout_ms=20_000)
        )
        await polled(a2a_peer, before)
        await client.close_session(conversation)
        with pytest.raises(SessionClosed, match="closed while the call was in flight"):
            await asyncio.wait_for(reach, 5.0)
        await cancelled(a2a_peer, conversation, before)
    finally:
        await client.aclose()


async def test_closing_the_client_cancels_a_polled_task(a2a_peer: str) -> None:
    """aclose while a blocking reach polls: CancelTask is flushed before the pools close, nothing leaks."""
    before, conversation = counts(a2a_peer), session()
    unretrieved = Unretrieved()
    client = await client_for(a2a_peer + "/rest")
    reach = asyncio.ensure_future(
        client.reach("ask_peer", {"query": "slow work"}, session_id=conversation, timeout_ms=20_000)
    )
    await polled(a2a_peer, before)
    await client.aclose()
    await cancelled(a2a_peer, conversation, before)
    response = await asyncio.wait_for(reach, 5.0)
    assert response.status == "fail" and response.error is not None and response.error.type == "session_closed"
    assert counts(a2a_peer).get("slow", 0) - before.get("slow", 0) == 1  # not sent again after the close
    assert await unretrieved.settle() == []
