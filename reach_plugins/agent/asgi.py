"""The agent's app: its routes declared through the server layer, thin HTTP glue around a ReachAgent.

The layer asks the agent's token gate before a byte of the body is read,
reads the body within the agent's byte and time budgets and parses it into
the shared :class:`~reach_plugins.wire.body.WireBody` (the gateway's and the
node's body model too); the handlers only run checked requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from reach_plugins.agent.a2a import A2AServer
from reach_plugins.agent.a2a_card import CARD_PATH, REST_PATH, RPC_PATH, CardRoute
from reach_plugins.agent.a2a_jsonrpc import JsonRpcRoute
from reach_plugins.agent.a2a_rest import RestRoutes
from reach_plugins.agent.cancellation import while_connected
from reach_plugins.agent.outcome import Outcome, fail
from reach_plugins.errors import ReachError
from reach_plugins.server.inbound import BodyPlaces, InputLimits
from reach_plugins.server.layer import JSON, OPEN, Authenticate, Handler, Inbound, Refuse, ServerApp, ServerRoute, Stage
from reach_plugins.wire.body import WireBody, check_deadline

if TYPE_CHECKING:
    from reach_plugins.agent.face import Served

_EXPECTED = 'the body must be a JSON object with "capability" and "payload"'


def _json(outcome: Outcome) -> Response:
    return Response(outcome.encoded, outcome.status, outcome.headers, media_type="application/json")


def _refuse(exc: ReachError, stage: Stage) -> Response:
    """A refusal of the server layer in the agent's reply shape (the parse problem says what the body must be)."""
    message = f"{exc.message}; {_EXPECTED}" if stage == "parse" else exc.message
    return _json(fail(None, exc.http_status, exc.error_type, message))


def _a2a_routes(a2a: A2AServer, agent: Served, auth: Authenticate, large: BodyPlaces) -> list[ServerRoute]:
    """The A2A paths: the card, JSON-RPC at ``/a2a`` and ``/a2a/``, HTTP+JSON under ``/a2a/rest`` (one server
    behind both bindings; bodies must be declared JSON, so a wrong Content-Type is ContentTypeNotSupported)."""
    rpc, rest = JsonRpcRoute(a2a), RestRoutes(a2a)
    posts: list[tuple[str, Handler, Refuse]] = [
        (RPC_PATH, rpc, rpc.refuse),
        (RPC_PATH + "/", rpc, rpc.refuse),
        (REST_PATH + "/message:send", rest.send, rest.refuse),
        (REST_PATH + "/message:stream", rest.stream, rest.refuse),
    ]
    limits = _media_limits(agent)
    return [
        ServerRoute(CARD_PATH, ("GET",), CardRoute(agent), auth=OPEN),
        *(
            ServerRoute(
                path, ("POST",), run, auth=auth, body=JSON, limits=limits, large=large, json_only=True, refuse=no
            )
            for path, run, no in posts
        ),
        ServerRoute(REST_PATH + "/{path:path}", ("GET", "POST", "DELETE"), rest.tasks, auth=auth, refuse=rest.refuse),
    ]


def _media_limits(agent: Served) -> InputLimits:
    """The agent's limits for routes whose bodies carry media: room for its largest ``max_media_bytes``."""
    return agent.limits.with_media(max((cap.max_media_bytes for cap in agent.capabilities), default=0))


def build_app(agent: Served) -> ServerApp:
    """``POST /reach``, ``POST /reach/stream`` (SSE), ``GET /healthz`` (alive), ``GET /readyz`` (takes work).

    A2A too (:mod:`reach_plugins.agent.a2a`): the agent card, JSON-RPC at ``POST /a2a`` (and ``/a2a/``, as
    clients joining a path to the card's interface URL call it) and HTTP+JSON under ``/a2a/rest``.
    """
    large = agent.limits.places()

    async def caller(request: Request, headers: Mapping[str, str]) -> Any:
        """The token's claims, then the headers the agent reads as numbers (a 400 naming one, before the body)."""
        claims = await agent.authenticate(headers)
        check_deadline(headers)
        return claims

    async def reach(inbound: Inbound) -> Response:
        handled = agent.handle(inbound.body, inbound.headers, inbound.caller)
        outcome = await while_connected(inbound.request.receive, handled)
        return _json(outcome) if outcome is not None else Response(status_code=499)

    async def reach_stream(inbound: Inbound) -> Response:
        answer = await agent.open_stream(inbound.body, inbound.headers, inbound.caller)
        if isinstance(answer, Outcome):
            return _json(answer)
        return StreamingResponse(answer, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def healthz(inbound: Inbound) -> Response:
        return JSONResponse({"status": "alive", "agent": agent.name, "clock_offset_s": agent.clock_offset})

    async def readyz(inbound: Inbound) -> Response:
        if await agent.is_ready():
            return JSONResponse({"status": "ready", "agent": agent.name})
        state = "draining" if agent.draining else "not ready"
        return JSONResponse({"status": state, "agent": agent.name}, status_code=503)

    a2a = A2AServer(agent)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with agent.lifespan():
            try:
                yield
            finally:
                await a2a.close()

    limits = _media_limits(agent)
    routes = [
        ServerRoute("/reach", ("POST",), reach, auth=caller, body=WireBody, limits=limits, large=large, refuse=_refuse),
        *_a2a_routes(a2a, agent, caller, large),
        ServerRoute(
            "/reach/stream",
            ("POST",),
            reach_stream,
            auth=caller,
            body=WireBody,
            limits=limits,
            large=large,
            refuse=_refuse,
        ),
        ServerRoute("/healthz", ("GET",), healthz, auth=OPEN),
        ServerRoute("/readyz", ("GET",), readyz, auth=OPEN),
    ]
    return ServerApp(routes, lifespan=lifespan, hot="/reach")
