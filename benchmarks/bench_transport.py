"""Loopback HTTP benchmark: raw aiohttp and raw httpx POSTs vs DirectTransport (and ReachClient) on each engine.

One trivial reach agent runs under uvicorn (uvloop + httptools) in a child
process; every client posts the same reach body to it with the same pool
settings (64 connections, 90 s keep-alive). For each concurrency the modes
run in turn, for several rounds; the round with the median throughput is
reported. Results go to ``benchmarks/results/transport.json``.

    .venv/bin/python benchmarks/bench_transport.py [--calls 2000] [--rounds 3] [--concurrency 1 32 64]
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
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from reach_plugins.model import AgentDescriptor, ReachRequest
from reach_plugins.transport import Call
from transports.direct import DirectTransport

RESULTS = Path(__file__).parent / "results" / "transport.json"
POOL = 64
KEEP_ALIVE = 90.0
PAYLOAD = {"order_id": "A1", "fields": ["status", "eta"]}
Send = Callable[[], Awaitable[Any]]


def serve(port: int) -> None:
    """Child process: a trivial reach agent."""
    from reach_plugins.agent import ReachAgent, serve

    agent = ReachAgent("bench")

    @agent.capability("query_order")
    async def query_order(order_id: str, fields: list[str]) -> dict[str, Any]:
        return {"order_id": order_id, "status": "shipped", "fields": fields}

    serve(agent, "127.0.0.1", port)


def start_server(port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    for _ in range(200):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=0.5):
                return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the benchmark agent did not start")


def reach_body() -> bytes:
    body = {"request_id": uuid.uuid4().hex, "capability": "query_order", "action": None, "payload": PAYLOAD}
    return json.dumps(body).encode()


HEADERS = {"Content-Type": "application/json", "Accept": "application/json", "X-Reach-Deadline": "5000"}


async def raw_aiohttp(url: str, stack: AsyncExitStack) -> Send:
    connector = aiohttp.TCPConnector(limit=POOL, keepalive_timeout=KEEP_ALIVE)
    session = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
    timeout = aiohttp.ClientTimeout(total=5)

    async def send() -> Any:
        async with session.post(f"{url}/reach", data=reach_body(), headers=HEADERS, timeout=timeout) as response:
            return json.loads(await response.read())

    return send


async def raw_httpx(url: str, stack: AsyncExitStack) -> Send:
    limits = httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL, keepalive_expiry=KEEP_ALIVE)
    client = await stack.enter_async_context(httpx.AsyncClient(limits=limits, timeout=5))

    async def send() -> Any:
        response = await client.post(f"{url}/reach", content=reach_body(), headers=HEADERS)
        return json.loads(response.content)

    return send


def direct(engine: str) -> Callable[[str, AsyncExitStack], Awaitable[Send]]:
    async def make(url: str, stack: AsyncExitStack) -> Send:
        transport = await stack.enter_async_context(DirectTransport(engine=engine))  # type: ignore[arg-type]
        agent = AgentDescriptor(name="bench", endpoints=[url], capabilities=["query_order"])
        instance = agent.static_instances()[0]

        async def send() -> Any:
            request = ReachRequest(capability="query_order", payload=PAYLOAD)
            return await transport.send(Call(request=request, agent=agent, instance=instance, timeout=5.0))

        return send

    return make


def client(engine: str) -> Callable[[str, AsyncExitStack], Awaitable[Send]]:
    async def make(url: str, stack: AsyncExitStack) -> Send:
        from reach_plugins import ReachClient
        from reach_plugins.registry.memory import MemoryRegistry

        registry = MemoryRegistry()
        await registry.register_agent(AgentDescriptor(name="bench", endpoints=[url], capabilities=["query_order"]))
        reach = ReachClient(registry=registry, transport=DirectTransport(engine=engine))  # type: ignore[arg-type]
        await stack.enter_async_context(reach)

        async def send() -> Any:
            response = await reach.reach("query_order", PAYLOAD, timeout_ms=5000)
            if response.status != "success":
                raise RuntimeError(f"benchmark call failed: {response.error}")
            return response

        return send

    return make


MODES: dict[str, Callable[[str, AsyncExitStack], Awaitable[Send]]] = {
    "raw_aiohttp": raw_aiohttp,
    "raw_httpx": raw_httpx,
    "direct_aiohttp": direct("aiohttp"),
    "direct_httpx": direct("httpx"),
    "client_aiohttp": client("aiohttp"),
    "client_httpx": client("httpx"),
}


async def measure(send: Send, calls: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    remaining = calls

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            await send()
            latencies.append(time.perf_counter() - start)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - began
    cuts = statistics.quantiles(latencies, n=100)
    return {"p50_ms": cuts[49] * 1000, "p99_ms": cuts[98] * 1000, "rps": len(latencies) / wall}


async def run_mode(mode: str, url: str, calls: int, concurrency: int) -> dict[str, float]:
    async with AsyncExitStack() as stack:
        send = await MODES[mode](url, stack)
        await measure(send, min(200, calls), concurrency)
        return await measure(send, calls, concurrency)


def ratios(results: dict[str, dict[str, dict[str, float]]], low: str, high: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for engine in ("aiohttp", "httpx"):
        raw = results[low][f"raw_{engine}"]
        for kind in ("direct", "client"):
            mine = results[low].get(f"{kind}_{engine}")
            if mine:
                out[f"{kind}_{engine}_p50_vs_raw_c{low}"] = round(mine["p50_ms"] / raw["p50_ms"], 3)
            mine_high = results[high].get(f"{kind}_{engine}")
            if mine_high:
                ratio = mine_high["rps"] / results[high][f"raw_{engine}"]["rps"]
                out[f"{kind}_{engine}_rps_vs_raw_c{high}"] = round(ratio, 3)
    for kind in ("direct", "client"):
        mine_high = results[high].get(f"{kind}_aiohttp")
        if mine_high:
            out[f"{kind}_aiohttp_rps_vs_raw_httpx_c{high}"] = round(
                mine_high["rps"] / results[high]["raw_httpx"]["rps"], 3
            )
    return out


async def bench(url: str, calls: int, rounds: int, levels: list[int], modes: list[str]) -> dict[str, Any]:
    results: dict[str, dict[str, dict[str, float]]] = {}
    errors: dict[str, str] = {}
    for concurrency in levels:
        per_mode: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode in modes:
                if mode in errors:
                    continue
                try:
                    per_mode[mode].append(await run_mode(mode, url, calls, concurrency))
                except Exception as exc:
                    errors[mode] = f"{type(exc).__name__}: {exc}"
        level: dict[str, dict[str, float]] = {}
        for mode, samples in per_mode.items():
            if samples:
                median = sorted(samples, key=lambda sample: sample["rps"])[len(samples) // 2]
                level[mode] = {key: round(value, 3) for key, value in median.items()}
        results[str(concurrency)] = level
        print(f"concurrency {concurrency}: " + json.dumps(level), flush=True)
    return {"results": results, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 64])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--port", type=int, default=18731)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    server = start_server(args.port)
    try:
        outcome = asyncio.run(
            bench(f"http://127.0.0.1:{args.port}", args.calls, args.rounds, args.concurrency, args.modes)
        )
    finally:
        server.terminate()
        server.wait(10)
    levels = [str(level) for level in args.concurrency]
    report = {
        "benchmark": "transport",
        "calls": args.calls,
        "rounds": args.rounds,
        "pool": {"max_conns": POOL, "idle_timeout": KEEP_ALIVE},
        "environment": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "aiohttp": aiohttp.__version__,
            "httpx": httpx.__version__,
            "server": "uvicorn + uvloop + httptools, 1 process",
        },
        **outcome,
        "ratios": ratios(outcome["results"], levels[0], levels[-1]) if len(levels) > 1 else {},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratios"], indent=2))
    if outcome["errors"]:
        print("errors:", json.dumps(outcome["errors"], indent=2))


if __name__ == "__main__":
    main()
