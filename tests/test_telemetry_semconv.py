"""Spans and metrics against the OpenTelemetry semantic conventions vendored in tests/semconv/registry.yaml.

Real servers on 127.0.0.1: agents under uvicorn, a real gRPC node. Each recorded span or metric point is
checked by the registry: its attribute names and types, closed enum values, and the required (and
conditionally required) attributes present.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from hop_support import TOKENS, demo_tenants, serve_agents, write_config
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from reach_plugins import ReachClient, ReachEnhancer
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import BusinessError
from reach_plugins.frameworks.toolcalls import ToolCall
from reach_plugins.gateway import create_app
from reach_plugins.model import AgentDescriptor, Capability
from reach_plugins.node import build_node
from reach_plugins.registry import MemoryRegistry
from reach_plugins.telemetry.metrics import GEN_AI_EXECUTE_TOOL_DURATION, ReachMetrics
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

REGISTRY: dict[str, Any] = yaml.safe_load((Path(__file__).parent / "semconv" / "registry.yaml").read_text())
ATTRIBUTES: dict[str, dict[str, Any]] = REGISTRY["attributes"]
MODULES = {
    "gen_ai": "opentelemetry.semconv._incubating.attributes.gen_ai_attributes",
    "rpc": "opentelemetry.semconv._incubating.attributes.rpc_attributes",
    **{name: f"opentelemetry.semconv.attributes.{name}_attributes" for name in ("http", "server", "url", "error")},
}
TYPES = {"string": str, "int": int}


def violations(attributes: Mapping[str, Any], *groups: str, failed: bool = False) -> list[str]:
    """What breaks the registry in ``attributes`` for the span or metric ``groups`` (empty: conforms)."""
    found: list[str] = []
    wanted: set[str] = set()
    for group in groups:
        rules = REGISTRY["spans"].get(group) or REGISTRY["metrics"][group]
        wanted |= set(rules["required"])
        conditional = rules.get("conditionally_required", {})
        wanted |= {name for name in conditional if name != "error.type"} & set(attributes)
        if failed and "error.type" in conditional:
            wanted.add("error.type")
        if "server.address" in attributes and "server.port" in conditional:
            wanted.add("server.port")
    found += [f"{name} missing" for name in sorted(wanted - set(attributes))]
    for name, value in attributes.items():
        rule = ATTRIBUTES.get(name)
        if rule is None:
            if not name.startswith("reach."):
                found.append(f"{name} is in no registry we follow")
            continue
        if type(value) is not TYPES[rule["type"]]:
            found.append(f"{name}={value!r} is not a {rule['type']}")
        if "enum" in rule and value not in rule["enum"]:
            found.append(f"{name}={value!r} is not one of {rule['enum']}")
    return found


def test_the_vendored_registry_agrees_with_the_semantic_conventions_package() -> None:
    """Every vendored name is a constant of opentelemetry-semantic-conventions, every enum its members."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for name, rule in ATTRIBUTES.items():
            module = importlib.import_module(MODULES[rule["module"]])
            assert name in {value for value in vars(module).values() if isinstance(value, str)}, name
            members = rule.get("enum", rule.get("open_enum"))
            enum = getattr(module, "".join(part.title() for part in name.replace(".", "_").split("_")) + "Values", None)
            if enum is not None and members is not None:
                assert [member.value for member in enum] == members, name
    assert ATTRIBUTES["rpc.response.status_code"]["enum"] == [code.name for code in grpc.StatusCode]


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def orders_agent(provider: TracerProvider) -> ReachAgent:
    """An agent that answers, crashes (an exception in the handler) or refuses (a business error)."""
    agent = ReachAgent("orders", tracer_provider=provider)

    @agent.capability("query_order", description="Where an order is")
    def query_order(order_id: str) -> dict[str, str]:
        return {"order_id": order_id}

    @agent.capability("outage", description="Fails: its database is down")
    def outage() -> None:
        raise RuntimeError("database down")

    @agent.capability("refuse", description="Refuses: the order has shipped")
    def refuse() -> None:
        raise BusinessError("order already shipped")

    @agent.capability("count", description="Streams numbers, then crashes")
    async def count(upto: int) -> Any:
        for number in range(upto):
            yield number
        raise RuntimeError("stream broke")

    return agent


def by_kind(spans: tuple[ReadableSpan, ...], kind: SpanKind) -> list[ReadableSpan]:
    return [span for span in spans if span.kind == kind]


async def test_invoke_agent_client_span_over_http(spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    """Each reach is an ``invoke_agent orders`` CLIENT span with the GenAI and HTTP client attributes it must have."""
    provider, exporter = spans
    with BackgroundServer(orders_agent(provider).app) as server:
        registry = MemoryRegistry()
        capabilities = [Capability(name=name) for name in ("query_order", "outage", "refuse")]
        await registry.register_agent(AgentDescriptor(name="orders", endpoints=[server.url], capabilities=capabilities))
        async with ReachClient(registry, DirectTransport(), tracer_provider=provider) as client:
            assert (await client.reach("query_order", {"order_id": "A1"}, session_id="conv-1")).ok
            assert not (await client.reach("refuse", {})).ok
    clients = by_kind(exporter.get_finished_spans(), SpanKind.CLIENT)
    assert [span.name for span in clients] == ["invoke_agent orders", "invoke_agent orders"]
    ok, refused = (dict(span.attributes or {}) for span in clients)
    for attributes, failed in ((ok, False), (refused, True)):
        assert violations(attributes, "invoke_agent.client", "http.client", failed=failed) == []
        assert attributes["gen_ai.operation.name"] == "invoke_agent" and attributes["gen_ai.agent.name"] == "orders"
        assert attributes["http.request.method"] == "POST"
    assert ok["gen_ai.conversation.id"] == "conv-1" and ok["gen_ai.agent.id"] == "orders/orders-0"
    assert ok["url.full"] == f"{server.url}/reach" and ok["http.response.status_code"] == 200
    assert clients[0].status.status_code == StatusCode.UNSET
    assert clients[1].status.status_code == StatusCode.ERROR and refused["error.type"] == BusinessError.code


async def test_the_agents_server_span_fails_when_its_handler_crashes_or_refuses(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """The agent's SERVER span has error status and error.type when the handler raised, refused or broke a stream."""
    provider, exporter = spans
    with BackgroundServer(orders_agent(provider).app) as server:
        registry = MemoryRegistry()
        capabilities = [Capability(name=name) for name in ("query_order", "outage", "refuse", "count")]
        await registry.register_agent(AgentDescriptor(name="orders", endpoints=[server.url], capabilities=capabilities))
        async with ReachClient(registry, DirectTransport(), tracer_provider=provider) as client:
            assert (await client.reach("query_order", {"order_id": "A1"})).ok
            crashed = (await client.reach("outage", {}, timeout_ms=3000)).error
            business = (await client.reach("refuse", {})).error
            events = [event async for event in client.stream("count", {"upto": 2})]
    assert [event.kind for event in events] == ["data", "data", "error"]
    assert crashed is not None and business is not None and events[-1].error is not None
    assert business.type == BusinessError.code
    streamed = next(s for s in by_kind(exporter.get_finished_spans(), SpanKind.CLIENT) if s.attributes and
                    s.attributes["reach.capability"] == "count")  # fmt: skip
    attributes = dict(streamed.attributes or {})
    assert violations(attributes, "invoke_agent.client", "http.client", failed=True) == []
    assert attributes["url.full"] == f"{server.url}/reach/stream" and attributes["http.response.status_code"] == 200
    assert streamed.name == "invoke_agent orders" and streamed.status.status_code == StatusCode.ERROR
    servers = {span.name: span for span in by_kind(exporter.get_finished_spans(), SpanKind.SERVER)}
    assert servers["reach.agent query_order"].status.status_code == StatusCode.UNSET
    told = {"outage": crashed.type, "refuse": business.type, "count": events[-1].error.type}
    for name, kind in told.items():  # the span says what the caller was told
        span = servers[f"reach.agent {name}"]
        attributes = dict(span.attributes or {})
        assert span.status.status_code == StatusCode.ERROR, name
        assert attributes["error.type"] == kind and violations(attributes, failed=True) == [], name


async def test_invoke_agent_through_the_node_has_rpc_client_attributes(
    spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path
) -> None:
    """Through a real gRPC node the caller's CLIENT span carries rpc.system.name, rpc.method and the status code."""
    provider, exporter = spans
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        async with build_node(config, environ=TOKENS) as node:
            transport = GrpcNodeTransport(node.target, token=TOKENS["DEMO_TOKEN"])
            options: dict[str, Any] = {"tenant": "demo", "environ": TOKENS, "tracer_provider": provider}
            async with ReachClient(str(config), transport, **options) as client:
                assert (await client.reach("query_order", {"order_id": "T"})).ok
            wrong = GrpcNodeTransport(node.target, token="not-the-token")
            async with ReachClient(str(config), wrong, **options) as client:
                with pytest.raises(Exception):  # noqa: B017 - the refusal's class is not what this test pins
                    await client.reach("query_order", {"order_id": "T"})
    ok, refused = (dict(span.attributes or {}) for span in by_kind(exporter.get_finished_spans(), SpanKind.CLIENT))
    host, port = node.target.rsplit(":", 1)
    for attributes, failed in ((ok, False), (refused, True)):
        assert violations(attributes, "invoke_agent.client", "rpc.client", failed=failed) == []
        assert attributes["rpc.system.name"] == "grpc" and attributes["rpc.method"] == "reach.v1.ReachNode/Call"
        assert attributes["server.address"] == host and attributes["server.port"] == int(port)
        assert "url.full" not in attributes and "http.request.method" not in attributes
    assert ok["rpc.response.status_code"] == "OK"
    assert refused["rpc.response.status_code"] == "UNAUTHENTICATED"


async def test_hops_mark_their_server_spans_when_the_agent_behind_fails(
    spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path
) -> None:
    """A real gateway's and a real node's SERVER spans carry error status and error.type when the agent's handler
    raised; the caller's span to the gateway has the URL it posted to."""
    provider, exporter = spans
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        options: dict[str, Any] = {"tenant": "demo", "environ": TOKENS, "tracer_provider": provider}
        app = create_app(config, environ=TOKENS, tracer_provider=provider)
        with BackgroundServer(app, proxy_headers=False) as gateway:
            transport = GatewayTransport(gateway.url, token=TOKENS["DEMO_TOKEN"])
            async with ReachClient(str(config), transport, **options) as client:
                through_gateway = (await client.reach("outage", {}, timeout_ms=3000)).error
        async with build_node(config, environ=TOKENS, tracer_provider=provider) as node:
            transport = GrpcNodeTransport(node.target, token=TOKENS["DEMO_TOKEN"])
            async with ReachClient(str(config), transport, **options) as client:
                through_node = (await client.reach("outage", {}, timeout_ms=3000)).error
    assert through_gateway is not None and through_node is not None
    finished = exporter.get_finished_spans()
    for name, told in (("reach.gateway outage", through_gateway.type), ("reach.node outage", through_node.type)):
        [hop] = [span for span in finished if span.name == name]
        assert hop.status.status_code == StatusCode.ERROR, name
        assert violations(dict(hop.attributes or {}), failed=True) == [] and hop.attributes is not None, name
        assert hop.attributes["error.type"] == told, name
    caller = next(span for span in by_kind(finished, SpanKind.CLIENT) if span.parent is None)
    attributes = dict(caller.attributes or {})
    assert attributes["url.full"] == f"{gateway.url}/v1/reach" and attributes["http.request.method"] == "POST"
    assert violations(attributes, "invoke_agent.client", "http.client", failed=True) == []


async def test_execute_tool_duration_metric_by_its_current_name(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    """Tool calls are timed by gen_ai.execute_tool.duration (a histogram in s); its points and spans conform."""
    provider, exporter = spans
    reader = InMemoryMetricReader()
    metrics = ReachMetrics(meter_provider=MeterProvider(metric_readers=[reader]))
    with BackgroundServer(orders_agent(provider).app) as server:
        registry = MemoryRegistry()
        capabilities = [Capability(name=name) for name in ("query_order", "refuse")]
        await registry.register_agent(AgentDescriptor(name="orders", endpoints=[server.url], capabilities=capabilities))
        with ReachEnhancer(
            registry=registry, transport=DirectTransport(), matcher=False, tracer_provider=provider, metrics=metrics
        ) as enhancer:
            assert (await enhancer.areach(ToolCall("query_order", {"order_id": "A1"}, call_id="c1"))).ok
            assert not (await enhancer.areach(ToolCall("refuse", {}, has_local=False))).ok
    data = reader.get_metrics_data()
    assert data is not None
    found = [m for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics]
    [metric] = [m for m in found if m.name.startswith("gen_ai")]
    assert metric.name == GEN_AI_EXECUTE_TOOL_DURATION == "gen_ai.execute_tool.duration" and metric.unit == "s"
    points = [point for point in metric.data.data_points if isinstance(point, HistogramDataPoint)]
    assert len(points) == len(list(metric.data.data_points)) == 2
    for point in points:
        attributes = dict(point.attributes or {})
        failed = "error.type" in attributes
        assert violations(attributes, "gen_ai.execute_tool.duration", failed=failed) == []
    assert sorted(str(dict(p.attributes or {}).get("gen_ai.tool.type")) for p in points) == ["extension", "function"]
    tools = [span for span in exporter.get_finished_spans() if span.name.startswith("execute_tool ")]
    assert [span.name for span in tools] == ["execute_tool query_order", "execute_tool refuse"]
    for span, failed in zip(tools, (False, True), strict=True):
        assert violations(dict(span.attributes or {}), "execute_tool", failed=failed) == []
        assert (span.status.status_code == StatusCode.ERROR) is failed
