"""The gateway over HTTP: authentication, tenant rules, internal_only by address, credentials, SSE, health, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hop_support import TOKENS, Agent, demo_tenants, serve_agents, until_true, write_config
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from transport_conformance import make_call

from reach_plugins import ReachClient, errors
from reach_plugins.agent import BackgroundServer
from reach_plugins.gateway import create_app
from reach_plugins.protocols import SseDecoder
from reach_plugins.telemetry.prometheus import Metrics
from transports.gateway import GatewayTransport

DEMO = {"Authorization": "Bearer tok-demo"}
ACME = {"Authorization": "Bearer tok-acme"}


class World:
    """Agents orders (two instances), tickets and vault (internal_only), behind one gateway."""

    def __init__(self, agents: list[Agent], gateway: BackgroundServer, config: Path, spans: InMemorySpanExporter):
        self.agents = {agent.label: agent for agent in agents}
        self.gateway = gateway
        self.config = config
        self.spans = spans

    @property
    def url(self) -> str:
        return self.gateway.url


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    specs = [("orders", "o1"), ("orders", "o2"), ("tickets", "t1"), ("vault", "v1")]
    with serve_agents(*specs) as agents:
        url = {agent.label: agent.url for agent in agents}
        tenants = demo_tenants(agents=["orders", "tickets", "vault"])
        tenants["acme"]["agents"] = ["orders", "vault"]
        config = write_config(
            tmp_path_factory.mktemp("gateway") / "agents.yaml",
            {
                "orders": [url["o1"], url["o2"]],
                "tickets": {"endpoints": [url["t1"]], "capabilities": ["create_ticket", "whoami"]},
                "vault": {"endpoints": [url["v1"]], "internal_only": True, "capabilities": ["whoami", "open_vault"]},
            },
            tenants,
        )
        app = create_app(config, environ=TOKENS, tracer_provider=provider)
        with BackgroundServer(app, proxy_headers=False) as gateway:
            yield World(agents, gateway, config, spans)


async def post(world: World, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=world.url) as http:
        return await http.post("/v1/reach", json=body, headers=headers if headers is not None else DEMO)


async def test_reach_routes_and_reports_who_served(world: World) -> None:
    """POST /v1/reach routes by capability and answers with the data, the agent, the instance and the attempts."""
    answer = await post(world, {"capability": "query_order", "payload": {"order_id": "G1"}})
    body = answer.json()
    assert answer.status_code == 200
    assert body["status"] == "success" and body["data"]["order_id"] == "G1"
    assert body["agent"] == "orders" and body["instance"] in ("orders-0", "orders-1")
    assert body["attempts"] == 1


async def test_missing_or_unknown_token_is_401(world: World) -> None:
    """No bearer token, or a token no tenant holds, is refused with 401 saying what to send."""
    missing = await post(world, {"capability": "query_order", "payload": {"order_id": "x"}}, headers={})
    wrong = await post(world, {"capability": "query_order"}, headers={"Authorization": "Bearer nope"})
    assert (missing.status_code, wrong.status_code) == (401, 401)
    assert "Authorization: Bearer" in missing.json()["error"]["message"]
    assert "no tenant" in wrong.json()["error"]["message"]


async def test_token_cannot_claim_another_tenant(world: World) -> None:
    """A demo token naming tenant acme in the body is refused: the token decides the tenant."""
    answer = await post(world, {"capability": "query_order", "tenant": "acme", "payload": {"order_id": "x"}})
    assert answer.status_code == 403
    assert "belongs to tenant 'demo'" in answer.json()["error"]["message"]


async def test_tenant_without_permission_gets_403(world: World) -> None:
    """acme may not reach tickets: 403, and the message names the allow-list to change."""
    before = world.agents["t1"].count("whoami")
    answer = await post(world, {"capability": "create_ticket", "payload": {}}, headers=ACME)
    assert answer.status_code == 403
    message = answer.json()["error"]["message"]
    assert "tenant 'acme' may not reach capability 'create_ticket'" in message and "allow-list" in message
    assert world.agents["t1"].count("whoami") == before


async def test_internal_only_from_outside_address_is_refused(world: World) -> None:
    """acme names vault but connects from outside its networks (10.0.0.0/8): 403 naming neither agent nor networks."""
    answer = await post(world, {"capability": "open_vault"}, headers=ACME)
    assert answer.status_code == 403
    message = answer.json()["error"]["message"]
    assert "from outside" in message and "open_vault" in message
    assert "agent" not in message and "10.0.0.0/8" not in message


async def test_internal_only_from_inside_address_is_served(world: World) -> None:
    """demo names vault and connects from inside its networks: served by vault."""
    before = world.agents["v1"].count("whoami")
    answer = await post(world, {"capability": "whoami"}, headers=DEMO)
    served = {answer.json()["agent"]}
    for _ in range(5):
        served.add((await post(world, {"capability": "whoami"}, headers=DEMO)).json()["agent"])
    assert "vault" in served
    assert world.agents["v1"].count("whoami") > before


async def test_outside_caller_is_routed_around_internal_agents(world: World) -> None:
    """A capability offered by public and internal agents reaches only the public ones from outside."""
    before = world.agents["v1"].count("whoami")
    answers = [(await post(world, {"capability": "whoami"}, headers=ACME)).json() for _ in range(8)]
    assert {answer["status"] for answer in answers} == {"success"}
    assert {answer["agent"] for answer in answers} == {"orders"}
    assert world.agents["v1"].count("whoami") == before


async def test_each_tenant_presents_its_own_credential(world: World) -> None:
    """The gateway injects the calling tenant's own downstream key, never another tenant's."""
    acme = [(await post(world, {"capability": "whoami"}, headers=ACME)).json() for _ in range(3)]
    demo = [(await post(world, {"capability": "whoami"}, headers=DEMO)).json() for _ in range(9)]
    assert {answer["data"]["x-api-key"] for answer in acme} == {TOKENS["ACME_KEY"]}
    demo_orders = [answer for answer in demo if answer["agent"] == "orders"]
    assert demo_orders and {answer["data"]["x-api-key"] for answer in demo_orders} == {TOKENS["DEMO_KEY"]}


async def test_headers_carry_deadline_hops_and_idempotency(world: World) -> None:
    """X-Reach-Hops is the chain so far (the gateway adds its hop); an exhausted deadline is 504, not sent."""
    headers = {**DEMO, "X-Reach-Hops": "router/triage"}
    answer = (await post(world, {"capability": "whoami"}, headers=headers)).json()
    assert answer["data"]["hops"] == ["router/triage", f"{answer['agent']}/whoami"]
    late = await post(world, {"capability": "whoami"}, headers={**DEMO, "X-Reach-Deadline": "0"})
    assert late.status_code == 504 and late.json()["error"]["type"] == "timeout"


async def test_loop_in_hop_chain_is_409(world: World) -> None:
    """A chain that already visited every agent offering the capability is refused as a loop."""
    headers = {**DEMO, "X-Reach-Hops": "tickets/create_ticket"}
    answer = await post(world, {"capability": "create_ticket"}, headers=headers)
    assert answer.status_code == 409
    assert "loop detected" in answer.json()["error"]["message"]


async def test_business_refusal_is_200_with_status_fail(world: World) -> None:
    """An agent's business error is a routed outcome: 200, status fail, type business, tried once."""
    before = world.agents["o1"].count("refuse") + world.agents["o2"].count("refuse")
    body = (await post(world, {"capability": "refuse"})).json()
    assert body["status"] == "fail" and body["error"]["type"] == "business"
    assert world.agents["o1"].count("refuse") + world.agents["o2"].count("refuse") == before + 1


async def test_stream_relays_sse_frames(world: World) -> None:
    """POST /v1/reach/stream relays the agent's events as data frames, then end."""
    async with httpx.AsyncClient(base_url=world.url) as http:
        answer = await http.post("/v1/reach/stream", json={"capability": "count", "payload": {"upto": 3}}, headers=DEMO)
    assert answer.headers["content-type"].startswith("text/event-stream")
    frames = SseDecoder().feed(answer.content)
    assert [(frame.event, frame.data) for frame in frames] == [("data", "0"), ("data", "1"), ("data", "2"), ("end", "")]


async def test_stream_refusal_is_json_not_sse(world: World) -> None:
    """A stream refused before its first event is a plain JSON error with its status code."""
    async with httpx.AsyncClient(base_url=world.url) as http:
        answer = await http.post("/v1/reach/stream", json={"capability": "nope_nothing"}, headers=DEMO)
    assert answer.status_code == 404 and answer.json()["error"]["type"] == "unknown_capability"


async def test_client_stream_through_gateway(world: World) -> None:
    """ReachClient.stream over GatewayTransport yields the agent's chunks and one end."""
    transport = GatewayTransport(world.url, token=TOKENS["DEMO_TOKEN"])
    async with ReachClient(str(world.config), transport, tenant="demo", environ=TOKENS) as client:
        events = [event async for event in client.stream("count", {"upto": 4})]
    assert [event.data for event in events if event.kind == "data"] == [0, 1, 2, 3]
    assert events[-1].kind == "end"


async def test_agents_lists_what_the_tenant_may_reach(world: World) -> None:
    """GET /v1/agents shows a tenant its reachable agents and their health, never endpoints or secrets."""
    async with httpx.AsyncClient(base_url=world.url) as http:
        demo = (await http.get("/v1/agents", headers=DEMO)).json()
        acme = (await http.get("/v1/agents", headers=ACME)).json()
    assert [agent["name"] for agent in demo["agents"]] == ["orders", "tickets", "vault"]
    assert [agent["name"] for agent in acme["agents"]] == ["orders"]
    orders = demo["agents"][0]
    assert [i["alive"] for i in orders["instances"]] == [True, True]
    assert "127.0.0.1" not in str(demo)


async def test_health_readiness_and_metrics(world: World) -> None:
    """/healthz and /readyz answer 200; /metrics counts requests by outcome in Prometheus text."""
    await post(world, {"capability": "query_order", "payload": {"order_id": "M1"}})
    async with httpx.AsyncClient(base_url=world.url) as http:
        health, ready, metrics = [await http.get(path) for path in ("/healthz", "/readyz", "/metrics")]
    assert (health.status_code, ready.status_code) == (200, 200)
    text = metrics.text
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    line = next(line for line in text.splitlines() if line.startswith('reach_gateway_requests_total{endpoint="reach"'))
    assert float(line.split()[-1]) >= 1
    assert 'reach_gateway_request_seconds_bucket{endpoint="reach",le="+Inf"}' in text


async def test_gateway_continues_the_callers_trace(world: World) -> None:
    """One trace: client span -> gateway server span -> gateway client span -> agent server span."""
    world.spans.clear()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(world.spans))
    transport = GatewayTransport(world.url, token=TOKENS["DEMO_TOKEN"])
    client = ReachClient(str(world.config), transport, tenant="demo", environ=TOKENS, tracer_provider=provider)
    async with client:
        assert (await client.reach("query_order", {"order_id": "T1"})).ok
    spans = world.spans.get_finished_spans()
    by_id = {span.context.span_id: span for span in spans}
    client_span = next(s for s in spans if s.name == "invoke_agent orders" and s.parent is None)
    server = next(s for s in spans if s.name == "reach.gateway query_order")
    downstream = next(s for s in spans if s.name == "invoke_agent orders" and s.parent is not None)
    assert {s.context.trace_id for s in (client_span, server, downstream)} == {client_span.context.trace_id}
    assert server.parent is not None and by_id[server.parent.span_id] is client_span
    assert downstream.parent is not None and by_id[downstream.parent.span_id] is server


def test_metrics_render_through_the_prometheus_exporter() -> None:
    """Counters, gauges and histograms declared by Prometheus name come out of the exporter in 0.0.4 text."""
    metrics = Metrics()
    metrics.declare("hits_total", "counter", "Hits.")
    metrics.declare("inflight", "gauge", "Now.")
    metrics.declare("latency_seconds", "histogram", "Latency.", buckets=(0.1, 1.0))
    metrics.inc("hits_total", {"route": 'a"b'})
    metrics.inc("hits_total", {"route": 'a"b'}, 2)
    metrics.set("inflight", 4)
    for value in (0.05, 0.5, 5.0):
        metrics.observe("latency_seconds", value)
    text = metrics.render()
    assert 'hits_total{route="a\\"b"} 3.0' in text and "inflight 4.0" in text
    assert 'latency_seconds_bucket{le="0.1"} 1.0' in text
    assert 'latency_seconds_bucket{le="1.0"} 2.0' in text
    assert 'latency_seconds_bucket{le="+Inf"} 3.0' in text
    assert "latency_seconds_count 3.0" in text and "latency_seconds_sum 5.55" in text
    assert Metrics().render() != text, "each server has a registry of its own"


async def test_gateway_metrics_show_what_its_requests_did(world: World) -> None:
    """The gateway's /metrics carries the request-level instruments (requests, attempts by outcome, routes)."""
    await post(world, {"capability": "query_order", "payload": {"order_id": "M2"}})
    async with httpx.AsyncClient(base_url=world.url) as http:
        text = (await http.get("/metrics")).text
    requests = [line for line in text.splitlines() if line.startswith("reach_client_requests_total{")]
    assert any('reach_capability="query_order"' in line and 'reach_status="success"' in line for line in requests)
    assert "reach_client_attempts_total{" in text and 'reach_outcome="success"' in text
    assert "reach_route_decisions_total{" in text and "reach_client_request_duration_seconds_bucket{" in text


async def test_gateway_at_its_inflight_limit_pushes_back(tmp_path: Path) -> None:
    """Past max_inflight the gateway answers 429 with error type backpressure and Retry-After, sending nothing."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        app = create_app(config, environ=TOKENS, max_inflight=1)
        with BackgroundServer(app, proxy_headers=False) as gateway:
            transport = GatewayTransport(gateway.url, token=TOKENS["DEMO_TOKEN"])
            async with ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client:
                held = asyncio.create_task(client.reach("hold", {"n": 1}, timeout_ms=8000))
                await until_true(lambda: _busy(gateway.url))
                async with httpx.AsyncClient(base_url=gateway.url) as http:
                    raw = await http.post("/v1/reach", json={"capability": "whoami"}, headers=DEMO)
                pushed = await client.reach("whoami", timeout_ms=3000)
                agents[0].gate.set()
                served = await held
    assert raw.status_code == 429 and raw.headers["retry-after"] == "1"
    assert raw.json()["error"]["type"] == "backpressure"
    assert pushed.status == "fail" and pushed.error is not None and pushed.error.type == "backpressure"
    assert served.ok and agents[0].count("whoami") == 0


async def _busy(url: str) -> bool:
    async with httpx.AsyncClient(base_url=url) as http:
        return "reach_gateway_inflight 1" in (await http.get("/metrics")).text


async def test_values_that_cannot_be_headers_are_refused_before_sending() -> None:
    """A non-ASCII idempotency key is a RequestError naming the header, not a crash inside the HTTP library."""
    transport = GatewayTransport("http://127.0.0.1:9", token="t")
    call = make_call("http://unused", "query_order", idempotency_key="ключ", headers={"Idempotency-Key": "ключ"})
    with pytest.raises(errors.RequestError, match="Idempotency-Key"):
        await transport.send(call)
    await transport.aclose()
