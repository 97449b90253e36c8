"""Metrics follow the global MeterProvider by default, as spans follow the global TracerProvider.

Each case runs in a fresh interpreter (a process sets its global provider once): a real agent under
uvicorn, a client and an enhancer given no ``sink`` and no ``metrics``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REACHES = 20

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from reach_plugins import ReachClient, ReachEnhancer
    from reach_plugins.agent import BackgroundServer, ReachAgent
    from reach_plugins.frameworks.toolcalls import ToolCall
    from reach_plugins.model import AgentDescriptor, Capability
    from reach_plugins.registry import MemoryRegistry
    from reach_plugins.telemetry.metrics import global_metrics
    from transports.direct import DirectTransport

    REACHES, INSTALL, SINK = int(sys.argv[1]), sys.argv[2] == "sdk", sys.argv[3] == "sink"
    agent = ReachAgent("orders")

    @agent.capability("query_order", description="Where an order is")
    def query_order(order_id: str) -> dict:
        return {"order_id": order_id}

    class Kept:
        def __init__(self):
            self.all = []
        def emit(self, trace):
            self.all.append(trace)

    async def main() -> dict:
        before = global_metrics()
        reader = InMemoryMetricReader()
        if INSTALL:
            metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        kept = Kept()
        with BackgroundServer(agent.app) as server:
            registry = MemoryRegistry()
            capabilities = [Capability(name="query_order")]
            descriptor = AgentDescriptor(name="orders", endpoints=[server.url], capabilities=capabilities)
            await registry.register_agent(descriptor)
            options = {"sink": kept} if SINK else {}
            async with ReachClient(registry, DirectTransport(), **options) as client:
                for n in range(REACHES):
                    assert (await client.reach("query_order", {"order_id": f"A{n}"})).ok
            with ReachEnhancer(registry=registry, transport=DirectTransport(), matcher=False) as enhancer:
                assert (await enhancer.areach(ToolCall("query_order", {"order_id": "B1"}))).ok
        totals = {}
        data = reader.get_metrics_data() if INSTALL else None
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        totals[metric.name] = totals.get(metric.name, 0) + (point.count if value is None else value)
        return {"before": before is not None, "totals": totals, "kept": len(kept.all)}

    print("RESULT " + json.dumps(asyncio.run(main())))
    """
)


def run(install: str, sink: str) -> dict[str, Any]:
    """The script's result: whether metrics existed before an SDK, the metric totals, traces the given sink kept."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(REACHES), install, sink],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def test_reaches_are_counted_on_the_global_meter_provider_without_a_sink() -> None:
    """With an SDK MeterProvider installed globally, 20 reaches and one tool call are recorded, no sink passed."""
    result = run("sdk", "none")
    assert result["before"] is False
    totals = result["totals"]
    assert totals["reach.client.requests"] == REACHES + 1
    assert totals["reach.client.request.duration"] == REACHES + 1
    assert totals["gen_ai.execute_tool.duration"] == 1


def test_no_sdk_no_metrics_and_a_given_sink_overrides() -> None:
    """Without an SDK nothing is built; with one, ``sink=`` replaces the global default for that client."""
    assert run("none", "none") == {"before": False, "totals": {}, "kept": 0}
    result = run("sdk", "sink")
    assert result["kept"] == REACHES
    assert result["totals"]["reach.client.requests"] == 1  # the enhancer's own client: no sink given
