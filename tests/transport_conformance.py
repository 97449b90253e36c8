"""One transport test suite, run against every DirectTransport engine (see ``test_direct_conformance.py``).

A subclass sets the ``transport`` fixture; the suite drives it against a
scripted reach agent on 127.0.0.1 (whose capability names pick its
behaviour) and, for network faults, through :class:`faultproxy.FaultProxy`.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from faultproxy import FaultProxy
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reach_plugins.agent import BackgroundServer
from reach_plugins.errors import ConnectError, ConnectionLost, InvalidResponse, ReadTimeout
from reach_plugins.model import AgentDescriptor, Hop, PoolConfig, ReachRequest
from reach_plugins.transport import Call, Credential, Transport

ECHOED = (
    "traceparent",
    "idempotency-key",
    "x-reach-deadline",
    "x-reach-hops",
    "x-tenant",
    "authorization",
    "x-api-key",
)


async def _scripted(request: Request) -> Response:
    """A reach agent whose behaviour is chosen by the capability name."""
    body = json.loads(await request.body())
    name = body["capability"]
    if name == "echo":
        headers = {key: request.headers[key] for key in ECHOED if key in request.headers}
        data = {"headers": headers, "body": body, "query": dict(request.query_params)}
        return JSONResponse({"request_id": body["request_id"], "status": "success", "data": data, "error": None})
    if name == "business":
        error = {"type": "business", "message": "order A1 is already shipped"}
        return JSONResponse({"request_id": body["request_id"], "status": "fail", "data": None, "error": error})
    if name == "busy":
        return Response("slow down", 429, {"Retry-After": "2"})
    if name == "unavailable":
        return Response(b"", 503, {"Retry-After": "1"})
    if name == "forbidden":
        return JSONResponse({"error": {"type": "rejected", "message": "tenant t2 may not"}}, 403)
    if name == "missing":
        return Response("not here", 404)
    if name == "garbage":
        return Response("<html>oops</html>", 200, media_type="text/html")
    if name == "slow":
        await asyncio.sleep(body["payload"]["seconds"])
        return JSONResponse({"request_id": body["request_id"], "status": "success", "data": "late", "error": None})
    if name == "stall":
        await asyncio.wait_for(request.receive(), 10)
        return Response(b"", 204)
    return Response("unknown", 400)


def scripted_app() -> Starlette:
    return Starlette(routes=[Route("/reach", _scripted, methods=["POST"])])


def make_call(
    url: str,
    capability: str,
    payload: dict[str, Any] | None = None,
    *,
    timeout: float = 3.0,
    headers: dict[str, str] | None = None,
    credential: Credential | None = None,
    pool: PoolConfig | None = None,
    **request: Any,
) -> Call:
    """A call to the agent at ``url``, as the core would prepare it."""
    agent = AgentDescriptor(name="scripted", endpoints=[url], capabilities=[capability], pool=pool or PoolConfig())
    return Call(
        request=ReachRequest(capability=capability, payload=payload or {}, **request),
        agent=agent,
        instance=agent.static_instances()[0],
        timeout=timeout,
        headers=headers or {},
        credential=credential or Credential(),
    )


def closed_port() -> int:
    """A port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class TransportConformance:
    """What every DirectTransport engine must do; subclasses provide the ``transport`` fixture."""

    @pytest.fixture(scope="class")
    @classmethod
    def server(cls) -> Iterator[BackgroundServer]:
        with BackgroundServer(scripted_app()) as server:
            yield server

    @pytest.fixture
    async def proxy(self, server: BackgroundServer) -> AsyncIterator[FaultProxy]:
        async with FaultProxy((server.host, server.port)) as proxy:
            yield proxy

    async def test_success_returns_the_agents_data(self, transport: Transport, server: BackgroundServer) -> None:
        """A 200 success body becomes a success Reply carrying data, agent and instance."""
        reply = await transport.send(make_call(server.url, "echo", {"order_id": "A1"}))
        assert reply.status == "success"
        assert reply.status_code == 200
        assert reply.data["body"]["payload"] == {"order_id": "A1"}
        assert (reply.agent, reply.instance) == ("scripted", "scripted-0")

    async def test_body_follows_the_wire_protocol(self, transport: Transport, server: BackgroundServer) -> None:
        """The request body carries the fields of DESIGN.md section 4."""
        call = make_call(server.url, "echo", {"x": 1}, session_id="s-1", tenant="demo", idempotency_key="k-1")
        body = (await transport.send(call)).data["body"]
        assert body["request_id"] == call.request.request_id
        assert (body["capability"], body["session_id"], body["tenant"], body["idempotency_key"]) == (
            "echo",
            "s-1",
            "demo",
            "k-1",
        )
        assert 0 < body["deadline_ms"] <= 3000

    async def test_business_error_is_a_fail_reply(self, transport: Transport, server: BackgroundServer) -> None:
        """An agent's business refusal comes back as status fail with error type business."""
        reply = await transport.send(make_call(server.url, "business"))
        assert reply.status == "fail"
        assert reply.error is not None
        assert (reply.error.type, reply.error.message) == ("business", "order A1 is already shipped")

    @pytest.mark.parametrize(("capability", "code", "wait"), [("busy", 429, 2.0), ("unavailable", 503, 1.0)])
    async def test_overload_is_transient_with_retry_after(
        self, transport: Transport, server: BackgroundServer, capability: str, code: int, wait: float
    ) -> None:
        """429 and 503 are transient failures that carry the Retry-After delay."""
        reply = await transport.send(make_call(server.url, capability))
        assert (reply.status, reply.status_code, reply.retry_after) == ("fail", code, wait)
        assert reply.error is not None
        assert reply.error.type == "transient"

    @pytest.mark.parametrize(("capability", "kind"), [("forbidden", "rejected"), ("missing", "business")])
    async def test_client_errors_are_business_unless_the_body_says(
        self, transport: Transport, server: BackgroundServer, capability: str, kind: str
    ) -> None:
        """A 4xx is a business failure, unless its body names another error type."""
        reply = await transport.send(make_call(server.url, capability))
        assert reply.status == "fail"
        assert reply.error is not None
        assert reply.error.type == kind

    async def test_garbage_body_raises_invalid_response(self, transport: Transport, server: BackgroundServer) -> None:
        """A 200 that is not a reach reply is InvalidResponse, never data."""
        with pytest.raises(InvalidResponse, match="not JSON"):
            await transport.send(make_call(server.url, "garbage"))

    async def test_connect_refused_raises_connect_error(self, transport: Transport) -> None:
        """Nobody listening is a ConnectError that says the agent never saw the request."""
        with pytest.raises(ConnectError) as caught:
            await transport.send(make_call(f"http://127.0.0.1:{closed_port()}", "echo"))
        assert caught.value.reached_agent is False

    async def test_reset_raises_connection_lost(self, transport: Transport, proxy: FaultProxy) -> None:
        """A connection reset after the request went out is ConnectionLost (the agent may have run it)."""
        proxy.mode = "reset"
        with pytest.raises(ConnectionLost) as caught:
            await transport.send(make_call(proxy.url, "echo"))
        assert caught.value.reached_agent is True

    async def test_lost_reply_raises_connection_lost(self, transport: Transport, proxy: FaultProxy) -> None:
        """A reply lost after the agent executed is ConnectionLost, not a success or a timeout."""
        proxy.mode = "lose_reply"
        with pytest.raises(ConnectionLost):
            await transport.send(make_call(proxy.url, "echo"))

    async def test_stalled_agent_raises_read_timeout(self, transport: Transport, server: BackgroundServer) -> None:
        """An agent that never answers is a ReadTimeout once the attempt's time is spent."""
        with pytest.raises(ReadTimeout):
            await transport.send(make_call(server.url, "stall", timeout=0.2))

    async def test_blackhole_raises_read_timeout(self, transport: Transport, proxy: FaultProxy) -> None:
        """A network that swallows the request is a ReadTimeout too."""
        proxy.mode = "blackhole"
        with pytest.raises(ReadTimeout):
            await transport.send(make_call(proxy.url, "echo", timeout=0.2))

    async def test_agent_down_then_up(self, transport: Transport, proxy: FaultProxy) -> None:
        """A downed agent refuses connections; once up again, calls succeed on the same transport."""
        await proxy.down()
        with pytest.raises(ConnectError):
            await transport.send(make_call(proxy.url, "echo"))
        await proxy.up()
        assert (await transport.send(make_call(proxy.url, "echo"))).status == "success"

    async def test_latency_within_the_timeout_succeeds(self, transport: Transport, proxy: FaultProxy) -> None:
        """Added latency below the attempt's timeout only slows the call down."""
        proxy.latency = 0.02
        assert (await transport.send(make_call(proxy.url, "echo", timeout=2.0))).status == "success"

    async def test_core_headers_are_carried(self, transport: Transport, server: BackgroundServer) -> None:
        """The propagation headers prepared by the core reach the agent unchanged."""
        prepared = {
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "Idempotency-Key": "wo-77",
            "X-Reach-Deadline": "2500",
            "X-Reach-Hops": "router/triage",
            "X-Tenant": "demo",
        }
        reply = await transport.send(make_call(server.url, "echo", headers=prepared))
        assert reply.data["headers"] == {name.lower(): value for name, value in prepared.items()}

    async def test_missing_headers_are_derived_from_the_request(
        self, transport: Transport, server: BackgroundServer
    ) -> None:
        """Without core headers, deadline, idempotency key, tenant and hops come from the call itself."""
        hops = [Hop(agent="router", capability="triage"), Hop(agent="orders", capability="query_order")]
        call = make_call(server.url, "echo", timeout=1.5, idempotency_key="k-9", tenant="acme", hops=hops)
        headers = (await transport.send(call)).data["headers"]
        assert headers["idempotency-key"] == "k-9"
        assert headers["x-tenant"] == "acme"
        assert headers["x-reach-hops"] == "router/triage,orders/query_order"
        assert 1000 < int(headers["x-reach-deadline"]) <= 1500

    @pytest.mark.parametrize(
        ("credential", "where", "name", "value"),
        [
            (Credential(type="header", key="X-Api-Key", value="s3cret"), "headers", "x-api-key", "s3cret"),
            (Credential(type="bearer", value="tok"), "headers", "authorization", "Bearer tok"),
            (Credential(type="query", key="api_key", value="q1"), "query", "api_key", "q1"),
        ],
    )
    async def test_credentials_are_injected(
        self, transport: Transport, server: BackgroundServer, credential: Credential, where: str, name: str, value: str
    ) -> None:
        """Header, bearer and query credentials travel where their type says."""
        reply = await transport.send(make_call(server.url, "echo", credential=credential))
        assert reply.data[where][name] == value

    async def test_keep_alive_reuses_one_connection(self, transport: Transport, proxy: FaultProxy) -> None:
        """Sequential calls to one agent share one pooled HTTP/1.1 connection."""
        for _ in range(5):
            await transport.send(make_call(proxy.url, "echo"))
        assert proxy.connections == 1

    async def test_pool_is_bounded_by_max_conns(self, transport: Transport, proxy: FaultProxy) -> None:
        """Concurrent calls never open more connections than the agent's pool allows."""
        pool = PoolConfig(max_conns=2)
        calls = [make_call(proxy.url, "slow", {"seconds": 0.05}, pool=pool) for _ in range(6)]
        replies = await asyncio.gather(*(transport.send(call) for call in calls))
        assert all(reply.data == "late" for reply in replies)
        assert proxy.connections == 2
