"""Per-hop cost of the seeds' two observations: the dependency-loop watch and hot-spot relief's turns, in µs.

``python benchmarks/bench_observation.py`` (``--quick`` for a smoke run) times, in batches, the loop watch's
``check`` of one reach (the caller from the hop chain, the target from the route) on the pipeline's own
clock, in three shapes of traffic:

* **one pair**: two agents reaching each other (the coupon loop; the pair is a loop all along);
* **10,000 edges**: reaches spread over ~10,000 one-way edges among 2,000 agents (a large fleet, no loop);
* **churn**: 50,000 distinct edges against the 10,000-edge bound (every reach evicts the oldest).

and relief's share of a conversation's turn: ``turn_started`` + ``turn_ended`` and the router's ``take`` look
over 100,000 followed conversations, plus one ``relieve`` pass over them when an instance is due (once per
``hold``, not per hop). Results land in ``benchmarks/results/observation.json``, with the machine's load
average beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reach_plugins.attempts.loopwatch import LoopWatch
from reach_plugins.clock import SystemClock
from reach_plugins.model import Hop, LoopSettings, ReliefPolicy
from reach_plugins.routing.relief import ReliefTracker
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.stores.sessions import session_key

RESULTS = Path(__file__).parent / "results" / "observation.json"
CONVERSATIONS = 100_000
BATCH = 1000


def timed(step: Callable[[int], None], batches: int) -> dict[str, float]:
    """µs per call of ``step`` over ``batches`` batches of ``BATCH`` calls: median, p99 of batch means, and mean."""
    per_call = []
    n = 0
    for _ in range(batches):
        start = time.perf_counter_ns()
        for _ in range(BATCH):
            step(n)
            n += 1
        per_call.append((time.perf_counter_ns() - start) / BATCH / 1000)
    cuts = statistics.quantiles(per_call, n=100, method="inclusive")
    return {"p50_us": round(statistics.median(per_call), 3), "p99_us": round(cuts[98], 3), "calls": n}


def shapes() -> dict[str, Callable[[LoopWatch], Callable[[int], None]]]:
    rng = random.Random(7)
    chains = {name: [Hop(agent=name, capability="work")] for name in ("ops_config", "orders")}
    fleet = [([Hop(agent=f"a{rng.randrange(1000)}", capability="work")], f"b{n % 1000}") for n in range(10_000)]
    churn = [([Hop(agent=f"c{n}", capability="work")], f"d{n % 7}") for n in range(50_000)]

    def one_pair(watch: LoopWatch) -> Callable[[int], None]:
        ops, orders = chains["ops_config"], chains["orders"]
        return lambda n: watch.check(ops, "orders") if n % 2 else watch.check(orders, "ops_config")

    def many(watch: LoopWatch) -> Callable[[int], None]:
        return lambda n: watch.check(*fleet[n % len(fleet)])

    def evicting(watch: LoopWatch) -> Callable[[int], None]:
        return lambda n: watch.check(*churn[n % len(churn)])

    return {"one pair (a loop)": one_pair, "10,000 edges, no loop": many, "churn past 10,000 edges": evicting}


def relief_rows(batches: int) -> dict[str, Any]:
    """One turn's observation (start, end, the router's look for a mark), and one relieve pass when due."""
    relief = ReliefTracker(ReliefPolicy())
    conversations: list[ScopedKey] = [session_key("t", f"s-{n}") for n in range(CONVERSATIONS)]
    where = [("chat", f"c{n % 8}") for n in range(CONVERSATIONS)]

    def turn(n: int) -> None:
        key = conversations[n % CONVERSATIONS]
        relief.take(key, where[n % CONVERSATIONS])
        relief.turn_started(key, where[n % CONVERSATIONS])
        relief.turn_ended(key, float(n))

    rows: dict[str, Any] = {"relief turn (start + end + take)": timed(turn, batches)}
    loads = {("chat", f"c{n}"): (0.95 if n == 0 else 0.3) for n in range(8)}
    relief.relieve(loads, 1e9)
    start = time.perf_counter_ns()
    marked = relief.relieve(loads, 1e9 + 31)
    rows["relieve pass, 100,000 conversations (per hold)"] = {
        "ms": round((time.perf_counter_ns() - start) / 1e6, 3),
        "marked": len(marked),
    }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    batches = 20 if args.quick else 300
    load = os.getloadavg()
    rows: dict[str, Any] = {}
    for name, shape in shapes().items():
        watch = LoopWatch(LoopSettings(), SystemClock(), lambda: None)
        rows[name] = timed(shape(watch), batches)
        rows[name]["edges_held"] = len(watch.rates or ())
    print(f"{'loop watch: traffic':<34} {'p50 µs/hop':>11} {'p99 µs/hop':>11} {'edges held':>11}")
    for name, row in rows.items():
        print(f"{name:<34} {row['p50_us']:>11} {row['p99_us']:>11} {row['edges_held']:>11}")
    relief = relief_rows(batches)
    turn = relief["relief turn (start + end + take)"]
    print(f"{'relief turn (start + end + take)':<34} {turn['p50_us']:>11} {turn['p99_us']:>11}")
    relieving = relief["relieve pass, 100,000 conversations (per hold)"]
    print(f"relieve pass over {CONVERSATIONS:,} conversations: {relieving['ms']} ms ({relieving['marked']} marked)")
    print(f"load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load)}")
    RESULTS.write_text(
        json.dumps(
            {
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load_average_before": [round(x, 2) for x in load],
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
                "batch": BATCH,
                "loop_watch": rows,
                "relief": relief,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
