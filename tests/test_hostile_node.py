"""The node under hostile callers: allowed callbacks only, tickets per tenant, named field errors, slow sockets."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hop_support import TOKENS, Agent, demo_tenants, serve_agents, write_config
from hostile_support import closed_by_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from reach_plugins.agent import BackgroundServer
from reach_plugins.node import NodeServer, build_node
from reach_plugins.wire.proto import reach_pb2 as pb
from reach_plugins.wire.proto import reach_pb2_grpc as pb_grpc

DEMO = (("authorization", "Bearer tok-demo"),)
ACME = (("authorization", "Bearer tok-acme"),)


class Receiver:
    """An HTTP callback target: ``/ok`` takes results, ``/moved`` redirects to ``/ok`` (which must not be followed)."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.arrived = threading.Event()

    def app(self) -> Starlette:
        async def ok(request: Request) -> Response:
            self.received.append(request.url.path)
            self.arrived.set()
            return JSONResponse({})

        async def moved(request: Request) -> Response:
            self.arrived.set()
            return RedirectResponse("/ok", status_code=307)

        return Starlette(routes=[Route("/ok", ok, methods=["POST"]), Route("/moved", moved, methods=["POST"])])


@dataclass
class World:
    node: NodeServer
    stub: Any
    receiver: Receiver
    callback: BackgroundServer
    agents: list[Agent]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    receiver = Receiver()
    with serve_agents(("orders", "o1")) as agents, BackgroundServer(receiver.app()) as callback:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        options = [("grpc.server_handshake_timeout_ms", 1000)]
        node = build_node(config, environ=TOKENS, callback_hosts=[f"127.0.0.1:{callback.port}"], options=options)
        async with node, grpc.aio.insecure_channel(node.target) as channel:
            yield World(node, pb_grpc.ReachNodeStub(channel), receiver, callback, agents)  # type: ignore[no-untyped-call]


def call(capability: str = "query_order", payload: bytes = b'{"order_id": "N1"}', **fields: Any) -> pb.ReachCall:
    return pb.ReachCall(capability=capability, payload=payload, **fields)


async def submit(world: World, callback: str, metadata: tuple[tuple[str, str], ...] = DEMO) -> str:
    reply = await world.stub.Submit(pb.SubmitRequest(call=call(), callback=callback), metadata=metadata)
    return str(reply.ticket.ticket)


async def result(world: World, ticket: str, metadata: tuple[tuple[str, str], ...] = DEMO) -> tuple[Any, dict[str, str]]:
    rpc = world.stub.Result(pb.ResultRequest(ticket=ticket, wait_ms=3000), metadata=metadata)
    reply = await rpc
    return reply, dict(await rpc.trailing_metadata() or ())


@pytest.mark.parametrize(
    "callback",
    [
        "http://127.0.0.1:9/elsewhere",
        "http://localhost:{port}/ok",
        "grpc://unix:/var/run/x.sock",
        "http://user:pw@127.0.0.1:{port}/ok",
        "file:///etc/passwd",
        "gopher://127.0.0.1:{port}/",
    ],
)
async def test_a_callback_outside_the_allow_list_is_invalid_argument(world: World, callback: str) -> None:
    """Submit refuses callbacks to unlisted hosts, unix sockets, userinfo and other schemes: INVALID_ARGUMENT."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await submit(world, callback.format(port=world.callback.port))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "callback" in (refused.value.details() or "")
    assert world.agents[0].count("query_order") == 0


async def test_a_delivered_callback_is_reported_on_the_ticket(world: World) -> None:
    """A push to an allowed host succeeds, and Result says so (trailer x-reach-callback: delivered)."""
    ticket = await submit(world, f"{world.callback.url}/ok")
    assert await asyncio.to_thread(world.receiver.arrived.wait, 5)
    for _ in range(100):
        reply, trailers = await result(world, ticket)
        if "x-reach-callback" in trailers:
            break
        await asyncio.sleep(0.02)
    assert reply.state == pb.DONE
    assert trailers["x-reach-callback"] == "delivered"


async def test_a_redirecting_callback_is_not_followed(world: World) -> None:
    """A callback answering 307 is not followed: nothing reaches the target, and the ticket says why it failed."""
    ticket = await submit(world, f"{world.callback.url}/moved")
    assert await asyncio.to_thread(world.receiver.arrived.wait, 5)
    for _ in range(100):
        _, trailers = await result(world, ticket)
        if "x-reach-callback" in trailers:
            break
        await asyncio.sleep(0.02)
    assert world.receiver.received == []
    assert trailers["x-reach-callback"] == "failed"
    assert "307" in trailers["x-reach-callback-error"] and "127.0.0.1" not in trailers["x-reach-callback-error"]


async def test_result_needs_the_token_of_the_tenant_that_submitted(world: World) -> None:
    """Result without a token is UNAUTHENTICATED; another tenant's token sees the ticket as unknown."""
    ticket = await submit(world, f"{world.callback.url}/ok")
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await result(world, ticket, metadata=())
    foreign, _ = await result(world, ticket, metadata=ACME)
    own, _ = await result(world, ticket)
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert foreign.state == pb.UNKNOWN
    assert own.state == pb.DONE


@pytest.mark.parametrize(
    ("message", "metadata", "named"),
    [
        (call(payload=b"[" * 5000 + b"]" * 5000), DEMO, "payload"),
        (call(payload=b'{"order_id": NaN}'), DEMO, "payload"),
        (call(payload=b'{"order_id": "\\ud800"}'), DEMO, "payload"),
        (call(payload=b"\xff\xfe"), DEMO, "payload"),
        (call(payload=b"[1]"), DEMO, "payload"),
        (call(capability=""), DEMO, "capability"),
        (call(tenant="demo\x01"), DEMO, "tenant"),
        (call(idempotency_key="k" * 8192), DEMO, "idempotency_key"),
        (call(), (*DEMO, ("x-reach-deadline", "nan")), "X-Reach-Deadline"),
        (call(), (*DEMO, ("idempotency-key", "k" * 2000)), "idempotency_key"),
        (call(), (*DEMO, ("authorization", "Bearer tok-acme")), "authorization"),
        (call(), (*DEMO, ("x-tenant", "demo"), ("x-tenant", "acme")), "x-tenant"),
    ],
)
async def test_bad_fields_are_invalid_argument_naming_the_field(
    world: World, message: pb.ReachCall, metadata: tuple[tuple[str, str], ...], named: str
) -> None:
    """Malformed fields are INVALID_ARGUMENT whose details name the field, never UNKNOWN "Unexpected <class>"."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await world.stub.Call(message, metadata=metadata)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert named in (refused.value.details() or "")


def test_a_silent_connection_is_dropped(tmp_path: Path) -> None:
    """A socket that connects to the node and never speaks HTTP/2 is closed after the handshake timeout."""

    async def run() -> bool:
        config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
        options = [("grpc.server_handshake_timeout_ms", 1000)]
        async with build_node(config, environ=TOKENS, options=options) as node:
            sock = socket.create_connection(("127.0.0.1", node.port))
            try:
                return await asyncio.to_thread(closed_by_server, sock, 8.0)
            finally:
                sock.close()

    assert asyncio.run(run())


text = st.text(max_size=30)
calls = st.builds(
    pb.ReachCall,
    request_id=text,
    capability=st.sampled_from(["query_order", "whoami", "nope"]) | text,
    action=text,
    payload=st.binary(max_size=40) | st.sampled_from([b'{"order_id": "F"}', b"{}", b"null", b'"x"', b"1e999"]),
    session_id=text,
    tenant=st.sampled_from(["", "demo", "acme"]) | text,
    idempotency_key=text,
    deadline_ms=st.integers(min_value=-(2**40), max_value=2**40),
    intent=text,
    priority=st.sampled_from([pb.ONLINE, pb.BATCH]),
    scope_tags=st.lists(text, max_size=40),
)
header_value = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
metadata = st.fixed_dictionaries(
    {"authorization": st.sampled_from(["Bearer tok-demo", "Bearer tok-demo", "Bearer nope", "Basic x"])},
    optional={
        "x-reach-deadline": header_value,
        "x-reach-hops": header_value,
        "x-tenant": header_value,
        "idempotency-key": header_value,
        "x-reach-target": header_value,
        "x-reach-via": header_value,
    },
)
ANSWERED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


@pytest.fixture(scope="module")
def fuzz_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[asyncio.AbstractEventLoop, Any]]:
    """A node on a loop of its own thread, so hypothesis can drive it from plain (sync) examples."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(
            tmp_path_factory.mktemp("nodefuzz") / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants()
        )
        node = asyncio.run_coroutine_threadsafe(build_node(config, environ=TOKENS).start(), loop).result(30)
        channel = grpc.insecure_channel(node.target)
        yield loop, pb_grpc.ReachNodeStub(channel)  # type: ignore[no-untyped-call]
        channel.close()
        asyncio.run_coroutine_threadsafe(node.stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(message=calls, sent=metadata)
def test_any_call_gets_a_named_status(
    fuzz_node: tuple[asyncio.AbstractEventLoop, Any], message: pb.ReachCall, sent: dict[str, str]
) -> None:
    """Generated ReachCall fields and metadata: OK or a named refusal, never UNKNOWN or INTERNAL."""
    _, stub = fuzz_node
    try:
        stub.Call(message, metadata=tuple(sent.items()), timeout=10)
    except grpc.RpcError as exc:
        assert exc.code() in ANSWERED, (exc.code(), exc.details())
        assert exc.details()
