"""The trajectory (ReachTrace): what it records, when it is returned, and the sinks that store it."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
from core_fakes import FakeAgent, FakeRouter, make_agent

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import ConfigError, UnknownCapability
from reach_plugins.model import ReachRequest, ReachTrace
from reach_plugins.telemetry.trace import JsonLinesSink, LoggingSink, TraceSink, open_sink
from reach_plugins.testing.clock import FakeClock


def setup(sink: TraceSink | None = None) -> tuple[FakeClock, FakeAgent, Pipeline]:
    clock = FakeClock()
    fake = FakeAgent(clock)
    router = FakeRouter([make_agent()])
    return clock, fake, Pipeline(router=router, transport=fake.transport, clock=clock, rng=random.Random(0), sink=sink)


def order() -> ReachRequest:
    return ReachRequest(capability="query_order", payload={"order_id": "A1"}, session_id="s-1")


class Collect:
    def __init__(self) -> None:
        self.traces: list[ReachTrace] = []

    def emit(self, trace: ReachTrace) -> None:
        self.traces.append(trace)


async def test_trace_lists_route_attempts_and_final_status() -> None:
    """trace=True returns the route decision, each attempt (endpoint, timing, error, delay, breaker) and status."""
    _, fake, pipeline = setup()
    fake.script("*", "503")
    response = await pipeline.run(order(), trace=True)
    trace = response.trace
    assert trace is not None and trace.status == "success" and trace.session_id == "s-1"
    assert trace.route is not None and trace.route.reason == "round robin (fake)"
    first, second = trace.attempts
    assert (first.endpoint, first.outcome, first.breaker_state) == ("http://orders-0.test", "transient", "closed")
    assert first.error is not None and "503" in first.error
    assert first.duration_ms == pytest.approx(10.0)
    assert second.outcome == "success" and second.number == 2
    assert trace.duration_ms == pytest.approx(response.cost_ms)


async def test_successes_carry_no_trace_unless_asked() -> None:
    """Without trace=True a success has no trace; a failure always has one."""
    _, fake, pipeline = setup()
    assert (await pipeline.run(order())).trace is None
    fake.default("business")
    assert (await pipeline.run(order())).trace is not None


async def test_sink_gets_every_request_including_refusals() -> None:
    """Each request, answered or refused, hands exactly one trace to the sink."""
    sink = Collect()
    _, _, pipeline = setup(sink)
    await pipeline.run(order())
    with pytest.raises(UnknownCapability):
        await pipeline.run(ReachRequest(capability="launch_rocket"))
    assert [t.status for t in sink.traces] == ["success", "error"]
    assert sink.traces[1].error is not None and "launch_rocket" in sink.traces[1].error.message


async def test_json_lines_sink_writes_one_line_per_request(tmp_path: Path) -> None:
    """The file sink appends one parseable JSON line per request."""
    path = tmp_path / "traces.jsonl"
    sink = JsonLinesSink(path)
    _, _, pipeline = setup(sink)
    for _ in range(3):
        await pipeline.run(order())
    sink.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    assert {json.loads(line)["capability"] for line in lines} == {"query_order"}


async def test_logging_sink_logs_the_trace(caplog: pytest.LogCaptureFixture) -> None:
    """The logging sink writes each trace as a JSON message."""
    _, _, pipeline = setup(LoggingSink())
    with caplog.at_level(logging.INFO, logger="reach_plugins.trace"):
        await pipeline.run(order())
    assert json.loads(caplog.records[-1].getMessage())["status"] == "success"


async def test_a_broken_sink_never_breaks_a_request(caplog: pytest.LogCaptureFixture) -> None:
    """A sink that raises is logged and ignored; the request still succeeds."""

    class Broken:
        def emit(self, trace: ReachTrace) -> None:
            raise OSError("disk full")

    _, _, pipeline = setup(Broken())
    assert (await pipeline.run(order())).ok
    assert "disk full" in caplog.text


def test_open_sink_specs(tmp_path: Path) -> None:
    """'none', 'logging', 'file://...' and *.jsonl name the sinks; anything else is a ConfigError."""
    assert open_sink(None) is None and open_sink("none") is None
    assert isinstance(open_sink("logging"), LoggingSink)
    assert isinstance(open_sink(f"file://{tmp_path}/t.jsonl"), JsonLinesSink)
    assert isinstance(open_sink("t.jsonl"), JsonLinesSink)
    with pytest.raises(ConfigError, match="trace sink"):
        open_sink("kafka://x")
