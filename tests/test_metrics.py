"""Metrics: every instrument operators chart, read from an in-memory reader after a real fault drill."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from servers import free_port

from reach_plugins import AgentDescriptor, Capability, ReachEnhancer
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import BusinessError, SessionClosed
from reach_plugins.frameworks.toolcalls import ToolCall
from reach_plugins.model import Attempt, CircuitBreakerConfig, Instance, ReachTrace, RouteDecision
from reach_plugins.registry import MemoryRegistry
from reach_plugins.telemetry import metrics as m
from reach_plugins.telemetry.metrics import ReachMetrics, attempt_outcome, fan_out
from reach_plugins.telemetry.spans import server_attributes
from transports.direct import DirectTransport

Points = dict[str, list[tuple[dict[str, Any], Any]]]


def points(reader: InMemoryMetricReader) -> Points:
    """Every data point by instrument name: (attributes, value or histogram count)."""
    found: Points = defaultdict(list)
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    found[metric.name].append((dict(point.attributes or {}), point.count if value is None else value))
    return found


def total(found: Points, name: str, **where: Any) -> float:
    """The sum of ``name``'s points whose attributes include ``where``."""
    return sum(value for attributes, value in found[name] if where.items() <= attributes.items())


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # the router judges heartbeats on wall-clock time

    def __call__(self) -> float:
        return self.now


STARTED: list[str] = []
"""Tickets the slow report began working on (in the agent's thread)."""


def orders_agent() -> ReachAgent:
    agent = ReachAgent("orders")

    @agent.capability("query_order", description="Look up an order")
    def query_order(order_id: str) -> dict[str, str]:
        if order_id == "A9":
            raise BusinessError("there is no order A9")
        return {"order_id": order_id, "status": "shipped"}

    @agent.capability("slow_report", description="A report that takes a while")
    async def slow_report(ticket: str) -> str:
        STARTED.append(ticket)
        await asyncio.sleep(5)
        return "late"

    return agent


def ledger_agent() -> ReachAgent:
    agent = ReachAgent("ledger")

    @agent.capability("post_entry", description="Post a ledger entry")
    def post_entry(amount: int) -> dict[str, int]:
        return {"posted": amount}

    return agent


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def metrics(reader: InMemoryMetricReader) -> ReachMetrics:
    return ReachMetrics(meter_provider=MeterProvider(metric_readers=[reader]))


async def until(check: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_every_instrument_after_a_fault_drill(metrics: ReachMetrics, reader: InMemoryMetricReader) -> None:
    """A dead instance, a business refusal, a timeout, a replay, a closed session, an expired heartbeat: all counted."""
    clock = Clock()
    registry = MemoryRegistry(clock=clock)
    watching = asyncio.create_task(metrics.watch(registry))
    orders, ledger = [orders_agent(), orders_agent()], ledger_agent()
    with (
        BackgroundServer(orders[0].app) as first,
        BackgroundServer(orders[1].app) as second,
        BackgroundServer(ledger.app) as ledger_server,
    ):
        servers = {"orders-1": first, "orders-2": second}
        registrations = {
            name: await agent.register(registry, servers[name].url, instance_id=name, metrics=metrics)
            for name, agent in zip(servers, orders, strict=True)
        }
        dead = f"http://127.0.0.1:{free_port()}"
        breaker = CircuitBreakerConfig(min_calls=2, error_threshold=0.3, open_wait=60)
        capability = Capability(name="post_entry", description="Post a ledger entry")
        descriptor = AgentDescriptor(
            name="ledger", endpoints=[dead, ledger_server.url], capabilities=[capability], circuit_breaker=breaker
        )
        await registry.register_agent(descriptor)
        with ReachEnhancer(registry=registry, transport=DirectTransport(), matcher=False, metrics=metrics) as e:
            for n in range(6):  # round robin sends some to the dead instance first: not delivered, failover, breaker
                assert (await e.areach(ToolCall("post_entry", {"amount": n}))).ok
            assert (await e.areach(ToolCall("query_order", {"order_id": "A1"}, session_key="s-1"))).ok
            pinned = (await e.areach(ToolCall("query_order", {"order_id": "A2"}, session_key="s-1"))).route
            assert pinned is not None and pinned.instance in servers
            servers[pinned.instance].stop()  # the conversation's instance dies: the next call restores elsewhere
            moved = (await e.areach(ToolCall("query_order", {"order_id": "A4"}, session_key="s-1"))).route
            assert moved is not None and moved.context_restore and moved.instance != pinned.instance
            assert isinstance((await e.areach(ToolCall("query_order", {"order_id": "A9"}))).error, BusinessError)
            late = await e.blocking.bridge.submit(e.client.reach("slow_report", {"ticket": "t-1"}, timeout_ms=300))
            assert late.status == "timeout"
            for _ in range(2):
                replay = e.client.reach("query_order", {"order_id": "A3"}, idempotency_key="k-1")
                assert (await e.blocking.bridge.submit(replay)).ok
            slow = ToolCall("slow_report", {"ticket": "t-2"}, session_key="s-2", has_local=False)
            running = asyncio.ensure_future(e.areach(slow))
            await until(lambda: "t-2" in STARTED, "the agent to start the slow report")
            await e.aclose_session("s-2")
            cancelled = await running
            assert isinstance(cancelled.error, SessionClosed)
        for registration in registrations.values():
            await registration.halt()
        clock.now += 3600  # no heartbeat for an hour
        registry.sweep()
        await until(lambda: total(points(reader), m.HEARTBEAT_EXPIRATIONS) >= 2, "heartbeat expiry")
        await registry.aclose()
        await watching

    found = points(reader)
    assert total(found, m.REQUESTS, **{"reach.capability": "post_entry", "reach.status": "success"}) == 6
    assert total(found, m.REQUEST_DURATION, **{"reach.capability": "query_order"}) >= 4
    assert total(found, m.ATTEMPTS, **{"reach.outcome": "not_delivered"}) >= 1
    assert total(found, m.ATTEMPTS, **{"reach.outcome": "unknown"}) >= 1
    assert total(found, m.ATTEMPTS, **{"reach.outcome": "business"}) == 1
    assert total(found, m.ATTEMPTS, **{"reach.outcome": "success"}) >= 9
    assert total(found, m.FAILOVERS) >= 1
    assert total(found, m.BREAKER_TRANSITIONS, **{"reach.breaker.to": "open"}) >= 1
    assert dict(found[m.BREAKER_STATE][0][0]) and max(value for _, value in found[m.BREAKER_STATE]) == 2
    assert total(found, m.DEDUP_HITS, **{"reach.capability": "query_order"}) == 1
    first_two = [total(found, m.ROUTE_DECISIONS, **{"reach.route.affinity": kind}) for kind in ("new", "pinned")]
    assert sum(first_two) == 2 and first_two[1] >= 1  # the first call pins (a shared pin store answers "pinned")
    assert total(found, m.ROUTE_DECISIONS, **{"reach.route.affinity": "restored"}) == 1
    assert total(found, m.ROUTE_DECISIONS, **{"reach.degraded": "false"}) >= 10
    assert total(found, m.SESSIONS_CLOSED) == 1
    assert total(found, m.CANCELLATIONS, **{"reach.capability": "slow_report"}) == 1
    assert total(found, m.TOOL_ROUTES, **{"reach.tool.rule": "exact", "reach.tool.side": "remote"}) >= 9
    assert total(found, m.GEN_AI_EXECUTE_TOOL_DURATION, **{"gen_ai.operation.name": "execute_tool"}) >= 9
    assert total(found, m.GEN_AI_EXECUTE_TOOL_DURATION, **{"error.type": "BusinessError"}) == 1
    assert total(found, m.REGISTRATIONS, **{"reach.agent": "orders", "reach.result": "success"}) == 2
    assert total(found, m.HEARTBEAT_EXPIRATIONS, **{"reach.agent": "orders"}) == 2


async def test_a_failed_registration_is_counted(metrics: ReachMetrics, reader: InMemoryMetricReader) -> None:
    """A registry that refuses the instance counts a failure, and the error still reaches the caller."""

    class Refusing(MemoryRegistry):
        async def register_instance(self, instance: Any) -> None:
            raise ConnectionError("registry down")

    with pytest.raises(ConnectionError):
        await ledger_agent().register(Refusing(), "http://127.0.0.1:1", metrics=metrics)
    assert total(points(reader), m.REGISTRATIONS, **{"reach.result": "failure"}) == 1


@pytest.mark.parametrize(
    ("fields", "outcome"),
    [
        ({"outcome": "transient", "delivery": "not_delivered"}, "not_delivered"),
        ({"outcome": "transient", "delivery": "unknown"}, "unknown"),
        ({"outcome": "timeout"}, "unknown"),
        ({"outcome": "transient"}, "failed"),
        ({"outcome": "handler_failed"}, "failed"),
        ({"outcome": "business"}, "business"),
        ({"outcome": "success"}, "success"),
    ],
)
def test_attempt_outcomes_use_the_contracts_names(fields: dict[str, Any], outcome: str) -> None:
    """An attempt's outcome is named as DESIGN 11.1 names it (not_delivered, unknown, failed, business, success)."""
    attempt = Attempt(
        number=1, agent="a", instance="a-1", endpoint="http://127.0.0.1:1", started_at=0, duration_ms=1, **fields
    )
    assert attempt_outcome(attempt) == outcome


def test_fan_out_feeds_every_sink_and_survives_a_broken_one() -> None:
    """fan_out(None, a) is a; fan_out(a, b) gives each the trace even when the first raises."""
    seen: list[Any] = []

    class Broken:
        def emit(self, trace: Any) -> None:
            raise RuntimeError("disk full")

    class Keeps:
        def emit(self, trace: Any) -> None:
            seen.append(trace)

    keeps = Keeps()
    assert fan_out(None, keeps) is keeps and fan_out() is None
    sink = fan_out(Broken(), keeps)
    assert sink is not None
    trace = SimpleNamespace(request_id="r-1")
    sink.emit(trace)  # type: ignore[arg-type]
    assert seen == [trace]


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://user:secret@127.0.0.1:8080/reach?token=x", {"server.address": "127.0.0.1", "server.port": 8080,
                                                             "url.full": "http://127.0.0.1:8080/reach"}),
        ("https://127.0.0.1/v1", {"server.address": "127.0.0.1", "server.port": 443, "url.full": "https://127.0.0.1/v1"}),
        ("not a url", {}),
    ],
)  # fmt: skip
def test_server_attributes_strip_credentials(endpoint: str, expected: dict[str, Any]) -> None:
    """server.address / server.port / url.full of an endpoint, never its user, password or query."""
    assert server_attributes(endpoint) == expected


async def test_spans_carry_tool_type_and_server_attributes(spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    """execute_tool has gen_ai.tool.type (function; extension for a proxy); invoke_agent has server.*, the URL sent."""
    provider, exporter = spans
    ledger = ledger_agent()
    with BackgroundServer(ledger.app) as server:
        registry = MemoryRegistry()
        port = server.url.rsplit(":", 1)[1]
        capability = Capability(name="post_entry", description="Post a ledger entry")
        await registry.register_agent(AgentDescriptor(name="ledger", endpoints=[server.url], capabilities=[capability]))
        with ReachEnhancer(
            registry=registry, transport=DirectTransport(), matcher=False, tracer_provider=provider
        ) as e:
            assert (await e.areach(ToolCall("post_entry", {"amount": 1}))).ok
            assert (await e.areach(ToolCall("post_entry", {"amount": 2}, has_local=False))).ok
    by_name: dict[str, list[Any]] = defaultdict(list)
    for span in exporter.get_finished_spans():
        by_name[span.name].append(dict(span.attributes or {}))
    assert [a["gen_ai.tool.type"] for a in by_name["execute_tool post_entry"]] == ["function", "extension"]
    client = by_name["invoke_agent ledger"][0]
    assert client["server.address"] == "127.0.0.1" and client["server.port"] == int(port)
    assert client["url.full"] == f"http://127.0.0.1:{port}/reach"
    assert client["http.request.method"] == "POST" and client["http.response.status_code"] == 200


DASHBOARD = Path(__file__).resolve().parent.parent / "notebooks" / "grafana" / "reach_dashboard.json"


def test_the_grafana_dashboard_queries_what_the_exporter_serves() -> None:
    """Every metric and label the dashboard's queries name is in a server's /metrics (Prometheus exporter names)."""
    from reach_plugins.telemetry.prometheus import Metrics

    served = Metrics()
    reach = served.reach
    route = RouteDecision(capability="c", agent="a", instance="a-1", endpoint="http://127.0.0.1:1", reason="r")
    attempt = Attempt(number=1, agent="a", instance="a-1", endpoint="http://127.0.0.1:1", started_at=0, duration_ms=1,
                      outcome="success")  # fmt: skip
    events = [{"event": name, "at": 0.0} for name in ("reach.retry", "reach.failover", "reach.dedup_hit")]
    events.append({"event": "reach.breaker", "at": 0.0, "instance": "a-1", "reach.breaker.from": "closed",
                   "reach.breaker.to": "open"})  # fmt: skip
    reach.emit(ReachTrace(request_id="r", capability="c", route=route, attempts=[attempt], events=events,
                          status="success", dedup_hit=True))  # fmt: skip
    reach.tool_route("t", "semantic", remote=True)
    reach.tool_call("t", 0.1)
    reach.session_closed()
    reach.cancellation("c")
    reach.registration("a", ok=True)
    reach.heartbeat_expirations.add(1, {"reach.agent": "a"})
    text = served.render()
    exposed = set(re.findall(r"^([a-z_]+?)(?:_bucket|_sum|_count|_created)?[{ ]", text, re.MULTILINE))
    labels = set(re.findall(r'([a-z_]+)="', text))
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(queries) >= 12
    for query in queries:
        for name in re.findall(r"\b((?:reach|gen_ai)_[a-z_]+)\b", query):
            if name in labels:
                continue
            assert name.removesuffix("_bucket") in exposed, f"{name} (in {query!r}) is not served"
        for label in re.findall(r"([a-z_]+)=~?\"", query) + re.findall(r"by \(([a-z_, ]+)\)", query):
            for one in label.split(", "):
                assert one in labels | {"le"}, f"label {one} (in {query!r}) is not served"


def test_running_totals_read_back_exactly_across_collects_and_threads() -> None:
    """8 threads x 1,000 adds on two attribute sets: every collect shows the cumulative sums, never more or less."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    counter = m.RunningTotals(meter, "t.adds", unit="1", description="test")
    seen: list[float] = []

    def adder(parity: int) -> None:
        for _ in range(1000):
            counter.add(1, {"side": "even" if parity % 2 == 0 else "odd"})

    threads = [threading.Thread(target=adder, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):  # collect while they add: sums only ever grow
        seen.append(total(points(reader), "t.adds"))
    for thread in threads:
        thread.join()
    found = points(reader)
    assert total(found, "t.adds", side="even") == total(found, "t.adds", side="odd") == 4000
    assert seen == sorted(seen) and all(value <= 8000 for value in seen)
    assert total(points(reader), "t.adds") == 8000  # cumulative: a second read shows the same totals


def test_running_totals_fold_attribute_sets_past_the_limit() -> None:
    """Past its limit of attribute sets a counter adds to one overflow set: nothing is lost, memory is bounded."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("test")
    counter = m.RunningTotals(meter, "t.instances", unit="1", description="test", limit=10)
    for number in range(50):
        counter.add(2, {"instance": f"i-{number}"})
    found = points(reader)
    assert len(found["t.instances"]) == 11
    assert total(found, "t.instances") == 100
    assert total(found, "t.instances", **{"otel.metric.overflow": "true"}) == 80


async def test_a_server_counts_registrations_and_expiry_but_not_a_drained_stop(
    metrics: ReachMetrics, reader: InMemoryMetricReader
) -> None:
    """Seen through the registry: each instance that appears registers once (heartbeats are not registrations); one
    gone while ready (lease expired) or marked down is an expiry, counted once; one that drained first is not."""
    clock = Clock()
    registry = MemoryRegistry(clock=clock)
    await registry.register_agent(AgentDescriptor(name="orders", capabilities=[Capability(name="q", description="q")]))
    watching = asyncio.create_task(metrics.watch(registry, registrations=True))
    await asyncio.sleep(0)  # the watch subscribes

    def instance(name: str, status: Any = "ready", seq: int = 1) -> Instance:
        endpoint = f"http://127.0.0.1:{free_port()}"
        return Instance(agent="orders", instance_id=name, endpoint=endpoint, status=status, heartbeat_seq=seq,
                        last_heartbeat=clock.now)  # fmt: skip

    for name in ("killed", "stopped", "silent"):
        await registry.register_instance(instance(name))
    await registry.register_instance(instance("killed", seq=2))  # a heartbeat
    await registry.register_instance(instance("stopped", "draining", seq=2))
    await registry.deregister_instance("orders", "killed")
    await registry.deregister_instance("orders", "stopped")
    clock.now += 3600
    registry.sweep()  # "silent" stopped heartbeating: instance_down, then its lease goes too
    await registry.deregister_instance("orders", "silent")
    await registry.aclose()  # the watch ends after the events before it
    await watching
    found = points(reader)
    assert total(found, m.REGISTRATIONS, **{"reach.agent": "orders", "reach.result": "success"}) == 3
    assert total(found, m.HEARTBEAT_EXPIRATIONS, **{"reach.agent": "orders"}) == 2
