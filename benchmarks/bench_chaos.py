"""Exactly-once under real faults, at larger counts: the chaos suite's scenarios with thousands of keyed calls.

Each scenario runs real processes (3 agent instances registered in etcd, 2
caller processes sending the *same* keys, a gateway or node where named) and
one fault: ``kill -9`` of an instance, an instance losing every reply for 5 s,
the callers' Redis ``kill -9``-ed for 3 s, the gateway ``kill -9``-ed and
restarted. Each runs twice: agents with a shared (Redis) idempotency store
that commit each execution with its key in one transaction (the SDK's
``committed`` hook, SQLite shared by the instances), and agents with keys but
no shared store (memory, per instance). Duplicates
are completed executions counted at the agents, by key; callers retry a failed
key with the same key for a few seconds, as real callers do.

Needs the test servers: ``scripts/services.sh start`` (``REACH_TEST_ETCD`` /
``REACH_TEST_REDIS`` move them), and ``redis-server`` for the private Redis.

    python benchmarks/bench_chaos.py [--keys 2500]   # prints the table, writes benchmarks/results/chaos.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chaos_support import Cluster, cluster, go, results, tally, wait_for_executions
from faultproxy import FaultProxy
from servers import Server, free_port, redis_answers

RESULTS = Path(__file__).parent / "results" / "chaos.json"
ETCD = "etcd://" + os.environ.get("REACH_TEST_ETCD", "127.0.0.1:23790")
REDIS = "redis://" + os.environ.get("REACH_TEST_REDIS", "127.0.0.1:63790") + "/0"
RETRY_FOR = 5.0
"""Seconds a caller keeps retrying a failed key (same key) before reporting its last outcome."""


def fresh(url: str = REDIS) -> str:
    return f"{url}?prefix=bench-{uuid.uuid4().hex[:8]}:"


def agent_store(agents: str) -> str:
    return fresh() if agents == "shared" else "memory://"


Run = Callable[[Cluster, str, int], Awaitable[list[Any]]]


async def kill_instance(c: Cluster, agents: str, keys: int, work: float, hop: str = "direct") -> list[Any]:
    c.add_agents(3, agent_store(agents), work, transactional=agents == "shared")
    if hop != "direct":
        _, port = c.hop(hop, fresh())
        hop = f"{hop}=http://127.0.0.1:{port}" if hop == "gateway" else f"{hop}=127.0.0.1:{port}"
    callers = c.callers(fresh(), hop=hop, keys=keys, concurrency=50, retry_for=RETRY_FOR)
    go(callers)
    await asyncio.to_thread(wait_for_executions, c, keys // 5, 120)
    c.agents[0].kill()
    return [callers]


async def lose_replies(c: Cluster, agents: str, keys: int) -> list[Any]:
    port = free_port()
    proxy = await FaultProxy(("127.0.0.1", port)).start()
    c.add_agents(3, agent_store(agents), 0.05, ports={0: (port, proxy.port)}, transactional=agents == "shared")
    callers = c.callers(fresh(), keys=keys, concurrency=50, retry_for=RETRY_FOR)
    proxy.mode = "lose_reply"
    go(callers)
    await asyncio.sleep(5)
    proxy.mode = "pass"
    return [callers, proxy]


async def kill_redis(c: Cluster, agents: str, keys: int) -> list[Any]:
    data = Path(tempfile.mkdtemp())
    port = free_port()
    command = [shutil.which("redis-server") or "redis-server", "--bind", "127.0.0.1", "--port", str(port)]
    command += ["--dir", str(data), "--save", "", "--appendonly", "yes", "--appendfsync", "always"]
    redis = Server("redis", command, port, data, redis_answers)
    redis.start()
    c.add_agents(3, agent_store(agents), 0.05, transactional=agents == "shared")
    callers = c.callers(fresh(f"redis://127.0.0.1:{port}/0"), keys=keys, concurrency=50, retry_for=RETRY_FOR)
    go(callers)
    await asyncio.to_thread(wait_for_executions, c, keys // 5, 120)
    await asyncio.to_thread(redis.stop, crash=True)
    await asyncio.sleep(3)
    await asyncio.to_thread(redis.start)
    return [callers, redis]


async def kill_gateway(c: Cluster, agents: str, keys: int) -> list[Any]:
    c.add_agents(3, agent_store(agents), 0.05, transactional=agents == "shared")
    store = fresh()
    gateway, port = c.hop("gateway", store)
    callers = c.callers(fresh(), hop=f"gateway=http://127.0.0.1:{port}", keys=keys, concurrency=50, retry_for=RETRY_FOR)
    go(callers)
    await asyncio.to_thread(wait_for_executions, c, keys // 5, 120)
    gateway.kill()
    gateway.wait()
    await asyncio.to_thread(c.hop, "gateway", store, port)
    return [callers]


SCENARIOS: dict[str, Callable[[Cluster, str, int], Awaitable[list[Any]]]] = {
    "instance kill -9, 500 ms handlers": lambda c, a, k: kill_instance(c, a, k, 0.5),
    "instance kill -9, 20 ms handlers": lambda c, a, k: kill_instance(c, a, k, 0.02),
    "one instance loses replies for 5 s": lose_replies,
    "caller Redis kill -9 for 3 s": kill_redis,
    "instance kill -9 behind the gateway": lambda c, a, k: kill_instance(c, a, k, 0.05, "gateway"),
    "instance kill -9 behind the node": lambda c, a, k: kill_instance(c, a, k, 0.05, "node"),
    "gateway kill -9 and back": kill_gateway,
}


async def one(name: str, agents: str, keys: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder, cluster(Path(folder), ETCD) as c:
        started = time.monotonic()
        held = await SCENARIOS[name](c, agents, keys)
        merged = await asyncio.to_thread(results, held[0], 600.0)
        for extra in held[1:]:
            await extra.aclose() if isinstance(extra, FaultProxy) else extra.stop()
        seen = tally(merged)
        unknown = seen.final.get("outcome_unknown", 0) + seen.final.get("OutcomeUnknown", 0)
        return {
            "calls": seen.calls,
            "duplicates": len(c.duplicates()),
            "outcome_unknown": unknown,
            "other_failures": seen.calls - seen.final.get("success", 0) - unknown,
            "final": dict(seen.final),
            "first_try": dict(seen.first),
            "p50_s": round(seen.p50, 4),
            "p99_s": round(seen.p99, 4),
            "seconds": round(time.monotonic() - started, 1),
        }


def table(rows: dict[str, dict[str, Any]]) -> str:
    header = "| scenario | agent store | calls | duplicates | OutcomeUnknown | other failures | p50 | p99 |"
    lines = [header, "|---|---|---:|---:|---:|---:|---:|---:|"]
    for label, row in rows.items():
        name, _, agents = label.rpartition(" / ")
        lines.append(
            f"| {name} | {agents} | {row['calls']} | {row['duplicates']} | {row['outcome_unknown']} | "
            f"{row['other_failures']} | {row['p50_s'] * 1000:.0f} ms | {row['p99_s'] * 1000:.0f} ms |"
        )
    return "\n".join(lines)


async def main(keys: int, only: str | None) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for name in SCENARIOS:
        if only and only not in name:
            continue
        for agents in ("shared", "local"):
            rows[f"{name} / {agents}"] = await one(name, agents, keys)
            print(f"{name} / {agents}: {rows[f'{name} / {agents}']}", flush=True)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=2500, help="keys per caller (2 callers send the same keys)")
    parser.add_argument("--only", help="run the scenarios whose name contains this")
    options = parser.parse_args()
    rows = asyncio.run(main(options.keys, options.only))
    print(table(rows))
    RESULTS.write_text(json.dumps({"keys_per_caller": options.keys, "scenarios": rows}, indent=2) + "\n")
    sys.exit(1 if any(row["duplicates"] for row in rows.values()) else 0)
