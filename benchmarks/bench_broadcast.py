"""Broadcast completion with and without the seeds' two optimisations (004, section 6.2), in one run.

``python benchmarks/bench_broadcast.py`` (``--quick`` for a smoke run) serves a
panel of five expert agents on 127.0.0.1 (the agent SDK under uvicorn); each
deliberates for a random time (seeded, uniform 0.2-1.2 s) unless a summary it
received already holds its answer, then it confirms in 10 ms. Three modes ask
the same questions, interleaved round by round:

* ``all`` — wait for every receipt (the baseline the seeds started from);
* ``agree`` — streaming aggregation: done as soon as two answers agree;
* ``agree + share_summary`` — and later copies carry the answers already in.

It prints completion time (mean, p50, p90) and the deliberations the agents did
per broadcast, and writes ``benchmarks/results/broadcast.json``. The seeds
report about 2x shorter completion from both optimisations together.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer
from reach_plugins.client.broadcast import BroadcastResult
from reach_plugins.demo.panel import Expert, panel_agent
from reach_plugins.registry import MemoryRegistry

RESULTS = Path(__file__).parent / "results" / "broadcast.json"
EXPERTS = 5


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(rounds: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    experts = [Expert(f"e{n}", think=lambda: rng.uniform(0.2, 1.2)) for n in range(EXPERTS)]
    registry = MemoryRegistry()
    with ExitStack() as stack:
        for expert in experts:
            agent = panel_agent(f"expert-{expert.label}", expert)
            server = stack.enter_context(BackgroundServer(agent.app))
            registry.put_agent(agent.descriptor(server.url))
        async with ReachClient(registry) as client:
            modes: dict[str, Callable[[str], Awaitable[BroadcastResult]]] = {
                "all": lambda q: client.broadcast("answer_question", {"question": q}, k=EXPERTS, aggregate="all"),
                "agree": lambda q: client.broadcast("answer_question", {"question": q}, k=EXPERTS, aggregate="agree"),
                "agree + share_summary": lambda q: client.broadcast(
                    "answer_question", {"question": q}, k=EXPERTS, aggregate="agree", share_summary=True
                ),
            }
            seconds: dict[str, list[float]] = {mode: [] for mode in modes}
            worked: dict[str, list[int]] = {mode: [] for mode in modes}
            for number in range(rounds):
                for mode, ask in modes.items():
                    before = sum(expert.did.count("worked") for expert in experts)
                    started = time.perf_counter()
                    result = await ask(f"question {number}")
                    seconds[mode].append(time.perf_counter() - started)
                    assert result.status == "success", result
                    await asyncio.sleep(0.05)  # let cancelled copies finish counting
                    worked[mode].append(sum(expert.did.count("worked") for expert in experts) - before)
    table = {
        mode: {
            "mean_s": round(statistics.fmean(values), 3),
            "p50_s": round(percentile(values, 0.5), 3),
            "p90_s": round(percentile(values, 0.9), 3),
            "deliberations_per_broadcast": round(statistics.fmean(worked[mode]), 2),
        }
        for mode, values in seconds.items()
    }
    baseline = table["all"]["mean_s"]
    for row in table.values():
        row["speedup_vs_all"] = round(baseline / row["mean_s"], 2)
    return {"rounds": rounds, "seed": seed, "experts": EXPERTS, "modes": table}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds: a smoke run, not a measurement")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results file (default {RESULTS})")
    args = parser.parse_args(argv)
    figures = asyncio.run(run(3 if args.quick else 30, args.seed))
    print(f"{'mode':<24}{'mean s':>9}{'p50 s':>9}{'p90 s':>9}{'work':>7}{'speedup':>9}")
    for mode, row in figures["modes"].items():
        print(
            f"{mode:<24}{row['mean_s']:>9.3f}{row['p50_s']:>9.3f}{row['p90_s']:>9.3f}"
            f"{row['deliberations_per_broadcast']:>7.2f}{row['speedup_vs_all']:>8.2f}x"
        )
    report = {
        "benchmark": "broadcast",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "load_average_1m": round(os.getloadavg()[0], 2),
        "quick": args.quick,
        "target": "about 2x shorter completion with both optimisations (seed 004, section 6.2)",
        **figures,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
