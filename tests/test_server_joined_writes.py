"""A response's head leaves with its body in one write, and never waits on a stream (server/guard.py ``_Joined``).

Every server of ours runs on the guarded uvicorn protocol. Here it serves on
127.0.0.1 in the test's own loop, over a transport that records each write
the protocol makes, and a raw socket client reads what was written.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from uvicorn.server import ServerState

from reach_plugins.agent import ReachAgent
from reach_plugins.server.uvicorn import uvicorn_config

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
TIMEOUT = 10.0


class _Recorder:
    """A real transport that keeps each write made to it."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


@asynccontextmanager
async def served(app: Any) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter, list[_Recorder]]]:
    """``app`` on our guarded protocol; a connection to it and the recorders of the server's connections."""
    config = uvicorn_config(app, lifespan="off")
    config.load()
    recorders: list[_Recorder] = []

    class Recording(config.http_protocol_class):  # type: ignore[misc,name-defined]
        def connection_made(self, transport: asyncio.Transport) -> None:
            recorders.append(_Recorder(transport))
            super().connection_made(recorders[-1])

    state = ServerState()
    server = await asyncio.get_running_loop().create_server(lambda: Recording(config, state, {}), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer, recorders
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)
    lines = head.lower().split(b"\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:")), 0)
    return head, await asyncio.wait_for(reader.readexactly(length), TIMEOUT)


async def test_a_small_answer_is_one_write_of_head_and_body() -> None:
    agent = ReachAgent("orders", tokens="open")

    @agent.capability("echo")
    async def echo(order_id: str) -> dict[str, str]:
        return {"order_id": order_id}

    body = b'{"capability":"echo","payload":{"order_id":"A1"}}'
    request = (
        b"POST /reach HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    async with served(agent.app) as (reader, writer, recorders):
        for turn in range(1, 6):  # keep-alive: every answer on the connection is joined, not only the first
            writer.write(request)
            head, answer = await _answer(reader)
            assert head.startswith(b"HTTP/1.1 200") and b'"order_id":"A1"' in answer
            (recorder,) = recorders
            assert len(recorder.writes) == turn
            assert recorder.writes[-1] == head + answer


async def test_a_streams_head_leaves_before_its_first_event() -> None:
    release = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await asyncio.wait_for(release.wait(), TIMEOUT)
        await send({"type": "http.response.body", "body": b"data: released\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async with served(app) as (reader, writer, recorders):
        writer.write(b"GET /events HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT)  # while the app still waits
        assert head.startswith(b"HTTP/1.1 200") and not release.is_set()
        release.set()
        rest = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), TIMEOUT)
        assert b"data: released" in rest
        assert recorders[0].writes[0] == head


async def test_an_answer_without_a_body_is_not_held() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with served(app) as (reader, writer, recorders):
        for _ in range(3):
            writer.write(b"DELETE /thing HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            head, rest = await _answer(reader)
            assert head.startswith(b"HTTP/1.1 204") and rest == b""
        assert len(recorders[0].writes) == 3
