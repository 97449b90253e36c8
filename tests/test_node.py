"""The Reach node over gRPC: backpressure, callback mode, node-to-node forwarding, streams, spans, refusals."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from hop_support import TOKENS, demo_tenants, serve_agents, until, write_config
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from transport_conformance import make_call

from reach_plugins import ReachClient, errors
from reach_plugins.agent import BackgroundServer
from reach_plugins.config.loader import load_config
from reach_plugins.model import AgentDescriptor
from reach_plugins.node import NodeServer, build_node
from reach_plugins.registry import MemoryRegistry
from reach_plugins.wire.proto import reach_pb2, reach_pb2_grpc
from transports.grpcnode import GrpcNodeTransport

DEMO = TOKENS["DEMO_TOKEN"]
FAST_RETRY = {"max_attempts": 3, "base_wait": 0.01, "max_wait": 0.02}


def client_for(config: Path, node: NodeServer, **options: Any) -> ReachClient:
    return ReachClient(
        str(config), GrpcNodeTransport(node.target, token=DEMO), tenant="demo", environ=TOKENS, **options
    )


async def test_full_queue_answers_backpressure_and_drops_nothing(tmp_path: Path) -> None:
    """One worker, two places: of six callers three are served, three get an explicit backpressure with a hint."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        node = build_node(config, environ=TOKENS, workers=1, queue_capacity=2)
        async with node, client_for(config, node) as client:
            tasks = [asyncio.create_task(client.reach("hold", {"n": n}, timeout_ms=8000)) for n in range(6)]
            await until(lambda: node.queue.refused >= 3)
            channel = grpc.aio.insecure_channel(node.target)
            stub = reach_pb2_grpc.ReachNodeStub(channel)  # type: ignore[no-untyped-call]
            raw = await stub.Call(
                reach_pb2.ReachCall(capability="hold", payload=b'{"n": 99}'),
                metadata=(("authorization", f"Bearer {DEMO}"),),
            )
            await channel.close()
            agents[0].gate.set()
            responses = await asyncio.gather(*tasks)
    served = [response for response in responses if response.ok]
    pushed_back = [response for response in responses if not response.ok]
    assert raw.WhichOneof("kind") == "backpressure" and raw.backpressure.retry_after > 0
    assert len(served) + len(pushed_back) == 6
    assert all(r.error is not None and r.error.type == "backpressure" for r in pushed_back)
    assert all(r.error is not None and (r.error.retry_after or 0) > 0 for r in pushed_back)
    assert sorted(payload["n"] for _, payload in agents[0].executed) == sorted(r.data["n"] for r in served)
    assert len(served) >= 3


async def test_online_requests_go_before_batch(tmp_path: Path) -> None:
    """Waiting batch requests are overtaken by online ones that arrived later."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        async with build_node(config, environ=TOKENS, workers=1) as node, client_for(config, node) as client:
            first = asyncio.create_task(client.reach("hold", {"n": 0}, timeout_ms=8000))
            await until(lambda: node.queue.running == 1)
            tasks = [first]
            for n, priority in ((1, "batch"), (2, "batch"), (3, "online"), (4, "online")):
                tasks.append(asyncio.create_task(client.reach("hold", {"n": n}, priority=priority, timeout_ms=8000)))
                await until(waiting(node, n))
            agents[0].gate.set()
            await asyncio.gather(*tasks)
    assert [payload["n"] for _, payload in agents[0].executed] == [0, 3, 4, 1, 2]


def waiting(node: NodeServer, count: int) -> Callable[[], bool]:
    return lambda: node.queue.depth == count


class Receiver:
    """An HTTP endpoint that records the results a node pushes to it."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.arrived = threading.Event()

        async def deliver(request: Request) -> JSONResponse:
            self.received.append({"ticket": request.headers.get("x-reach-ticket"), **json.loads(await request.body())})
            self.arrived.set()
            return JSONResponse({"ok": True})

        self.app = Starlette(routes=[Route("/results", deliver, methods=["POST"])])


async def test_callback_mode_returns_a_ticket_and_pushes_the_result(tmp_path: Path) -> None:
    """Submit answers with a ticket at once; the result is pushed to the HTTP callback and fetchable by ticket."""
    receiver = Receiver()
    with serve_agents(("orders", "o1")) as agents, BackgroundServer(receiver.app) as callback:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        async with build_node(config, environ=TOKENS, callback_hosts=["127.0.0.1"]) as node:
            transport = GrpcNodeTransport(node.target, token=DEMO)
            request = ReachClient(str(config), tenant="demo").request("hold", {"n": 7}, timeout_ms=8000)
            ticket = await transport.submit(request, callback=f"{callback.url}/results")
            pending = await transport.result(ticket)
            agents[0].gate.set()
            assert await asyncio.to_thread(receiver.arrived.wait, 5)
            fetched = await transport.result(ticket, wait=2)
            with pytest.raises(errors.RequestError, match="unknown"):
                await transport.result("no-such-ticket")
            await transport.aclose()
    assert pending is None
    delivered = receiver.received[0]
    assert delivered["ticket"] == ticket and delivered["result"]["request_id"] == request.request_id
    assert delivered["result"]["status"] == "success" and delivered["result"]["data"] == {"n": 7, "by": "o1"}
    assert fetched is not None and fetched.ok and fetched.data == {"n": 7, "by": "o1"}


class CallbackServicer:
    """A ReachCallback server: what the node delivers lands in ``deliveries``."""

    def __init__(self) -> None:
        self.deliveries: list[reach_pb2.Delivery] = []
        self.arrived = asyncio.Event()

    async def Deliver(self, delivery: reach_pb2.Delivery, context: Any) -> reach_pb2.DeliveryAck:
        self.deliveries.append(delivery)
        self.arrived.set()
        return reach_pb2.DeliveryAck()


async def test_callback_mode_pushes_to_a_grpc_target(tmp_path: Path) -> None:
    """A grpc://host:port callback receives the result through ReachCallback.Deliver."""
    servicer = CallbackServicer()
    server = grpc.aio.server()
    reach_pb2_grpc.add_ReachCallbackServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with serve_agents(("orders", "o1")) as agents:
            config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
            async with build_node(config, environ=TOKENS, callback_hosts=["127.0.0.1"]) as node:
                transport = GrpcNodeTransport(node.target, token=DEMO)
                request = ReachClient(str(config), tenant="demo").request("query_order", {"order_id": "C9"})
                ticket = await transport.submit(request, callback=f"grpc://127.0.0.1:{port}")
                await asyncio.wait_for(servicer.arrived.wait(), 5)
                with pytest.raises(errors.RequestError, match="callback must be"):
                    await transport.submit(request, callback="ftp://nowhere")
                await transport.aclose()
    finally:
        await server.stop(None)
    delivery = servicer.deliveries[0]
    assert delivery.ticket == ticket
    assert delivery.result.status == reach_pb2.SUCCESS
    assert json.loads(delivery.result.data) == {"order_id": "C9", "by": "o1"}


async def started_node(config: Path, registry: MemoryRegistry, node_id: str) -> NodeServer:
    return await build_node(config, environ=TOKENS, registry=registry, node_id=node_id).start()


async def test_node_forwards_to_the_node_in_front_of_the_agent(tmp_path: Path) -> None:
    """An instance at grpc://host:port is reached through that node; retries stay with the first node."""
    environ = {**TOKENS, "FAR_DEMO_TOKEN": "tok-far-demo"}  # near presents demo to far with far's own token
    with serve_agents(("orders", "o1")) as agents:
        far_tenants = demo_tenants()
        far_tenants["demo"]["token_env"] = "FAR_DEMO_TOKEN"
        far_config = write_config(
            tmp_path / "far.yaml", {"orders": {"endpoints": [agents[0].url], "retry": FAST_RETRY}}, far_tenants
        )
        async with build_node(far_config, environ=environ, node_id="far") as far:
            tenants = demo_tenants()
            tenants["demo"]["credentials"] = {"orders": {"type": "bearer", "value_env": "FAR_DEMO_TOKEN"}}
            near_config = write_config(
                tmp_path / "near.yaml",
                {"orders": {"endpoints": [f"grpc://{far.target}"], "retry": FAST_RETRY}},
                tenants,
            )
            near = build_node(near_config, environ=environ, node_id="near")
            async with near, client_for(near_config, near) as client:
                answer = await client.reach("whoami", timeout_ms=5000)
                outage = await client.reach("outage", timeout_ms=5000)
    assert answer.ok and answer.data["by"] == "o1" and answer.data["hops"] == ["orders/whoami"]
    assert outage.status == "fail" and agents[0].count("outage") == 3


async def test_node_refuses_a_forwarding_loop(tmp_path: Path) -> None:
    """A node whose registry points an agent back at itself refuses the second pass instead of looping."""
    config = write_config(tmp_path / "agents.yaml", {}, {"demo": {"token_env": "DEMO_TOKEN", "agents": "*"}})
    tenants = load_config(config).tenants
    registry = MemoryRegistry()
    async with build_node(config, environ=TOKENS, registry=registry, node_id="loopy") as node:
        await registry.register_agent(
            AgentDescriptor(name="orders", endpoints=[f"grpc://{node.target}"], capabilities=["query_order"])
        )
        await until(lambda: "orders" in node.forwarder.table.agents())
        client = ReachClient(registry, GrpcNodeTransport(node.target, token=DEMO), tenant="demo", tenants=tenants)
        async with client:
            with pytest.raises(errors.LoopDetected, match="node forwarding loop"):
                await client.reach("query_order", {"order_id": "L"}, timeout_ms=3000)


async def test_refusals_carry_the_error_type_and_status(tmp_path: Path) -> None:
    """A node's refusal raises the error class it names (its trailers carry the wire code), not a reply."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        async with build_node(config, environ=TOKENS) as node:
            transport, anonymous = GrpcNodeTransport(node.target, token=DEMO), GrpcNodeTransport(node.target)
            with pytest.raises(errors.UnknownCapability, match="no agent offers") as unknown:
                await transport.send(make_call(agents[0].url, "no_such_capability", tenant="demo"))
            with pytest.raises(errors.Unauthenticated, match="Bearer") as unauthenticated:
                await anonymous.send(make_call(agents[0].url, "query_order"))
            await transport.aclose()
            await anonymous.aclose()
    assert unknown.value.refused and unauthenticated.value.refused


async def test_values_that_cannot_be_metadata_are_refused_before_sending() -> None:
    """A control character in an idempotency key is a RequestError naming the metadata key."""
    transport = GrpcNodeTransport("127.0.0.1:9", token=DEMO)
    call = make_call("http://unused", "query_order", headers={"Idempotency-Key": "a\x1fb"})
    with pytest.raises(errors.RequestError, match="idempotency-key"):
        await transport.send(call)
    await transport.aclose()


async def test_unreachable_node_is_a_connect_error() -> None:
    """Nobody listening at the target is a ConnectError: the node never saw the request."""
    transport = GrpcNodeTransport("127.0.0.1:9", token=DEMO)
    with pytest.raises(errors.ConnectError) as caught:
        await transport.send(make_call("http://unused", "query_order", timeout=2.0))
    await transport.aclose()
    assert caught.value.reached_agent is False


async def test_stream_through_the_node(tmp_path: Path) -> None:
    """ReachClient.stream over the node yields the agent's chunks in order, then end."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        async with build_node(config, environ=TOKENS) as node, client_for(config, node) as client:
            events = [event async for event in client.stream("count", {"upto": 3})]
    assert [(event.kind, event.data) for event in events] == [("data", 0), ("data", 1), ("data", 2), ("end", None)]


async def test_node_continues_the_callers_trace(tmp_path: Path) -> None:
    """One trace: client span -> node server span -> node client span -> agent server span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        node = build_node(config, environ=TOKENS, tracer_provider=provider)
        async with node, client_for(config, node, tracer_provider=provider) as client:
            assert (await client.reach("query_order", {"order_id": "T"})).ok
    spans = exporter.get_finished_spans()
    by_id = {span.context.span_id: span for span in spans}
    root = next(s for s in spans if s.name == "invoke_agent orders" and s.parent is None)
    server = next(s for s in spans if s.name == "reach.node query_order")
    downstream = next(s for s in spans if s.name == "invoke_agent orders" and s.parent is not None)
    assert server.parent is not None and by_id[server.parent.span_id] is root
    assert downstream.parent is not None and by_id[downstream.parent.span_id] is server
    assert downstream.context.trace_id == root.context.trace_id


async def test_node_without_an_sdk_still_passes_the_callers_trace_on(tmp_path: Path) -> None:
    """With no tracer provider the node makes no span of its own, yet the agent gets the caller's trace id."""
    seen: list[str | None] = []

    async def reach(request: Request) -> JSONResponse:
        seen.append(request.headers.get("traceparent"))
        body = json.loads(await request.body())
        return JSONResponse({"request_id": body["request_id"], "status": "success", "data": {"ok": True}})

    trace_id, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    metadata = (("authorization", f"Bearer {DEMO}"), ("traceparent", f"00-{trace_id}-{parent}-01"))

    async def ready(request: Request) -> JSONResponse:
        return JSONResponse({"ready": True})

    routes = [Route("/reach", reach, methods=["POST"]), Route("/readyz", ready)]
    with BackgroundServer(Starlette(routes=routes)) as agent:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agent.url]}, demo_tenants())
        async with build_node(config, environ=TOKENS) as node:
            channel = grpc.aio.insecure_channel(node.target)
            stub = reach_pb2_grpc.ReachNodeStub(channel)  # type: ignore[no-untyped-call]
            traced = await stub.Call(reach_pb2.ReachCall(capability="query_order", payload=b"{}"), metadata=metadata)
            plain = await stub.Call(reach_pb2.ReachCall(capability="query_order", payload=b"{}"), metadata=metadata[:1])
            await channel.close()
    assert traced.result.status == reach_pb2.SUCCESS and plain.result.status == reach_pb2.SUCCESS
    assert seen[0] is not None and seen[0].split("-")[1] == trace_id and seen[0].split("-")[2] != "0" * 16
    assert seen[1] is None or seen[1].split("-")[1] != trace_id


async def test_node_serves_metrics_over_http(tmp_path: Path) -> None:
    """With metrics_port the node's /metrics (Prometheus text from the OpenTelemetry exporter) counts its requests."""
    import httpx

    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        async with build_node(config, environ=TOKENS, metrics_port=0) as node, client_for(config, node) as client:
            assert (await client.reach("query_order", {"order_id": "N1"})).ok
            async with httpx.AsyncClient() as http:
                scraped = await http.get(f"http://127.0.0.1:{node.metrics_port}/metrics")
        port = node.metrics_port
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    lines = [line for line in scraped.text.splitlines() if line.startswith("reach_client_requests_total{")]
    assert any('reach_capability="query_order"' in line and 'reach_status="success"' in line for line in lines)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
