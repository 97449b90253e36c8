"""The agent's Starlette app: thin HTTP glue around :class:`~reach_plugins.agent.agent.ReachAgent`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from reach_plugins.agent.a2a import CARD_PATH, RPC_PATH, A2AServer
from reach_plugins.agent.agent import Outcome
from reach_plugins.agent.cancellation import while_connected
from reach_plugins.errors import ReachError
from reach_plugins.server.inbound import read_body

if TYPE_CHECKING:
    from reach_plugins.agent.agent import ReachAgent


_CLOSE = {"Connection": "close"}
"""Refused before the body was read whole: the connection ends, so the rest is never read."""


def _json(outcome: Outcome) -> Response:
    return Response(outcome.encoded, outcome.status, outcome.headers, media_type="application/json")


async def _body(agent: ReachAgent, request: Request, large: asyncio.Semaphore) -> bytes | Outcome:
    """The body, read within the agent's byte and time budgets; a refusal (413/408) past them."""
    limits = agent.limits
    try:
        return await read_body(
            request.stream(), request.headers, limit=limits.max_body, timeout=limits.body_timeout, large=large
        )
    except ReachError as exc:
        error = {"type": exc.error_type, "message": exc.message}
        return Outcome(exc.http_status, {"request_id": None, "status": "fail", "data": None, "error": error}, _CLOSE)


def build_app(agent: ReachAgent) -> Starlette:
    """``POST /reach``, ``POST /reach/stream`` (SSE), ``GET /healthz`` (alive), ``GET /readyz`` (takes work).

    A2A too (:mod:`reach_plugins.agent.a2a`): the agent card and ``POST /a2a``.
    """
    large = agent.limits.places()

    async def reach(request: Request) -> Response:
        refused = await agent.authenticate(request.headers)
        if isinstance(refused, Outcome):  # authenticated before the body is read (DESIGN.md 11.5)
            return _json(refused)
        raw = await _body(agent, request, large)
        if isinstance(raw, Outcome):
            return _json(raw)
        outcome = await while_connected(request.receive, agent.handle(raw, request.headers))
        return _json(outcome) if outcome is not None else Response(status_code=499)

    async def reach_stream(request: Request) -> Response:
        refused = await agent.authenticate(request.headers)
        if isinstance(refused, Outcome):
            return _json(refused)
        raw = await _body(agent, request, large)
        answer = raw if isinstance(raw, Outcome) else await agent.open_stream(raw, request.headers)
        if isinstance(answer, Outcome):
            return _json(answer)
        return StreamingResponse(answer, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "alive", "agent": agent.name})

    async def readyz(request: Request) -> Response:
        if await agent.is_ready():
            return JSONResponse({"status": "ready", "agent": agent.name})
        state = "draining" if agent.draining else "not ready"
        return JSONResponse({"status": state, "agent": agent.name}, status_code=503)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with agent.lifespan():
            yield

    a2a = A2AServer(agent)
    routes = [
        Route("/reach", reach, methods=["POST"]),
        Route(CARD_PATH, a2a.card_route, methods=["GET"]),
        Route(RPC_PATH, a2a.rpc_route, methods=["POST"]),
        Route("/reach/stream", reach_stream, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
