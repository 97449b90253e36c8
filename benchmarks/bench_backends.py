"""Shared backends: etcd watch propagation between processes, and dedup store latency in memory vs Redis.

Run ``scripts/services.sh start`` first, then ``python benchmarks/bench_backends.py``
(``--quick`` for a smoke run). Servers are read from ``REACH_TEST_ETCD`` /
``REACH_TEST_REDIS`` (``host:port``; defaults are the test ports). Results land
in ``benchmarks/results/backends.json``.

* **watch propagation**: a writer *process* registers instances one by one in
  etcd, stamping each with the wall-clock time it started the write; this
  process's registry receives the watch event (its routing view is updated
  before the event is emitted) and records now - stamp. Writes are spaced
  10 ms apart so the figure is latency, not queueing.
* **dedup store**: per operation of the idempotency path, timed one by one:
  ``claim`` (begin on a new key), ``complete`` (store the result), ``replay``
  (begin on a done key: what a duplicate costs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reach_plugins.model import AgentDescriptor, Instance, ReachResponse
from reach_plugins.registry import open_registry
from reach_plugins.registry.etcd import EtcdRegistry
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.dedup import DedupStore, MemoryDedupStore
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.stores.urls import open_store

RESULTS = Path(__file__).parent / "results" / "backends.json"
WRITE_SPACING = 0.01
AGENT = "bench"


def stats(samples: list[float]) -> dict[str, float]:
    """p50 / p99 / max / mean of ``samples`` (same unit), rounded for the report."""
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return {
        "count": len(samples),
        "p50": round(statistics.median(samples), 3),
        "p99": round(cuts[98], 3),
        "max": round(max(samples), 3),
        "mean": round(statistics.fmean(samples), 3),
    }


async def write_instances(url: str, count: int) -> None:
    """The writer process: register ``count`` instances, each stamped with the time its write began."""
    registry = open_registry(url)
    await registry.register_agent(AgentDescriptor.model_validate({"name": AGENT, "capabilities": ["bench_op"]}))
    for i in range(count):
        sent = time.time()
        instance = Instance(
            agent=AGENT, instance_id=f"{AGENT}-{i}", endpoint="http://127.0.0.1:9", metadata={"sent": repr(sent)}
        )
        await registry.register_instance(instance)
        await asyncio.sleep(WRITE_SPACING)
    await registry.deregister_agent(AGENT)
    await registry.aclose()


async def watch_propagation(etcd: str, count: int) -> dict[str, float]:
    """Milliseconds from a write in another process to the event (and routing view) here."""
    url = f"etcd://{etcd}/reach-bench/{uuid.uuid4().hex}/"
    reader = open_registry(url)
    assert isinstance(reader, EtcdRegistry)
    await reader.start()
    stream = reader.watch()
    writer = subprocess.Popen([sys.executable, __file__, "--writer", url, "--count", str(count)])
    delays: list[float] = []
    async with asyncio.timeout(120):
        async for event in stream:
            if event.kind == "instance_put" and event.instance_id is not None:
                instance = reader.instances(event.agent)[event.instance_id]
                delays.append((time.time() - float(instance.metadata["sent"])) * 1000)
                if len(delays) == count:
                    break
    await asyncio.to_thread(writer.wait)
    await reader.aclose()
    return stats(delays)


async def timed(operation: Callable[[], Awaitable[Any]], into: list[float]) -> None:
    started = time.perf_counter_ns()
    await operation()
    into.append((time.perf_counter_ns() - started) / 1000)


async def dedup_latency(store: DedupStore, count: int) -> dict[str, dict[str, float]]:
    """Microseconds per claim, complete and replay on ``store``."""
    claim: list[float] = []
    complete: list[float] = []
    replay: list[float] = []
    response = ReachResponse(request_id="r", status="success", data={"ticket": 1}, agent=AGENT, instance="b-0")
    run = uuid.uuid4().hex
    for i in range(count):
        key = ScopedKey.of(None, "dedup", f"bench_op\x1f{run}-{i}")
        await timed(lambda key=key: store.begin(key, "h", 300), claim)  # type: ignore[misc]
        await timed(lambda key=key: store.complete(key, response), complete)  # type: ignore[misc]
        await timed(lambda key=key: store.begin(key, "h", 300), replay)  # type: ignore[misc]
    await store.aclose()
    return {"claim": stats(claim), "complete": stats(complete), "replay": stats(replay)}


async def run(etcd: str, redis: str, quick: bool) -> dict[str, Any]:
    events, ops = (50, 500) if quick else (500, 5_000)
    return {
        "watch_propagation_ms": await watch_propagation(etcd, events),
        "dedup_us": {
            "memory": await dedup_latency(MemoryDedupStore(budget=DEFAULT_BUDGET), ops),
            "redis": await dedup_latency(open_store(f"redis://{redis}/0?prefix=reach-bench:{uuid.uuid4().hex}:"), ops),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer samples: a smoke run, not a measurement")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results file (default {RESULTS})")
    parser.add_argument("--writer", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.writer:
        asyncio.run(write_instances(args.writer, args.count))
        return 0
    etcd = os.environ.get("REACH_TEST_ETCD", "127.0.0.1:23790")
    redis = os.environ.get("REACH_TEST_REDIS", "127.0.0.1:63790")
    figures = asyncio.run(run(etcd, redis, args.quick))
    report = {
        "benchmark": "backends",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "machine": f"{platform.system()} {platform.machine()} {platform.processor() or ''}".strip(),
        "quick": args.quick,
        "servers": {"etcd": etcd, "redis": redis},
        **figures,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
