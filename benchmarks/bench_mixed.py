"""The seeds' mixed workload (seed 004, section 6.1) and capacity table (seed 001, section 4.3), on 127.0.0.1.

Twenty agents (the agent SDK, ten per process in two processes) each offer
``work`` (sleep the agent's own time, report it) and ``relay`` (reach ``work``
through the SDK, over the same transport the caller used). The workload mixes
60 % single-hop reaches of ``work``, 30 % two-hop chains (the caller reaches
``relay`` on B, B reaches ``work`` on C) and 10 % broadcasts of ``work`` to 5
agents (``aggregate="all"``), over direct, ``reach gateway`` and ``reach
node``, for agents of 50 ms, 500 ms and 5 s. The reach layer's time is a
call's total minus the agent's own time as the agent measured it (a chain: C's
time; a broadcast: the longest of the five); the seeds' rule is reach P95
under a tenth of the agent's own time.

The capacity table drives ``POST /v1/reach`` of an agent that does no work at
concurrency 100, 300, 600 and 1,000 (each caller makes two calls) into one
gateway process and into ``--workers 2`` (it needs ``--redis``), and reports
p50, P99 and the error rate (non-200 answers, refused or timed-out calls).

Request counts are scaled so the default run stays within about 5 minutes
(``--scale 2`` doubles them); load generator, gateway, node and agents share
the machine's cores, so the load average is recorded beside the figures.
Results go to ``benchmarks/results/mixed.json``.

    .venv/bin/python benchmarks/bench_mixed.py [--scale 1] [--redis redis://127.0.0.1:63790/5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from bench_hops import ENV, REACH_CLI, TOKEN, free_port, start, stop, wait_port

from reach_plugins import ReachClient
from reach_plugins.transport import Transport
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

RESULTS = Path(__file__).parent / "results" / "mixed.json"
AGENTS = 20
PER_PROCESS = 10
BROADCAST_K = 5
MIX = (("single", 0.6), ("chain", 0.3), ("broadcast", 0.1))
CONCURRENCY = 20
"""Callers of the mixed workload at once: one per agent."""
AGENT_TIMES_MS = {50: 400, 500: 200, 5000: 60}
"""The agent's own time -> calls of the mixed workload per transport (at ``--scale 1``)."""
CAPACITY_LEVELS = (100, 300, 600, 1000)
TIMEOUT_MS = 30_000

AGENTS_PROCESS = textwrap.dedent(
    """
    import asyncio, os, sys, time
    import uvicorn
    from reach_plugins import ReachClient
    from reach_plugins.agent import ReachAgent
    from reach_plugins.server.uvicorn import uvicorn_config
    from transports.direct import DirectTransport
    from transports.gateway import GatewayTransport
    from transports.grpcnode import GrpcNodeTransport

    config, gateway, node, first, ports = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
    token = os.environ["BENCH_TOKEN"]
    transports = {
        "direct": DirectTransport,
        "gateway": lambda: GatewayTransport(gateway, token=token),
        "node": lambda: GrpcNodeTransport(node, token=token),
    }
    clients = {}

    def client(via, work_ms):
        if (via, work_ms) not in clients:  # one per agent time: a limiter learns one latency
            clients[via, work_ms] = ReachClient(config, transports[via](), tenant="bench", environ=os.environ)
        return clients[via, work_ms]

    def agent(number):
        agent = ReachAgent(f"agent-{number:02d}", tokens="open")

        @agent.capability("work")
        async def work(work_ms: int) -> dict:
            began = time.perf_counter()
            await asyncio.sleep(work_ms / 1000)
            return {"own_ms": (time.perf_counter() - began) * 1000}

        @agent.capability("relay")
        async def relay(work_ms: int, via: str) -> dict:
            answer = await client(via, work_ms).reach("work", {"work_ms": work_ms}, timeout_ms=TIMEOUT_MS)
            answer.raise_for_status()
            return answer.data

        return agent

    async def main():
        servers = [
            uvicorn.Server(uvicorn_config(agent(first + n).app, port=int(port), log_level="warning"))
            for n, port in enumerate(ports)
        ]
        await asyncio.gather(*(server.serve() for server in servers))

    asyncio.run(main())
    """
).replace("TIMEOUT_MS", str(TIMEOUT_MS))


def percentiles(values: list[float]) -> dict[str, float]:
    """p50/p95/p99 (nearest rank) of ``values`` in ms, rounded to 0.01 ms."""
    if not values:
        return {}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"p50_ms": rank(0.50), "p95_ms": rank(0.95), "p99_ms": rank(0.99)}


def write_config(directory: Path, ports: list[int]) -> Path:
    lines = ["agents:"]
    for number, port in enumerate(ports):
        lines += [
            f"  - name: agent-{number:02d}",
            f'    endpoints: ["http://127.0.0.1:{port}"]',
            "    capabilities: [work, relay]",
        ]
    lines += [
        "tenants:",
        "  bench:",
        "    token_env: BENCH_TOKEN",
        "    agents: [" + ", ".join(f"agent-{n:02d}" for n in range(len(ports))) + "]",
        "    networks: [127.0.0.0/8]",
    ]
    path = directory / "agents.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


Operation = Callable[[ReachClient, str, int], Awaitable[float]]
"""One kind of call: reach over ``via`` with agents of ``work_ms``; returns the agent's own time in ms."""


async def single(client: ReachClient, via: str, work_ms: int) -> float:
    answer = (await client.reach("work", {"work_ms": work_ms}, timeout_ms=TIMEOUT_MS)).raise_for_status()
    return float(answer.data["own_ms"])


async def chain(client: ReachClient, via: str, work_ms: int) -> float:
    payload = {"work_ms": work_ms, "via": via}
    answer = (await client.reach("relay", payload, timeout_ms=TIMEOUT_MS)).raise_for_status()
    return float(answer.data["own_ms"])


async def broadcast(client: ReachClient, via: str, work_ms: int) -> float:
    result = await client.broadcast(
        "work", {"work_ms": work_ms}, k=BROADCAST_K, aggregate="all", stagger=0.0, timeout_ms=TIMEOUT_MS
    )
    failed = [f"{r.status} {r.error.code if r.error else ''}" for r in result.responses if not r.ok]
    if result.status != "success" or len(result.responses) != BROADCAST_K:
        raise RuntimeError(f"broadcast ended {result.status} with {len(result.responses)} answers; failed: {failed}")
    return max(float(response.data["own_ms"]) for response in result.responses)


KINDS: dict[str, Operation] = {"single": single, "chain": chain, "broadcast": broadcast}


async def mixed(client: ReachClient, via: str, work_ms: int, calls: int, rng: random.Random) -> dict[str, Any]:
    """``calls`` operations drawn from :data:`MIX`, :data:`CONCURRENCY` at a time: the reach layer's percentiles."""
    kinds = rng.choices([kind for kind, _ in MIX], weights=[weight for _, weight in MIX], k=calls)
    layer: dict[str, list[float]] = {kind: [] for kind, _ in MIX}
    errors: list[str] = []
    queue = list(kinds)

    async def caller() -> None:
        while queue:
            kind = queue.pop()
            began = time.perf_counter()
            try:
                own = await KINDS[kind](client, via, work_ms)
            except Exception as exc:  # every failure counts and is shown; the run goes on
                errors.append(f"{kind}: {exc}")
                continue
            layer[kind].append((time.perf_counter() - began) * 1000 - own)

    await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
    every = [value for values in layer.values() for value in values]
    overall = percentiles(every)
    return {
        "calls": calls,
        "errors": len(errors),
        "first_errors": errors[:3],
        "reach_layer": overall,
        "by_kind": {kind: {"calls": len(values), **percentiles(values)} for kind, values in layer.items()},
        "rule_p95_under_tenth_of_agent": bool(overall) and overall["p95_ms"] < work_ms / 10,
    }


async def capacity(url: str, concurrency: int) -> dict[str, Any]:
    """Two calls per caller from ``concurrency`` callers at once: p50/P99 of the answered ones and the error rate."""
    body = {"capability": "work", "payload": {"work_ms": 0}, "tenant": "bench"}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    latencies: list[float] = []
    errors = 0
    first_error = ""
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_MS / 1000)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def caller(number: int) -> None:
            nonlocal errors, first_error
            for turn in range(2):
                began = time.perf_counter()
                try:
                    request = {**body, "request_id": f"c{concurrency}-{number}-{turn}"}
                    async with session.post(url, json=request, headers=headers) as answer:
                        text = await answer.text()
                        error = "" if answer.status == 200 else f"{answer.status} {text[:200]}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    error = repr(exc)
                if not error:
                    latencies.append((time.perf_counter() - began) * 1000)
                else:
                    errors += 1
                    first_error = first_error or error

        began = time.perf_counter()
        await asyncio.gather(*(caller(n) for n in range(concurrency)))
        elapsed = time.perf_counter() - began
    figures = percentiles(latencies)
    return {
        "concurrency": concurrency,
        "requests": 2 * concurrency,
        "p50_ms": figures.get("p50_ms"),
        "p99_ms": figures.get("p99_ms"),
        "error_rate": round(errors / (2 * concurrency), 4),
        "rps": round(2 * concurrency / elapsed, 1),
        "first_error": first_error,
    }


async def bench(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """Start the agents, gateway(s) and node; run the mixed workload per transport and agent time, then capacity."""
    processes: list[subprocess.Popen[str]] = []
    try:
        ports = [free_port() for _ in range(AGENTS)]
        config = write_config(directory, ports)
        gateway_port, node_port, workers_port = free_port(), free_port(), free_port()
        gateway_url, node_address = f"http://127.0.0.1:{gateway_port}", f"127.0.0.1:{node_port}"
        for first in range(0, AGENTS, PER_PROCESS):
            group = [str(port) for port in ports[first : first + PER_PROCESS]]
            command = [sys.executable, "-c", AGENTS_PROCESS, str(config), gateway_url, node_address, str(first)]
            processes.append(start([*command, *group], ports[first]))
            for port in ports[first + 1 : first + PER_PROCESS]:
                wait_port(port, processes[-1])
        processes.append(
            start([*REACH_CLI, "gateway", "--config", str(config), "--port", str(gateway_port)], gateway_port)
        )
        processes.append(start([*REACH_CLI, "node", "--config", str(config), "--port", str(node_port)], node_port))
        transports: dict[str, Callable[[], Transport]] = {
            "direct": DirectTransport,
            "gateway": lambda: GatewayTransport(gateway_url, token=TOKEN),
            "node": lambda: GrpcNodeTransport(node_address, token=TOKEN),
        }
        rng = random.Random(args.seed)
        workload: dict[str, Any] = {}
        for via, transport in transports.items():
            for work_ms, calls in AGENT_TIMES_MS.items():
                async with ReachClient(str(config), transport(), tenant="bench", environ=ENV) as client:
                    warm = [chain(client, via, work_ms) for _ in range(CONCURRENCY)]
                    await asyncio.gather(
                        *warm, *(single(client, via, work_ms) for _ in range(CONCURRENCY)), return_exceptions=True
                    )
                    result = await mixed(client, via, work_ms, max(CONCURRENCY, round(calls * args.scale)), rng)
                    workload.setdefault(via, {})[f"{work_ms}ms"] = result
                    print(
                        f"{via:>8} agent {work_ms:>5} ms: {result['reach_layer']} errors {result['errors']}", flush=True
                    )
        gateways = {"gateway": gateway_url}
        if args.redis:
            command = [*REACH_CLI, "gateway", "--config", str(config), "--port", str(workers_port), "--workers", "2"]
            processes.append(start([*command, "--dedup-store", args.redis], workers_port))
            gateways["gateway_workers_2"] = f"http://127.0.0.1:{workers_port}"
        table: dict[str, list[dict[str, Any]]] = {}
        for name, url in gateways.items():
            await capacity(f"{url}/v1/reach", 100)  # warm-up
            for level in CAPACITY_LEVELS:
                row = await capacity(f"{url}/v1/reach", level)
                table.setdefault(name, []).append(row)
                print(f"{name:>17} {row}", flush=True)
        return {"workload": workload, "capacity": table}
    finally:
        stop(processes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the mixed workload's call counts")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--redis", help="redis://HOST:PORT/DB: the --workers 2 gateway's shared dedup store")
    args = parser.parse_args()
    if args.scale <= 0:
        parser.error(f"--scale must be above 0 (got {args.scale})")
    load_before = os.getloadavg()
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as directory:
        figures = asyncio.run(bench(args, Path(directory)))
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seconds": round(time.monotonic() - began, 1),
        "settings": {
            "agents": AGENTS,
            "mix": dict(MIX),
            "broadcast_k": BROADCAST_K,
            "concurrency": CONCURRENCY,
            "calls_per_agent_time": {
                f"{ms}ms": max(CONCURRENCY, round(n * args.scale)) for ms, n in AGENT_TIMES_MS.items()
            },
            "capacity_levels": list(CAPACITY_LEVELS),
            "capacity_agent_work_ms": 0,
            "seed": args.seed,
        },
        **figures,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(
        json.dumps(
            {
                via: {t: r["rule_p95_under_tenth_of_agent"] for t, r in runs.items()}
                for via, runs in figures["workload"].items()
            }
        )
    )


if __name__ == "__main__":
    main()
