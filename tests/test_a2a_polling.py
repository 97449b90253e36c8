"""A polled A2A task whose agent vanishes: the work was delivered, so its outcome is unknown, never "not delivered".

Each instance is a one-shot A2A 1.x agent on a raw socket of 127.0.0.1: it
answers ``SendMessage`` with a ``working`` task, closes the connection and
stops listening, so the ``GetTask`` that follows meets a refused connect. Were
that read as "not delivered", the core would fail over and send the work again
to the other instance (a second run of a capability that is not retryable).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from reach_plugins import ReachClient
from reach_plugins.model import AgentDescriptor, Capability, Instance
from reach_plugins.registry.memory import MemoryRegistry
from transports.direct import DirectTransport


class OneShotAgent:
    """Answers one request with a working task, then goes away; counts the messages it was sent."""

    def __init__(self) -> None:
        self.messages = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        request = json.loads(await reader.readexactly(length))
        self.messages += request["method"] == "SendMessage"
        task = {"task": {"id": "t-1", "contextId": "c-1", "status": {"state": "TASK_STATE_WORKING"}}}
        body = json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": task}).encode()
        head_out = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        writer.write(head_out.encode() + b"Connection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()
        assert self.server is not None
        self.server.close()  # nobody listens any more: the poll's connect is refused


@pytest.fixture
async def agents() -> AsyncIterator[list[OneShotAgent]]:
    found = [OneShotAgent(), OneShotAgent()]
    yield found
    for agent in found:
        if agent.server is not None:
            agent.server.close()


async def test_a_poll_that_cannot_connect_leaves_the_outcome_unknown(agents: list[OneShotAgent]) -> None:
    """The task was taken, then GetTask was refused: the reach fails 'transient' (unknown) and is not sent again."""
    registry = MemoryRegistry()
    capability = Capability(name="ask_peer", retryable=False)
    options = {"url": "/a2a", "version": "1.0"}
    await registry.register_agent(
        AgentDescriptor(name="peer", protocol="a2a", capabilities=[capability], protocol_options=options)
    )
    for n, agent in enumerate(agents):
        endpoint = await agent.start()
        await registry.register_instance(Instance(agent="peer", instance_id=f"peer-{n}", endpoint=endpoint))
    client = ReachClient(registry=registry, transport=DirectTransport())
    try:
        response = await client.reach("ask_peer", {"query": "work"}, timeout_ms=5000)
    finally:
        await client.aclose()
    assert sum(agent.messages for agent in agents) == 1
    assert response.status == "fail" and response.error is not None
    assert response.error.type == "transient" and "could not be polled" in response.error.message
