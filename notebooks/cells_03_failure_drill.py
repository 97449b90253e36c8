"""Cells of ``03_failure_drill.ipynb``: an instance dies, an outage comes and goes; watch success, latency, breakers."""

CELLS: list[tuple[str, str]] = [
    (
        "md",
        """
# Failure drill: an instance dies, then an outage comes and goes

Two instances of an `orders` agent serve `query_order`. A client keeps calling
it, 40 times a second, while we:

1. **kill** one instance (its server stops: connections are refused),
2. start an **outage** on the other (its database is down: every call fails),
3. **end** the outage.

The resilience core retries transient failures with full jitter, fails over to
the other instance, and opens a circuit breaker per instance, so a dead
instance stops costing time. We plot the success rate, the latency and each
breaker's state over time. Breaker settings are shortened (a 2 s window, 1 s
open, doubling on each re-open) so the whole drill takes about ten seconds: it
ends a little after the surviving instance's breaker has closed again.
""",
    ),
    (
        "code",
        """
import asyncio
import json
import logging
import statistics
import tempfile
import threading
import time
from pathlib import Path

import matplotlib.pyplot as plt
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import ReachError, Retryable
from reach_plugins.telemetry.metrics import ReachMetrics, fan_out

logging.getLogger("reach_plugins").setLevel(logging.CRITICAL)  # the drill's failures are on purpose: no log noise
outage = threading.Event()


def orders_instance() -> ReachAgent:
    agent = ReachAgent("orders")

    @agent.capability("query_order", description="Find an order by its id")
    def query_order(order_id: str) -> dict:
        if outage.is_set():
            raise Retryable("database down")  # marked retryable: a transient failure (HTTP 503)
        return {"order_id": order_id, "status": "shipped"}

    return agent


servers = {f"orders-{n}": BackgroundServer(orders_instance().app).start() for n in (0, 1)}
config = Path(tempfile.mkdtemp(prefix="reach-drill-")) / "agents.yaml"
config.write_text(f\"\"\"
agents:
  - name: orders
    endpoints: [{servers["orders-0"].url}, {servers["orders-1"].url}]
    capabilities: [query_order]
    timeouts: {{connect: 200ms, response: 1s}}
    retry: {{max_attempts: 3, base_wait: 10ms, max_wait: 50ms}}
    circuit_breaker: {{window: 2s, buckets: 4, min_calls: 4, error_threshold: 50%, open_wait: 1s, half_open_probes: 1}}
\"\"\")
print(config.read_text())
""",
    ),
    (
        "md",
        """
## The drill

Every 25 ms a call starts (calls overlap). Every transition of a breaker is an
event in the request's trace, timed by the same clock as everything else here
(`time.time()`); a sink collects the traces, and
`ReachMetrics` (a trace sink too) turns them into OpenTelemetry metrics, read
here from an in-memory reader as a Prometheus scrape would read them.
""",
    ),
    (
        "code",
        """
KILL_AT, OUTAGE_AT, RECOVER_AT = 1.5, 3.5, 5.0
AFTER_CLOSE = 1.5  # seconds of calls measured once orders-0's breaker has closed again after the outage
GIVE_UP_AT = 30.0  # the drill stops here even if that breaker never closed (the summary then says so)


class Traces:
    \"\"\"Keeps every request's trace (the client writes one per request) and when orders-0's breaker closed.\"\"\"

    def __init__(self) -> None:
        self.all = []
        self.closed = []

    def emit(self, trace) -> None:
        self.all.append(trace)
        for event in trace.events:
            if event["event"] == "reach.breaker" and event["reach.breaker.to"] == "closed":
                self.closed.append((event["at"] - start, event["instance"]))

    def closed_again(self, instance: str, after: float) -> float | None:
        return min((at for at, who in self.closed if who == instance and at >= after), default=None)


sink = Traces()
reader = InMemoryMetricReader()
metrics = ReachMetrics(meter_provider=MeterProvider(metric_readers=[reader]))
calls, marks = [], {}
client = ReachClient(f"file://{config}", sink=fan_out(sink, metrics))
start = time.time()


async def one_call(number: int) -> None:
    began = time.time()
    try:
        response = await client.reach("query_order", {"order_id": f"A{number}"}, timeout_ms=2000)
        ok, instance = response.ok, response.instance
    except ReachError:
        ok, instance = False, None
    calls.append({"t": began - start, "ok": ok, "ms": (time.time() - began) * 1000, "instance": instance})


async def drill() -> None:
    tasks, number = [], 0
    while (now := time.time() - start) < GIVE_UP_AT:
        closed = sink.closed_again("orders-0", marks["recover"]) if "recover" in marks else None
        if closed is not None and now >= closed + AFTER_CLOSE:
            marks["closed"] = closed
            break
        if now >= KILL_AT and "kill" not in marks:
            marks["kill"] = now
            await asyncio.to_thread(servers["orders-1"].stop)
        if now >= OUTAGE_AT and "outage" not in marks:
            marks["outage"] = now
            outage.set()
        if now >= RECOVER_AT and "recover" not in marks:
            marks["recover"] = now
            outage.clear()
        tasks.append(asyncio.create_task(one_call(number)))
        number += 1
        await asyncio.sleep(0.025)
    marks["end"] = time.time() - start
    await asyncio.gather(*tasks)


await drill()
await client.aclose()
servers["orders-0"].stop()
print(f"{len(calls)} calls, {sum(c['ok'] for c in calls)} succeeded")
print("marks (s):", {name: round(at, 2) for name, at in marks.items()})
""",
    ),
    (
        "md",
        """
## Breaker transitions, from the traces
""",
    ),
    (
        "code",
        """
LEVEL = {"closed": 0, "half_open": 1, "open": 2}
transitions = sorted(
    (event["at"] - start, event["instance"], event["reach.breaker.from"], event["reach.breaker.to"])
    for trace in sink.all
    for event in trace.events
    if event["event"] == "reach.breaker"
)
for at, instance, before, after in transitions:
    print(f"{at:5.2f}s  {instance}: {before} -> {after}")
""",
    ),
    (
        "md",
        """
## Success rate, latency and breaker state over time
""",
    ),
    (
        "code",
        """
BUCKET = 0.25


def buckets(rows: list[dict]) -> dict[int, list[dict]]:
    grouped: dict[int, list[dict]] = {}
    for row in rows:
        grouped.setdefault(int(row["t"] // BUCKET), []).append(row)
    return dict(sorted(grouped.items()))


grouped = buckets(calls)
times = [index * BUCKET for index in grouped]
success = [sum(r["ok"] for r in rows) / len(rows) for rows in grouped.values()]
p50 = [statistics.median(r["ms"] for r in rows) for rows in grouped.values()]
p95 = [sorted(r["ms"] for r in rows)[int(0.95 * (len(rows) - 1))] for rows in grouped.values()]

figure, (top, middle, bottom) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
top.step(times, success, where="post", color="tab:green")
top.set_ylabel("success rate")
top.set_ylim(-0.05, 1.05)
middle.step(times, p50, where="post", label="p50")
middle.step(times, p95, where="post", label="p95")
middle.set_ylabel("latency (ms)")
middle.legend(loc="upper left")
for offset, instance in enumerate(sorted(servers)):
    states, level = [(0.0, 0)], 0
    for at, who, _, after in transitions:
        if who == instance:
            states.append((at, LEVEL[after]))
    states.append((marks["end"], states[-1][1]))
    bottom.step([t for t, _ in states], [s + offset * 0.06 for _, s in states], where="post", label=instance)
bottom.set_yticks([0, 1, 2], ["closed", "half-open", "open"])
bottom.set_ylabel("breaker")
bottom.set_xlabel("seconds into the drill")
bottom.legend(loc="upper left")
for axis in (top, middle, bottom):
    for name, at in marks.items():
        if name != "end":
            axis.axvline(at, color="gray", linestyle="--", linewidth=0.8)
top.text(marks["kill"], 1.08, " orders-1 killed", fontsize=8)
top.text(marks["outage"], 1.08, " outage", fontsize=8)
top.text(marks["recover"], 1.08, " recovered", fontsize=8)
if "closed" in marks:
    top.text(marks["closed"], 1.08, " orders-0 closed", fontsize=8)
figure.tight_layout()
plt.show()
""",
    ),
    (
        "md",
        """
## The same drill as an operator sees it: metrics

What the Grafana dashboard (`notebooks/grafana/reach_dashboard.json`) charts
from a gateway's `/metrics`: attempts by outcome (`not_delivered` when the
killed instance refused the connection) and breaker transitions per instance,
here read from the in-memory reader.
""",
    ),
    (
        "code",
        """
from collections import Counter as Tally


def points(name: str) -> list[tuple[dict, float]]:
    data = reader.get_metrics_data()
    return [
        (dict(point.attributes), getattr(point, "value", getattr(point, "count", 0)))
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]


outcomes = Tally()
for attributes, value in points("reach.client.attempts"):
    outcomes[attributes["reach.outcome"]] += value
opens = Tally()
for attributes, value in points("reach.breaker.transitions"):
    if attributes["reach.breaker.to"] == "open":
        opens[attributes["reach.instance"]] += value
requests = sum(value for _, value in points("reach.client.requests"))

figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
left.bar(list(outcomes), list(outcomes.values()), color="tab:blue")
left.set_title("reach.client.attempts by outcome")
right.bar(list(opens), list(opens.values()), color="tab:red")
right.set_title("breaker opened (reach.breaker.transitions)")
figure.tight_layout()
plt.show()
print(f"{requests:g} requests;", dict(outcomes))
""",
    ),
    (
        "code",
        """
def window(low: float, high: float) -> dict:
    \"\"\"Calls started in ``[low, high)``: how many, how many succeeded, the rate.\"\"\"
    oks = [c["ok"] for c in calls if low <= c["t"] < high]
    return {"calls": len(oks), "ok": sum(oks), "rate": round(sum(oks) / len(oks), 3) if oks else None}


windows = {
    "before_kill": window(0.0, marks["kill"]),
    "after_kill": window(marks["kill"] + 0.5, marks["outage"]),
    "during_outage": window(marks["outage"] + 0.3, marks["recover"]),
    # from the moment the surviving instance's breaker closed again, not from a fixed time after the outage
    "after_recovery": window(marks["closed"], marks["end"]) if "closed" in marks else {"calls": 0, "ok": 0},
}
summary = {
    **{name: counts.get("rate") for name, counts in windows.items()},
    "windows": windows,
    "duration": marks["end"],
    "opened": sorted({instance for _, instance, _, after in transitions if after == "open"}),
    "closed_again": sorted({instance for _, instance, before, after in transitions if after == "closed"}),
    "metrics": {"requests": requests, "outcomes": dict(outcomes), "opened": sorted(opens)},
}
print("SUMMARY", json.dumps(summary))
""",
    ),
]
