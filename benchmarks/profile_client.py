"""Where a ``ReachClient.reach`` over aiohttp spends its time, beside raw aiohttp to the same agent, one run.

The agent of ``bench_transport.py`` runs in a child process. Calls are made
one after another (concurrency 1): first raw aiohttp and ``reach`` alternate
in chunks (their p50s, from the same minutes), then ``reach`` runs under
``cProfile`` and the profile is folded into the phases of a call: building the
request, routing, the core's bookkeeping, the transport (aiohttp and the wire).
Profiling inflates Python time, so phases are given as shares of the profiled
call, and the unprofiled p50s say what they add up to; the client process's
CPU time per call (``time.process_time``, the agent's excluded) is given too.

    python benchmarks/profile_client.py [--calls 3000]  # writes benchmarks/results/client_profile.json
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench_transport import TIMEOUT, client, raw_aiohttp, start_server

RESULTS = Path(__file__).parent / "results" / "client_profile.json"
CHUNK = 100
PHASES = {
    "build the request (ReachClient.request)": ("reach_plugins/client/client.py", "request"),
    "route (router + pinning)": ("reach_plugins/routing/pinning.py", "route"),
    "prepare the flight (pipeline._prepare, incl. route)": ("reach_plugins/attempts/pipeline.py", "_prepare"),
    "admit + breaker + limits (attempts.prepare)": ("reach_plugins/attempts/engine.py", "prepare"),
    "send the attempt (attempts.send, incl. transport)": ("reach_plugins/attempts/engine.py", "send"),
    "transport (DirectTransport.send)": ("transports/direct/transport.py", "send"),
    "settle the outcome (attempts.settle)": ("reach_plugins/attempts/engine.py", "settle"),
    "build the response (attempts.respond)": ("reach_plugins/attempts/engine.py", "respond"),
    "finish (pipeline._finish)": ("reach_plugins/attempts/pipeline.py", "_finish"),
}


def fold(stats: pstats.Stats, calls: int) -> dict[str, Any]:
    """Cumulative time of each phase's function, per call and as a share of ``ReachClient.reach``."""
    table = stats.stats  # type: ignore[attr-defined]
    cumulative: dict[tuple[str, str], float] = {}
    for (filename, _, name), (_, _, _, cum, _) in table.items():
        for suffix, function in [*PHASES.values(), ("reach_plugins/client/client.py", "reach")]:
            if filename.endswith(suffix) and name == function:
                cumulative[suffix, function] = cumulative.get((suffix, function), 0.0) + cum
    whole = cumulative.get(("reach_plugins/client/client.py", "reach"), 0.0)
    return {
        phase: {
            "profiled_us_per_call": round(cumulative.get(key, 0.0) / calls * 1e6, 1),
            "share_of_reach": round(cumulative.get(key, 0.0) / whole, 3) if whole else None,
        }
        for phase, key in PHASES.items()
    }


async def run(url: str, calls: int) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        raw = await raw_aiohttp(url, stack)
        reach = await client("aiohttp")(url, stack)
        for send in (raw, reach):
            for _ in range(300):
                await send()
        samples: dict[str, list[float]] = {"raw_aiohttp": [], "reach": []}
        cpu: dict[str, float] = {"raw_aiohttp": 0.0, "reach": 0.0}
        for _ in range(max(1, calls // CHUNK)):
            for name, send in (("raw_aiohttp", raw), ("reach", reach)):
                cpu_before = time.process_time()
                for _ in range(CHUNK):
                    started = time.perf_counter()
                    await send()
                    samples[name].append(time.perf_counter() - started)
                cpu[name] += time.process_time() - cpu_before
        p50 = {name: round(statistics.median(got) * 1e6, 1) for name, got in samples.items()}
        cpu_us = {name: round(spent / len(samples[name]) * 1e6, 1) for name, spent in cpu.items()}
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            await reach()
        profiler.disable()
    return {
        "p50_us": p50,
        "reach_vs_raw_p50": round(p50["reach"] / p50["raw_aiohttp"], 3),
        "added_us": round(p50["reach"] - p50["raw_aiohttp"], 1),
        "client_cpu_us_per_call": cpu_us,
        "added_client_cpu_us": round(cpu_us["reach"] - cpu_us["raw_aiohttp"], 1),
        "phases": fold(pstats.Stats(profiler), calls),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    port = 18_000 + os.getpid() % 1000
    server = start_server(port)
    load_before = os.getloadavg()[0]
    try:
        result = asyncio.run(run(f"http://127.0.0.1:{port}", args.calls))
    finally:
        server.terminate()
        server.wait(10)
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "calls": args.calls,
        "timeout_s": TIMEOUT,
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        **result,
    }
    print(
        f"p50 raw aiohttp {result['p50_us']['raw_aiohttp']} us, reach {result['p50_us']['reach']} us "
        f"({result['reach_vs_raw_p50']}x, +{result['added_us']} us; target <= 1.10x)"
    )
    cpu = result["client_cpu_us_per_call"]
    print(
        f"client CPU per call: raw aiohttp {cpu['raw_aiohttp']} us, reach {cpu['reach']} us "
        f"(+{result['added_client_cpu_us']} us; the client process only, far less load-sensitive than latency)"
    )
    for phase, figures in result["phases"].items():
        print(f"  {phase:55} {figures['profiled_us_per_call']:8.1f} us profiled  {figures['share_of_reach']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
