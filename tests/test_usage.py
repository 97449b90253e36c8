"""Usage per tenant, agent and capability: reported tokens, estimates from streamed text, and `reach usage`."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from reach_plugins import AgentDescriptor, ReachClient
from reach_plugins.cli import app
from reach_plugins.registry import MemoryRegistry
from reach_plugins.telemetry.trace import JsonLinesSink
from reach_plugins.telemetry.usage import read_traces, summarise, usage_of
from reach_plugins.transport import Call, MockTransport


def chat(call: Call) -> dict[str, Any]:
    """An OpenAI-compatible agent's normalised reply, with its usage in raw_meta."""
    words = str(call.request.payload.get("input", ""))
    return {
        "reply_content": f"echo {words}",
        "tool_calls": [],
        "raw_meta": {"usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42}},
    }


async def record(path: Path) -> None:
    registry = MemoryRegistry()
    registry.put_agent(AgentDescriptor(name="cloud", endpoints=["http://127.0.0.1:9"], capabilities=["chat"]))
    sink = JsonLinesSink(path)
    async with ReachClient(registry, MockTransport(chat), sink=sink) as client:
        for _ in range(3):
            await client.reach("chat", {"input": "hello"}, tenant="alpha")
        async for _ in client.stream("chat", {"input": "x" * 400}, tenant="beta"):
            pass
    sink.close()


def test_usage_of_reads_openai_shapes_only() -> None:
    """raw_meta.usage and usage count; other shapes and non-integer values do not."""
    assert usage_of({"raw_meta": {"usage": {"total_tokens": 5}}}) == {"total_tokens": 5}
    assert usage_of({"usage": {"prompt_tokens": 2, "model": "m", "flag": True}}) == {"prompt_tokens": 2}
    assert usage_of({"reply_content": "hi"}) is None and usage_of("text") is None


async def test_reported_and_estimated_tokens_sum_per_tenant(tmp_path: Path) -> None:
    """Three reported replies sum their total_tokens; a stream without usage is estimated from its text."""
    path = tmp_path / "traces.jsonl"
    await record(path)
    rows = {(row.tenant, row.capability): row for row in summarise(read_traces(path))}
    alpha, beta = rows["alpha", "chat"], rows["beta", "chat"]
    assert (alpha.calls, alpha.succeeded, alpha.reported_tokens, alpha.estimated_tokens) == (3, 3, 126, 0)
    assert beta.calls == 1 and beta.reported_tokens == 0 and 100 <= beta.estimated_tokens <= 110
    assert alpha.agent == "cloud"


async def test_reach_usage_prints_the_table_for_a_time_range(tmp_path: Path) -> None:
    """`reach usage FILE --since` sums only what started in range; a torn last line is skipped."""
    path = tmp_path / "traces.jsonl"
    await record(path)
    with path.open("a") as torn:
        torn.write('{"request_id": "cut')
    now = datetime.fromtimestamp(time.time(), tz=UTC)
    shown = CliRunner().invoke(app, ["usage", str(path)], env={"COLUMNS": "200"})
    later = CliRunner().invoke(app, ["usage", str(path), "--since", now.replace(year=now.year + 1).isoformat()])
    assert shown.exit_code == 0 and "alpha" in shown.output and "126" in shown.output and "beta" in shown.output
    assert later.exit_code == 0 and "alpha" not in later.output


async def test_usage_is_counted_as_metrics_per_tenant() -> None:
    """ReachMetrics as the sink: calls and reported / estimated tokens per tenant, agent and capability."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from test_metrics import points, total

    from reach_plugins.telemetry.metrics import USAGE_CALLS, USAGE_TOKENS, ReachMetrics

    reader = InMemoryMetricReader()
    registry = MemoryRegistry()
    registry.put_agent(AgentDescriptor(name="cloud", endpoints=["http://127.0.0.1:9"], capabilities=["chat"]))
    sink = ReachMetrics(meter_provider=MeterProvider(metric_readers=[reader]))
    async with ReachClient(registry, MockTransport(chat), sink=sink) as client:
        for _ in range(3):
            await client.reach("chat", {"input": "hello"}, tenant="alpha")
        async for _ in client.stream("chat", {"input": "x" * 400}, tenant="beta"):
            pass
    found = points(reader)
    assert total(found, USAGE_CALLS, **{"reach.tenant": "alpha", "reach.agent": "cloud"}) == 3
    assert total(found, USAGE_TOKENS, **{"reach.tenant": "alpha", "reach.usage.source": "reported"}) == 126
    assert 100 <= total(found, USAGE_TOKENS, **{"reach.tenant": "beta", "reach.usage.source": "estimated"}) <= 110
