"""Capacity-aware ranking of a near tie (seed 001, 3.2): where does free capacity start to win, and what does it cost?

Two parts, one run, no network:

1. **Crossover**: a tool (``parcel_location``) whose closest two capabilities
   are within the matcher's margin with the lexical embedder (deterministic):
   the more similar one's agent is loaded from 0 to 1 in steps of 0.005 while
   the other's stays idle; the crossover is the lowest load at which the idle,
   less similar agent is chosen (the formula says
   ``(similarity gap + margin) * w_similarity / w_capacity``).
2. **Cost**: ``ReachEnhancer.explain`` of that tie (matcher decision cached,
   then ranked against free capacity on every call) over 10 and 1,000 agents
   of 3 instances (half offering each capability: the more similar one's at
   load 0.9, the other's idle, so capacity decides), beside the same call with
   ranking off (``capacity_weights=None``: a cached dict lookup), on the real
   clock, so the free-capacity table's rebuild (once a second, one pass over
   every instance) lands in the mean; that rebuild is also timed alone.

Table printed, JSON in ``benchmarks/results/ranking.json``.

    python benchmarks/bench_ranking.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reach_plugins import AgentDescriptor, Capability, ReachEnhancer
from reach_plugins.matching import LexicalEmbedder
from reach_plugins.matching.ranking import DEFAULT_WEIGHTS
from reach_plugins.model import Instance
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing.capacity import FreeCapacity
from reach_plugins.transport import MockTransport

RESULTS = Path(__file__).parent / "results" / "ranking.json"
TOOL = ("parcel_location", "Where is my parcel during delivery")
TRACK = Capability(name="track_parcel", description="Track where a parcel is during delivery")
FIND = Capability(name="find_shipment", description="Find where a shipment or parcel is during delivery")
EMBEDDER = LexicalEmbedder()


async def estate(agents: int, loads: dict[str, float] | None = None) -> MemoryRegistry:
    """``agents`` agents of 3 instances, alternately offering the two close capabilities; ``loads`` by capability."""
    registry = MemoryRegistry()
    for a in range(agents):
        capability = (FIND, TRACK)[a % 2]
        name = f"agent-{a}"
        await registry.register_agent(AgentDescriptor(name=name, capabilities=[capability]))
        for n in range(3):
            load = (loads or {}).get(capability.name, (a * 7 + n * 3) % 10 / 20)
            endpoint = f"http://127.0.0.1:{8000 + n}"
            instance = Instance(agent=name, instance_id=f"{name}-{n}", endpoint=endpoint, load=load)
            await registry.register_instance(instance)
    return registry


def enhancer(registry: MemoryRegistry, weights: Any = DEFAULT_WEIGHTS) -> ReachEnhancer:
    return ReachEnhancer(
        registry=registry,
        transport=MockTransport(lambda call: {}, record=0),
        match="semantic",
        min_similarity=EMBEDDER.recommended_threshold,
        matcher=EMBEDDER,
        capacity_weights=weights,
    )


def crossover() -> dict[str, Any]:
    """Part 1: the lowest load of the more similar agent at which the idle, less similar one wins."""
    found: float | None = None
    similarities: dict[str, float] = {}
    for step in range(201):
        load = step / 200
        with enhancer(asyncio.run(estate(2, {FIND.name: load, TRACK.name: 0.0}))) as e:
            resolution = e.explain(*TOOL)
        similarities = {c.capability: c.similarity for c in resolution.contenders}
        if resolution.capability == TRACK.name:
            found = load
            break
    gap = similarities[FIND.name] - similarities[TRACK.name]
    margin = 0.05
    w_similarity, w_capacity = DEFAULT_WEIGHTS
    return {
        "similarity_more_similar": round(similarities[FIND.name], 3),
        "similarity_less_similar": round(similarities[TRACK.name], 3),
        "margin": margin,
        "weights": list(DEFAULT_WEIGHTS),
        "crossover_load_measured": found,
        "crossover_load_formula": round((gap + margin) * w_similarity / w_capacity, 3),
    }


def timed(call: Any, count: int) -> dict[str, float]:
    took = []
    for _ in range(count):
        started = time.perf_counter_ns()
        call()
        took.append(time.perf_counter_ns() - started)
    took.sort()
    return {
        "p50_us": took[len(took) // 2] / 1000,
        "p99_us": took[int(0.99 * len(took))] / 1000,
        "mean_us": statistics.fmean(took) / 1000,
    }


def cost(sizes: tuple[int, ...], calls: int) -> list[dict[str, Any]]:
    """Part 2: the ranked decision and the unranked one, and the capacity table's rebuild, per estate size."""
    rows = []
    for agents in sizes:
        registry = asyncio.run(estate(agents, {FIND.name: 0.9, TRACK.name: 0.0}))
        rebuild = timed(lambda r=registry: FreeCapacity(r)(TRACK.name), 50)  # a new table: one full pass
        for label, weights in (("ranked", DEFAULT_WEIGHTS), ("ranking off", None)):
            with enhancer(registry, weights) as e:
                e.explain(*TOOL)
                timed(lambda e=e: e.explain(*TOOL), calls // 10)
                got = timed(lambda e=e: e.explain(*TOOL), calls)
                rule = e.explain(*TOOL).rule
            rows.append({"agents": agents, "case": label, "rule": rule, **got})
        rows.append({"agents": agents, "case": "capacity table rebuild", "rule": "-", **rebuild})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer calls: a smoke run, not a measurement")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    logging.getLogger("reach_plugins.matching").setLevel(logging.ERROR)  # the tie's warning, once per enhancer
    cross = crossover()
    print(
        f"crossover: similarity {cross['similarity_more_similar']} vs {cross['similarity_less_similar']} "
        f"(margin {cross['margin']}, weights {cross['weights']}): the idle, less similar agent wins from load "
        f"{cross['crossover_load_measured']} of the other (formula {cross['crossover_load_formula']})"
    )
    rows = cost((10, 1_000), 2_000 if args.quick else 20_000)
    print(f"\n{'agents':>6} {'case':24} {'rule':10} {'p50 us':>8} {'p99 us':>8} {'mean us':>8}")
    for r in rows:
        figures = f"{r['p50_us']:8.1f} {r['p99_us']:8.1f} {r['mean_us']:8.1f}"
        print(f"{r['agents']:>6} {r['case']:24} {r['rule']:10} {figures}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "ranking",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "quick": args.quick,
        "crossover": cross,
        "rows": rows,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
