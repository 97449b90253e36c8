"""`reach trace`: a request's route decision and attempts replayed from a JSON-lines trace file; `--tail` follows it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from reach_plugins import AgentDescriptor, Capability, ReachClient
from reach_plugins.errors import ConfigError
from reach_plugins.registry import MemoryRegistry
from reach_plugins.telemetry.trace import JsonLinesSink
from reach_plugins.telemetry.traceview import find_trace, rounded
from reach_plugins.transport import MockTransport

COLD_RUNS = 5
CLI = [sys.executable, "-m", "reach_plugins.cli"]
RAW_FLOAT = re.compile(r"\d+\.\d{4,}")
"""A number printed with four or more decimals: not rounded for people."""


def run(*args: str, cwd: Path) -> str:
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("run_number", range(COLD_RUNS))
def test_a_cold_demo_prints_the_whole_tree_and_its_trace_file_replays(tmp_path: Path, run_number: int) -> None:
    """Each fresh `reach demo` prints all three levels and rounded values; `reach trace` replays its failover."""
    demo = run("demo", "--trace-file", "traces.jsonl", cwd=tmp_path)
    assert "reach.agent query_order server" in demo and "invoke_agent orders client" in demo
    assert "I opened ticket T-5001" in demo and "returned within 7 days" in demo
    panel = demo[demo.index("failover, retry and breaker events") : demo.index("trace of the call")]
    assert "reach.failover" in panel and not RAW_FLOAT.search(panel)
    request_id = re.search(r"reach trace ([0-9a-f]{32}) --file", demo.replace("\n", " "))
    assert request_id is not None
    replay = run("trace", request_id.group(1)[:8], "--file", "traces.jsonl", cwd=tmp_path)
    assert replay.startswith(f"{request_id.group(1)} query_order -> orders/")
    assert "route: orders/" in replay and "affinity restored" in replay and "<- picked" in replay
    assert "attempt 1 -> orders/" in replay and "not delivered" in replay and "reach.failover" in replay
    assert not RAW_FLOAT.search(replay)


async def write_traces(path: Path, count: int, *, capability: str = "query_order") -> list[str]:
    """``count`` real requests through a client whose sink is a JSON-lines file; their request ids."""
    registry = MemoryRegistry()
    cap = Capability(name=capability, description="Look up an order")
    await registry.register_agent(AgentDescriptor(name="orders", endpoints=["http://127.0.0.1:9"], capabilities=[cap]))
    sink = JsonLinesSink(path)
    async with ReachClient(registry, MockTransport(lambda call: {"ok": True}), sink=sink) as client:
        ids = [(await client.reach(capability, {"n": n}, session_id="s-1")).request_id for n in range(count)]
    sink.close()
    return ids


async def test_tail_follows_new_requests(tmp_path: Path) -> None:
    """--tail prints each request appended after it started, and --count stops it."""
    path = tmp_path / "live.jsonl"
    await write_traces(path, 1)  # already there: not shown
    tail = subprocess.Popen(
        [*CLI, "trace", "--tail", "--count", "2", "--file", str(path)], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert tail.stdout is not None and "following" in tail.stdout.readline()
        ids = await write_traces(path, 2)
        out, _ = tail.communicate(timeout=60)
    finally:
        tail.kill()
    assert tail.returncode == 0
    shown = re.findall(r"^([0-9a-f]{32}) query_order -> orders/orders-0 success", out, re.MULTILINE)
    assert shown == ids
    assert "affinity new" in out and "affinity pinned" in out


async def test_find_trace_by_prefix_and_the_errors_that_say_what_to_do(tmp_path: Path) -> None:
    """A unique prefix finds a request; an unknown id, an ambiguous prefix or a missing file name the fix."""
    path = tmp_path / "t.jsonl"
    ids = await write_traces(path, 2)
    assert find_trace(path, ids[1][:12]).request_id == ids[1]
    with pytest.raises(ConfigError, match="no request 'nope'"):
        find_trace(path, "nope")
    with pytest.raises(ConfigError, match="matches 2 requests"):
        find_trace(path, "")
    with pytest.raises(ConfigError, match="no trace file"):
        find_trace(tmp_path / "missing.jsonl", ids[0])


def test_trace_needs_an_id_or_tail(tmp_path: Path) -> None:
    """`reach trace` with neither an id nor --tail (or both) exits 2 and says what to give."""
    out = subprocess.run([*CLI, "trace"], capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)
    assert out.returncode == 2 and "give a REQUEST_ID, or --tail" in out.stdout


@pytest.mark.parametrize(
    ("value", "shown"), [(64.76655296663247, 64.8), (0.000123456, 0.000123), (3, 3), (True, True), ("x", "x")]
)
def test_rounded_for_people(value: object, shown: object) -> None:
    """Floats get 1 decimal from 1 up and 3 significant digits below; other values are left alone."""
    assert rounded(value) == shown
