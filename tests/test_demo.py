"""The README's main command: the demo holds a conversation and survives an instance dying."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from reach_plugins.demo import run_demo


async def test_demo_conversation_survives_a_killed_instance() -> None:
    """Every turn is answered by a remote agent; the call after the kill fails over with context_restore."""
    out = io.StringIO()
    report = await run_demo(Console(file=out, width=120))
    assert len(report.answers) == 5 and all(trace.status == "success" for trace in report.traces)
    assert "A1001 is shipped" in report.answers[0] and "12 x blue kettle" in report.answers[1]
    assert "T-5001" in report.answers[3] and "returned within 7 days" in report.answers[4]
    orders = [t for t in report.traces if t.capability == "query_order"]
    assert orders[0].route is not None and orders[0].route.instance == report.killed
    after = orders[1].route
    assert after is not None and after.agent == "orders" and after.instance != report.killed
    assert after.context_restore and len(orders[1].attempts) == 2
    assert [e["event"] for e in orders[1].events][-1] == "reach.failover"
    text = out.getvalue()
    assert f"killed {report.killed}" in text and "context_restore" in text


async def test_demo_trace_runs_from_framework_to_agent() -> None:
    """One trace links the framework's tool span, the client span and the agent's server span."""
    report = await run_demo(Console(file=io.StringIO()))
    spans = {span.name: span for span in report.spans}
    tool, client, server = (
        spans["execute_tool check_stock"],
        spans["invoke_agent inventory"],
        spans["reach.agent check_inventory"],
    )
    assert tool.context is not None and client.parent is not None and server.parent is not None
    assert client.parent.span_id == tool.context.span_id
    assert client.context is not None and server.parent.span_id == client.context.span_id
    assert len({tool.context.trace_id, client.context.trace_id, server.context.trace_id}) == 1


def test_reach_demo_command_runs(tmp_path: Path) -> None:
    """`reach demo` (what scripts/demo.sh runs) exits 0, prints the failover and writes its trace file where it runs."""
    command = [sys.executable, "-m", "reach_plugins.cli", "demo"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "killed orders-" in result.stdout and "reach.failover" in result.stdout
    assert (tmp_path / "reach-traces.jsonl").read_text().count("\n") >= 5
