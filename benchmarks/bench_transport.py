"""Loopback HTTP benchmark: raw aiohttp and raw httpx POSTs vs DirectTransport (and ReachClient) on each engine.

One trivial reach agent runs under uvicorn (uvloop + httptools) in a child
process; every client posts the same reach body to it with the same pool
settings (64 connections, 90 s keep-alive). For each concurrency the modes
run back to back, for several rounds; figures are medians over the rounds and
ratios are medians of per-round paired ratios (so a machine shared with other
work drifts both sides alike). Results go to ``benchmarks/results/transport.json``.

What each mode does per call: ``raw_*`` build a reach body (fresh request id),
POST it and parse the JSON reply; ``direct_*`` hand DirectTransport a fresh
``Call`` for one prepared ``ReachRequest`` (the core makes a Call per attempt;
the request itself is the client's, about 10 us of pydantic and uuid) and get
a ``Reply``; ``client_*`` run ``ReachClient.reach`` end to end (request, route,
resilience core, transport).

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
from targets import print_verdict, verdict

from reach_plugins.model import AgentDescriptor, ReachRequest
from reach_plugins.transport import Call
from transports.direct import DirectTransport

RESULTS = Path(__file__).parent / "results" / "transport.json"
POOL = 64
KEEP_ALIVE = 90.0
TIMEOUT = 30.0
"""Generous, so httpx's pool collapse under concurrency shows as slowness rather than errors."""
PAYLOAD = {"order_id": "A1", "fields": ["status", "eta"]}
Send = Callable[[], Awaitable[Any]]


def serve(port: int) -> None:
    """Child process: a trivial reach agent."""
    from reach_plugins.agent import ReachAgent, serve

    agent = ReachAgent("bench", tokens="open")  # raw POSTs carry no token; bench_tokens.py measures the check

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


HEADERS = {"Content-Type": "application/json", "Accept": "application/json", "X-Reach-Deadline": "30000"}


async def raw_aiohttp(url: str, stack: AsyncExitStack) -> Send:
    connector = aiohttp.TCPConnector(limit=POOL, keepalive_timeout=KEEP_ALIVE)
    session = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)

    async def send() -> Any:
        async with session.post(f"{url}/reach", data=reach_body(), headers=HEADERS, timeout=timeout) as response:
            return json.loads(await response.read())

    return send


async def raw_httpx(url: str, stack: AsyncExitStack) -> Send:
    limits = httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL, keepalive_expiry=KEEP_ALIVE)
    client = await stack.enter_async_context(httpx.AsyncClient(limits=limits, timeout=TIMEOUT))

    async def send() -> Any:
        response = await client.post(f"{url}/reach", content=reach_body(), headers=HEADERS)
        return json.loads(response.content)

    return send


def direct(engine: str) -> Callable[[str, AsyncExitStack], Awaitable[Send]]:
    async def make(url: str, stack: AsyncExitStack) -> Send:
        transport = await stack.enter_async_context(DirectTransport(engine=engine))  # type: ignore[arg-type]
        agent = AgentDescriptor(name="bench", endpoints=[url], capabilities=["query_order"])
        instance = agent.static_instances()[0]

        request = ReachRequest(capability="query_order", payload=PAYLOAD)

        async def send() -> Any:
            return await transport.send(Call(request=request, agent=agent, instance=instance, timeout=TIMEOUT))

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
            response = await reach.reach("query_order", PAYLOAD, timeout_ms=int(TIMEOUT * 1000))
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


TARGETS = {
    "client_aiohttp_p50_vs_raw_aiohttp_c1": ("<=", 1.10),
    "client_aiohttp_rps_vs_raw_aiohttp_c64": (">=", 0.90),
}
"""Issue 18: ReachClient over aiohttp within 10 % of raw aiohttp at c=1, at least 0.90x its throughput at c=64."""

PAIRS = [(f"{kind}_{engine}", f"raw_{engine}") for kind in ("direct", "client") for engine in ("aiohttp", "httpx")]
PAIRS += [(f"{kind}_aiohttp", "raw_httpx") for kind in ("direct", "client")]


def ratios(samples: dict[str, dict[str, list[dict[str, float]]]], low: str, high: str) -> dict[str, float]:
    """Median over rounds of paired ratios (each round's modes ran back to back, so load drifts cancel out).

    p50 at ``low`` concurrency for each mode against its own raw library;
    throughput at ``high`` against its raw library and the default path against raw httpx.
    """
    out: dict[str, float] = {}
    for mine, raw in PAIRS:
        same_engine = raw.endswith(mine.rsplit("_", 1)[1])
        for level, metric in ((low, "p50_ms"), (high, "rps")):
            if metric == "p50_ms" and not same_engine:
                continue
            ours, theirs = samples[level].get(mine, []), samples[level].get(raw, [])
            paired = [a[metric] / b[metric] for a, b in zip(ours, theirs, strict=False)]
            if paired:
                out[f"{mine}_{metric.split('_')[0]}_vs_{raw}_c{level}"] = round(statistics.median(paired), 3)
    return out


async def bench(
    url: str, calls: int, rounds: int, levels: list[int], modes: list[str]
) -> tuple[dict[str, dict[str, list[dict[str, float]]]], dict[str, str]]:
    """Every mode at every concurrency, ``rounds`` times, modes back to back within a round."""
    samples: dict[str, dict[str, list[dict[str, float]]]] = {}
    errors: dict[str, str] = {}
    for concurrency in levels:
        level = samples[str(concurrency)] = {mode: [] for mode in modes}
        for _ in range(rounds):
            for mode in modes:
                if mode in errors:
                    continue
                try:
                    level[mode].append(await run_mode(mode, url, calls, concurrency))
                except Exception as exc:
                    errors[mode] = f"{type(exc).__name__}: {exc}"
        print(f"concurrency {concurrency}: " + json.dumps(summary(level)), flush=True)
    return samples, errors


def summary(level: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per mode, the median of each figure over the rounds."""
    return {
        mode: {key: round(statistics.median(run[key] for run in runs), 3) for key in runs[0]}
        for mode, runs in level.items()
        if runs
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 64])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--port", type=int, default=18731)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    server = start_server(args.port)
    try:
        url = f"http://127.0.0.1:{args.port}"
        samples, errors = asyncio.run(bench(url, args.calls, args.rounds, args.concurrency, args.modes))
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
        "load_average_after": os.getloadavg(),
        "results": {level: summary(samples[level]) for level in levels},
        "rps_by_round": {
            level: {mode: [round(run["rps"]) for run in runs] for mode, runs in samples[level].items()}
            for level in levels
        },
        "ratios": ratios(samples, levels[0], levels[-1]) if len(levels) > 1 else {},
        "errors": errors,
    }
    report["targets"] = verdict(report["ratios"], TARGETS)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["ratios"], indent=2))
    print_verdict(report["targets"])
    if errors:
        print("errors:", json.dumps(errors, indent=2))


if __name__ == "__main__":
    main()
