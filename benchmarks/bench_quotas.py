"""What a fleet-wide quota check costs per request: one Lua script on Redis, beside the in-memory ledger.

Sequential ``Quotas.acquire`` + ``release`` of calls that pass (a budget far above the load) with two layers
(global and tenant, rate and concurrency), on the shared test Redis (``$REACH_TEST_REDIS``, default
127.0.0.1:63790) and in memory; p50 and p99 per check, several rounds, medians over rounds. The admitted rate of
a fleet sharing one quota is measured with real processes by ``tests/test_quotas_fleet.py``. Results go to
``benchmarks/results/quotas.json``.

    .venv/bin/python benchmarks/bench_quotas.py [--calls 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from reach_plugins.attempts.quotas import Quotas
from reach_plugins.config.quotas import QuotaConfig
from reach_plugins.model import ReachRequest

RESULTS = Path(__file__).parent / "results" / "quotas.json"


async def checks(store: str | None, calls: int) -> list[float]:
    """Seconds per acquire + release, ``calls`` times in a row."""
    budget: dict[str, Any] = {"rate": 1e6, "burst": 1000, "concurrency": 1000}
    config = QuotaConfig.model_validate({"store": store, "global": budget, "tenants": {"demo": budget}})
    quotas = Quotas(config)
    request = ReachRequest(capability="query_order", tenant="demo")
    took: list[float] = []
    try:
        for _ in range(calls):
            started = time.perf_counter()
            lease = await quotas.acquire(request, "orders", 5.0)
            assert lease is not None
            await quotas.release(lease)
            took.append(time.perf_counter() - started)
    finally:
        await quotas.aclose()
    return took


def quantile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    redis = os.environ.get("REACH_TEST_REDIS", "127.0.0.1:63790")
    stores = {"memory": None, "redis": f"redis://{redis}/0?prefix=bench-quotas-{uuid.uuid4().hex[:8]}:"}
    load = os.getloadavg()
    rows: dict[str, dict[str, float]] = {}
    for name, store in stores.items():
        rounds = [await checks(store, args.calls) for _ in range(args.rounds)]
        rows[name] = {
            "p50_us": statistics.median(quantile(one, 0.5) for one in rounds) * 1e6,
            "p99_us": statistics.median(quantile(one, 0.99) for one in rounds) * 1e6,
        }
    print(f"quota check (acquire + release, 2 layers), {args.calls} calls x {args.rounds} rounds, load {load[0]:.1f}")
    print(f"{'store':<8} {'p50 us':>10} {'p99 us':>10}")
    for name, row in rows.items():
        print(f"{name:<8} {row['p50_us']:>10.1f} {row['p99_us']:>10.1f}")
    RESULTS.parent.mkdir(exist_ok=True)
    report = {"calls": args.calls, "rounds": args.rounds, "load_average": load, "cpu": platform.processor()}
    RESULTS.write_text(json.dumps({**report, "stores": rows}, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
