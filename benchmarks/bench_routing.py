"""Route-decision time with 10 to 10,000 registered agents: is routing cost flat in the number of agents?

Run ``python benchmarks/bench_routing.py`` (``--quick`` for a smoke run). Each
call to ``Router.route`` is timed on its own with ``time.perf_counter_ns``;
the table shows p50/p99 in microseconds and the JSON lands in
``benchmarks/results/routing.json``.

Shape (chosen to look like a company's agent estate): every agent has 3
heartbeat-tracked instances and two capabilities, ``svc_{i // 5}`` (offered by
a group of 5 agents: replicas or competing teams) and ``own_{i}`` (its own).
Each decision therefore looks at 15 instances whatever the number of agents.
Requests cycle over 50 ``svc_*`` capabilities (the tools one client or gateway
actually uses), except in the ``all caps`` case. Cases:

* ``no session``            smooth weighted round robin: the hot path (target p50 <= 20 us at 10,000
                            agents, and within 2x of the 10-agent figure);
* ``no session, all caps``  the same, cycling over *every* capability (N / 5 of them): no two
                            consecutive requests touch the same objects, so CPU caches are cold;
* ``new session``           rendezvous hashing with bounded load, a fresh session id each call;
* ``pinned``                a conversation already pinned (1,000 sessions, revisited at random);
* ``worst case``            one capability offered by *every* agent (3 x N instances per call).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from reach_plugins.model import AgentDescriptor, Capability, Instance, ReachRequest
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Router

SIZES = (10, 100, 1_000, 10_000)
GROUP = 5
HOT = 50
INSTANCES = 3
NOW = 1_700_000_000.0
TARGET_P50_US = 20.0
TARGET_RATIO = 2.0
RESULTS = Path(__file__).parent / "results" / "routing.json"


@dataclass(frozen=True, slots=True)
class Case:
    """One measured configuration."""

    agents: int
    mode: str
    calls: int
    p50_us: float
    p99_us: float
    mean_us: float


def fixed_clock() -> float:
    """Time stands still: every instance's heartbeat stays fresh during the run."""
    return NOW


async def build_registry(agents: int, *, shared: bool) -> MemoryRegistry:
    """``agents`` agents with 3 live instances each; ``shared`` adds a capability everyone offers."""
    registry = MemoryRegistry(clock=fixed_clock)
    for i in range(agents):
        names = [f"svc_{i // GROUP}", f"own_{i}"] + (["everyone"] if shared else [])
        name = f"agent-{i}"
        await registry.register_agent(AgentDescriptor(name=name, capabilities=[Capability(name=cap) for cap in names]))
        for n in range(INSTANCES):
            await registry.register_instance(
                Instance(
                    agent=name,
                    instance_id=f"{name}-{n}",
                    endpoint=f"http://127.0.{i % 250}.{n + 1}:8080",
                    last_heartbeat=NOW,
                    load=(i * 7 + n * 3) % 10 / 20,
                )
            )
    return registry


def measure(
    route: Callable[[ReachRequest], object],
    requests: list[ReachRequest],
    calls: int,
    *,
    warmup: list[ReachRequest] | None = None,
    budget_s: float = 10.0,
) -> list[int]:
    """Nanoseconds per ``route`` call, cycling through ``requests`` (stops early after ``budget_s``).

    The heap built so far (the registry) is frozen out of the garbage collector
    first, so a full collection of the benchmark's own objects does not land in
    a routing sample.
    """
    for request in warmup if warmup is not None else requests[:1_000]:
        route(request)
    gc.collect()
    gc.freeze()
    clock = time.perf_counter_ns
    deadline = clock() + int(budget_s * 1e9)
    count = len(requests)
    samples = []
    for i in range(calls):
        request = requests[i % count]
        started = clock()
        route(request)
        ended = clock()
        samples.append(ended - started)
        if ended > deadline:
            break
    gc.unfreeze()
    return samples


def percentile_us(ordered: list[int], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def summarise(agents: int, mode: str, samples: list[int]) -> Case:
    ordered = sorted(samples)
    p50, p99 = percentile_us(ordered, 0.50), percentile_us(ordered, 0.99)
    return Case(agents, mode, len(samples), p50, p99, statistics.fmean(samples) / 1000)


def run_size(agents: int, calls: int, worst_calls: int) -> list[Case]:
    registry = asyncio.run(build_registry(agents, shared=False))
    router = Router(registry, clock=fixed_clock, rng=random.Random(1))
    groups = max(1, agents // GROUP)
    hot = min(HOT, groups)
    cases = []
    plain = [ReachRequest(capability=f"svc_{g}") for g in range(hot)]
    cases.append(summarise(agents, "no session", measure(router.route, plain, calls)))
    spread = [ReachRequest(capability=f"svc_{g}") for g in range(groups)]
    cases.append(summarise(agents, "no session, all caps", measure(router.route, spread, calls, warmup=spread)))
    fresh = [ReachRequest(capability=f"svc_{i % hot}", session_id=f"new-{i}") for i in range(calls + 1_000)]
    cases.append(summarise(agents, "new session", measure(router.route, fresh[1_000:], calls, warmup=fresh[:1_000])))
    conversations = [ReachRequest(capability=f"svc_{i % hot}", session_id=f"conv-{i}") for i in range(1_000)]
    rng = random.Random(2)
    revisits = [rng.choice(conversations) for _ in range(calls)]
    cases.append(summarise(agents, "pinned", measure(router.route, revisits, calls, warmup=conversations)))
    del router, registry
    shared = asyncio.run(build_registry(agents, shared=True))
    worst = Router(shared, clock=fixed_clock, rng=random.Random(3))
    everyone = [ReachRequest(capability="everyone")]
    cases.append(summarise(agents, "worst case", measure(worst.route, everyone, worst_calls, budget_s=5.0)))
    return cases


def verdict(cases: list[Case]) -> dict[str, object]:
    """The targets: no-session p50 at 10,000 agents <= 20 us and within 2x of the 10-agent figure; a new
    session (rendezvous over 15 instances) <= 20 us p50 at every size."""
    hot = {case.agents: case.p50_us for case in cases if case.mode == "no session"}
    smallest, largest = min(hot), max(hot)
    ratio = hot[largest] / hot[smallest]
    new = max(case.p50_us for case in cases if case.mode == "new session")
    return {
        "p50_at_largest_us": hot[largest],
        "ratio_largest_to_smallest": round(ratio, 2),
        "new_session_p50_worst_size_us": new,
        "target_p50_us": TARGET_P50_US,
        "target_ratio": TARGET_RATIO,
        "meets_p50_target": hot[largest] <= TARGET_P50_US,
        "meets_flatness_target": ratio <= TARGET_RATIO,
        "meets_new_session_target": new <= TARGET_P50_US,
    }


def render(cases: list[Case], checks: dict[str, object]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for case in cases:
            print(f"{case.agents:>6} agents  {case.mode:<12} p50 {case.p50_us:8.1f} us  p99 {case.p99_us:8.1f} us")
    else:
        table = Table(title="Route decision time (us per call)")
        for column in ("agents", "mode", "calls", "p50", "p99", "mean"):
            table.add_column(column, justify="left" if column == "mode" else "right")
        for case in cases:
            table.add_row(
                f"{case.agents:,}",
                case.mode,
                f"{case.calls:,}",
                f"{case.p50_us:.1f}",
                f"{case.p99_us:.1f}",
                f"{case.mean_us:.1f}",
            )
        Console().print(table)
    print("targets:")
    lines = (
        ("no session, p50 at the largest size", f"{checks['p50_at_largest_us']:.1f} us", f"{TARGET_P50_US:g} us"),
        ("largest / smallest size", f"{checks['ratio_largest_to_smallest']:.2f}x", f"{TARGET_RATIO:g}x"),
        (
            "new session (15 instances), worst",
            f"{checks['new_session_p50_worst_size_us']:.1f} us",
            f"{TARGET_P50_US:g} us",
        ),
    )
    for label, figure, target in lines:
        print(f"  {label:38} {figure:>9} (target <= {target})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer calls: a smoke run, not a measurement")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results file (default {RESULTS})")
    args = parser.parse_args(argv)
    calls, worst_calls = (2_000, 50) if args.quick else (20_000, 500)
    cases = [case for size in SIZES for case in run_size(size, calls, worst_calls)]
    checks = verdict(cases)
    render(cases, checks)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "routing",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "machine": f"{platform.system()} {platform.machine()} {platform.processor() or ''}".strip(),
        "quick": args.quick,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "shape": (
            f"{INSTANCES} heartbeat-tracked instances per agent; capabilities svc_{{i // {GROUP}}} "
            f"({GROUP} agents each) and own_{{i}}; requests over {HOT} capabilities unless 'all caps'; "
            "worst case: one capability offered by every agent"
        ),
        "cases": [asdict(case) for case in cases],
        "targets": checks,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
