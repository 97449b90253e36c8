"""The bare server stacks :mod:`bench_stack` compares, each an echo server or a forwarder to one upstream.

One process per candidate, chosen by the environment: ``BENCH_STACK``
(``starlette``, ``aiohttp``, ``httptools``, ``layer``; granian imports
:func:`rsgi_app` itself), ``BENCH_MODE`` (``echo``: read the body, answer
:data:`REPLY`; ``forward``: send the body to ``BENCH_UPSTREAM`` and answer
what it answered) and ``BENCH_PORT``. Every forwarder uses one pooled
aiohttp client session, so the candidates differ in their serving side only.

    BENCH_STACK=aiohttp BENCH_MODE=echo BENCH_PORT=8001 python benchmarks/stack_servers.py
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from typing import Any, cast

import aiohttp
import httptools
import uvloop

REPLY = b'{"request_id":"r","status":"success","data":{"order_id":"A1"},"error":null}'
"""What every echo answers: the agent SDK's reply to the bench body, so the gateway can forward to an echo too."""
JSON_HEADERS = {"Content-Type": "application/json"}
MODE = os.environ.get("BENCH_MODE", "echo")
PORT = int(os.environ.get("BENCH_PORT", "0"))
UPSTREAM = os.environ.get("BENCH_UPSTREAM", "")
_session: aiohttp.ClientSession | None = None


async def relay(body: bytes) -> tuple[int, bytes]:
    """Forward ``body`` to the upstream over the process's one pooled session; its status and body."""
    global _session
    if _session is None:
        _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
    async with _session.post(UPSTREAM, data=body, headers=JSON_HEADERS) as answer:
        return answer.status, await answer.read()


async def answer(body: bytes) -> tuple[int, bytes]:
    """The candidate's work for one request body: the echo's fixed reply, or the upstream's."""
    return (200, REPLY) if MODE == "echo" else await relay(body)


def starlette_app() -> Any:
    """Today's stack, bare: a Starlette route (uvicorn serves it)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    async def reach(request: Request) -> Response:
        status, data = await answer(await request.body())
        return Response(data, status, media_type="application/json")

    return Starlette(routes=[Route("/reach", reach, methods=["POST"])])


def layer_app() -> Any:
    """Our server layer (reach_plugins/server/): an authenticated route, its body read in budget, parsed strictly."""
    from starlette.requests import Request
    from starlette.responses import Response

    from reach_plugins.server.layer import JSON, Inbound, ServerApp, ServerRoute

    async def anyone(request: Request, headers: Mapping[str, str]) -> None:
        return None

    async def reach(inbound: Inbound) -> Response:
        body = json.dumps(inbound.body, separators=(",", ":")).encode() if MODE == "forward" else b""
        status, data = await answer(body)
        return Response(data, status, media_type="application/json")

    return ServerApp([ServerRoute("/reach", ("POST",), reach, auth=anyone, body=JSON)], hot="/reach")


async def rsgi_app(scope: Any, protocol: Any) -> None:
    """granian's RSGI interface: the body is one await, the answer one call."""
    status, data = await answer(await protocol())
    protocol.response_bytes(status, [("content-type", "application/json")], data)


async def aiohttp_main() -> None:
    """aiohttp.web serving, aiohttp forwarding: one loop, one C parser."""
    from aiohttp import web

    async def reach(request: web.Request) -> web.Response:
        status, data = await answer(await request.read())
        return web.Response(body=data, status=status, content_type="application/json")

    app = web.Application()
    app.router.add_post("/reach", reach)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", PORT).start()
    await asyncio.Event().wait()


class _Raw(asyncio.Protocol):
    """A raw asyncio protocol on httptools: keep-alive HTTP/1.1, one request at a time per connection."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self.parser = httptools.HttpRequestParser(self)
        self.body: list[bytes] = []
        self.pending: asyncio.Task[None] | None = None

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        if MODE == "echo":
            self.write(200, REPLY)
        else:
            self.pending = asyncio.ensure_future(self.forward(body))

    async def forward(self, body: bytes) -> None:
        self.write(*await relay(body))

    def write(self, status: int, data: bytes) -> None:
        head = b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (status, len(data))
        self.transport.write(head + data)


async def httptools_main() -> None:
    server = await asyncio.get_running_loop().create_server(_Raw, "127.0.0.1", PORT)
    await server.serve_forever()


def main() -> None:
    stack = os.environ["BENCH_STACK"]
    if stack == "aiohttp":
        uvloop.run(aiohttp_main())
    elif stack == "httptools":
        uvloop.run(httptools_main())
    else:
        import uvicorn

        from reach_plugins.server.uvicorn import uvicorn_config

        if stack == "layer":  # our guarded httptools protocol, our defaults
            uvicorn.Server(uvicorn_config(layer_app(), port=PORT, lifespan="off")).run()
        else:
            uvicorn.run(
                starlette_app(),
                host="127.0.0.1",
                port=PORT,
                loop="uvloop",
                http="httptools",
                log_level="warning",
                access_log=False,
            )


if __name__ == "__main__":
    main()
