"""Cells of ``02_multi_agent_chain.ipynb``: three agents in three processes, one trace, drawn as a waterfall."""

CELLS: list[tuple[str, str]] = [
    (
        "md",
        """
# A chain of three agents across three processes, in one trace

A customer message reaches the **desk** agent, which reaches **orders** by
capability (`query_order`), which reaches **inventory** (`check_inventory`).
Each agent is its own process, started here with the agent SDK. Every hop is
an OpenTelemetry span; the W3C `traceparent` header links them, so the spans
the three processes write separately form one trace. We draw it as a
waterfall with matplotlib.

Runs offline, no API key, in a few seconds.
""",
    ),
    (
        "code",
        """
import json
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx
import matplotlib.pyplot as plt
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reach_plugins import ReachClient

AGENTS = {"desk": "handle_request", "orders": "query_order", "inventory": "check_inventory"}
""",
    ),
    (
        "md",
        """
## Start the three agent processes

The registry is a YAML file every process reads (`file://agents.yaml`); each
process exports its spans to its own JSON-lines file. `chain_agent.py`, next
to this notebook, is the agent code.
""",
    ),
    (
        "code",
        """
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


folder = Path(tempfile.mkdtemp(prefix="reach-chain-"))
ports = {name: free_port() for name in AGENTS}
registry = folder / "agents.yaml"
registry.write_text(
    "agents:\\n"
    + "".join(
        f"  - name: {name}\\n    endpoint: http://127.0.0.1:{ports[name]}\\n    capabilities: [{capability}]\\n"
        for name, capability in AGENTS.items()
    )
)
processes = {
    name: subprocess.Popen(
        [sys.executable, "chain_agent.py", name, str(ports[name]), f"file://{registry}", str(folder / f"{name}.jsonl")]
    )
    for name in AGENTS
}


def ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


deadline = time.monotonic() + 30
while not all(ready(port) for port in ports.values()):
    assert time.monotonic() < deadline, "the agent processes did not start"
    time.sleep(0.1)
print({name: f"pid {process.pid} on :{ports[name]}" for name, process in processes.items()})
""",
    ),
    (
        "md",
        """
## Reach the desk

The client has its own tracer provider; its `invoke_agent desk` span is the
root of the trace. The first call opens the connections of every hop; we draw
the second, warm one.
""",
    ),
    (
        "code",
        """
exporter = InMemorySpanExporter()
provider = TracerProvider(resource=Resource.create({"service.name": "notebook"}))
provider.add_span_processor(SimpleSpanProcessor(exporter))

async with ReachClient(f"file://{registry}", tracer_provider=provider) as client:
    for order_id in ("A1000", "A1001"):
        response = await client.reach(
            "handle_request", {"message": "Where is my order?", "order_id": order_id}, session_id="conv-1"
        )
trace_id = f"0x{exporter.get_finished_spans()[-1].context.trace_id:032x}"
print(response.status, json.dumps(response.data, indent=1))
print("drawing trace", trace_id)
""",
    ),
    (
        "md",
        """
## Gather the spans of all four processes

Each agent writes its server span when the request ends, which can be a
moment after the answer arrives: wait until every process has written the
span of this trace.
""",
    ),
    (
        "code",
        """
def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def of_trace(name: str) -> list[dict]:
    path = folder / f"{name}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [span for span in map(json.loads, lines) if span["context"]["trace_id"] == trace_id]


deadline = time.monotonic() + 10
while not all(any(s["kind"] == "SpanKind.SERVER" for s in of_trace(name)) for name in AGENTS):
    assert time.monotonic() < deadline, "an agent wrote no server span for the trace"
    time.sleep(0.05)

local = [json.loads(span.to_json(indent=None)) for span in exporter.get_finished_spans()]
spans = [
    {
        "name": span["name"],
        "service": span["resource"]["attributes"]["service.name"],
        "trace_id": span["context"]["trace_id"],
        "span_id": span["context"]["span_id"],
        "parent_id": span["parent_id"],
        "start": parse_time(span["start_time"]),
        "end": parse_time(span["end_time"]),
    }
    for span in [s for s in local if s["context"]["trace_id"] == trace_id] + [s for n in AGENTS for s in of_trace(n)]
]
print(f"{len(spans)} spans from {len({s['service'] for s in spans})} processes in trace {trace_id}")
""",
    ),
    (
        "code",
        """
by_id = {span["span_id"]: span for span in spans}


def depth(span: dict) -> int:
    parent = by_id.get(span["parent_id"])
    return 0 if parent is None else depth(parent) + 1


ordered = sorted(spans, key=lambda span: (span["start"], depth(span)))
origin = ordered[0]["start"]
for span in ordered:
    offset, length = (span["start"] - origin) * 1000, (span["end"] - span["start"]) * 1000
    print(f"{'  ' * depth(span)}{span['name']:<32} {span['service']:<10} +{offset:6.1f} ms  {length:6.1f} ms")
""",
    ),
    (
        "md",
        """
## The waterfall

One bar per span, in start order, indented by nesting; colour is the process.
The client's span covers everything; each agent's server span sits inside the
client span of the agent that called it.
""",
    ),
    (
        "code",
        """
colours = {"notebook": "tab:gray", "desk": "tab:blue", "orders": "tab:orange", "inventory": "tab:green"}
figure, axis = plt.subplots(figsize=(10, 0.5 * len(ordered) + 1))
for row, span in enumerate(ordered):
    start, length = (span["start"] - origin) * 1000, (span["end"] - span["start"]) * 1000
    axis.barh(row, length, left=start, color=colours[span["service"]], height=0.6)
    axis.text(start, row - 0.4, f"{span['name']} ({length:.1f} ms)", fontsize=8)
axis.set_yticks(range(len(ordered)), [f"{'  ' * depth(s)}{s['service']}" for s in ordered])
axis.invert_yaxis()
axis.set_xlabel("milliseconds since the client started the call")
axis.set_title(f"one trace across {len({s['service'] for s in spans})} processes")
figure.tight_layout()
plt.show()
""",
    ),
    (
        "code",
        """
for process in processes.values():
    process.terminate()
for process in processes.values():
    process.wait(timeout=10)
server_spans = [s["service"] for s in sorted(spans, key=depth) if s["name"].startswith("reach.agent")]
summary = {
    "status": response.status,
    "traces": len({s["trace_id"] for s in spans}),
    "services": sorted({s["service"] for s in spans}),
    "server_spans": server_spans,
    "roots": sum(1 for s in spans if s["parent_id"] is None),
}
print("SUMMARY", json.dumps(summary))
""",
    ),
]
