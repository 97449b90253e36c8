"""What the resilience core costs per call: the pipeline over a no-fault MockTransport vs the transport alone.

Real time, no OpenTelemetry SDK installed (spans are no-ops), one event loop,
calls made one after another. Overhead = p50(pipeline) - p50(transport alone).

    python benchmarks/bench_overhead.py          # prints the table, writes benchmarks/results/overhead.json
"""

from __future__ import annotations

import asyncio
import json
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reach_plugins.core import Pipeline
from reach_plugins.model import AgentDescriptor, Capability, Instance, ReachRequest, RouteDecision
from reach_plugins.telemetry import spans_are_noop
from reach_plugins.transport import Call, MockTransport

CALLS = 40_000
WARMUP = 5_000
TARGET_US = 30.0
RESULTS = Path(__file__).parent / "results" / "overhead.json"


@dataclass(frozen=True)
class StaticRoute:
    decision: RouteDecision
    agent: AgentDescriptor
    instance: Instance
    capability: Capability
    affinity: str = "none"


class StaticRouter:
    """Always the same instance: routing cost is not the core's and is measured by the routing benchmark."""

    def __init__(self, route: StaticRoute) -> None:
        self._route = route

    def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> StaticRoute:
        return self._route


async def measure(call: Callable[[], Awaitable[Any]]) -> list[float]:
    samples: list[float] = []
    clock = time.perf_counter_ns
    for _ in range(CALLS):
        started = clock()
        await call()
        samples.append((clock() - started) / 1000.0)
    return samples[WARMUP:]


def stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": statistics.median(ordered),
        "p90_us": ordered[int(0.9 * len(ordered))],
        "p99_us": ordered[int(0.99 * len(ordered))],
    }


async def run() -> dict[str, Any]:
    capability = Capability(name="query_order")
    instance = Instance(agent="orders", instance_id="orders-0", endpoint="http://orders-0")
    agent = AgentDescriptor(name="orders", capabilities=[capability], instances=[instance])
    decision = RouteDecision(
        capability="query_order", agent="orders", instance="orders-0", endpoint=instance.endpoint, reason="static"
    )
    transport = MockTransport(lambda call: {"status": "shipped"}, record=0)
    pipeline = Pipeline(router=StaticRouter(StaticRoute(decision, agent, instance, capability)), transport=transport)
    request = ReachRequest(capability="query_order", payload={"order_id": "A1"})
    call = Call(request=request, agent=agent, instance=instance, timeout=30.0)
    rows = {
        "transport alone": await measure(lambda: transport.send(call)),
        "pipeline.run": await measure(lambda: pipeline.run(request)),
        "pipeline.run(trace=True)": await measure(lambda: pipeline.run(request, trace=True)),
    }
    keyed = iter([request.model_copy(update={"idempotency_key": f"k{n}"}) for n in range(CALLS)])
    rows["pipeline.run + dedup key"] = await measure(lambda: pipeline.run(next(keyed)))
    await pipeline.aclose()
    figures = {name: stats(samples) for name, samples in rows.items()}
    base = figures["transport alone"]["p50_us"]
    overhead = figures["pipeline.run"]["p50_us"] - base
    return {
        "settings": {"calls": CALLS - WARMUP, "python": platform.python_version(), "otel_sdk": not spans_are_noop()},
        "figures": figures,
        "overhead_p50_us": overhead,
        "target_p50_us": TARGET_US,
        "met": overhead <= TARGET_US,
    }


def main() -> int:
    results = asyncio.run(run())
    print(f"{'path':28} {'p50 us':>8} {'p90 us':>8} {'p99 us':>8}")
    for name, row in results["figures"].items():
        print(f"{name:28} {row['p50_us']:8.2f} {row['p90_us']:8.2f} {row['p99_us']:8.2f}")
    verdict = "met" if results["met"] else "MISSED"
    print(f"\npipeline overhead p50: {results['overhead_p50_us']:.2f} us (target <= {TARGET_US:g} us: {verdict})")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print(f"written to {RESULTS}")
    return 0 if results["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
