"""Which HTTP server stack: the candidates side by side in one run, each as an echo server and as a forwarder.

Candidates (each its own process on 127.0.0.1, one worker, uvloop;
:mod:`stack_servers` holds the bare ones): uvicorn + Starlette (today's
stack), aiohttp.web (serving and forwarding on one loop), granian (RSGI), a
raw asyncio protocol on httptools; then ours — the server layer
(reach_plugins/server/: authenticated, bounded, strictly parsed, on our
guarded uvicorn protocol), the agent SDK's server, and ``reach gateway``.
Every forwarder (the gateway too) forwards to one upstream, the httptools
echo, through a pooled aiohttp client session, so forwarders differ in their
serving side and what they do per request.

Measured as :mod:`bench_hops` measures (its helpers): per round, every path
at concurrency 1 interleaved (p50/p99), then each at 64 with the CPU time the
path's own server process spent per request; figures are medians over the
rounds, the load average is printed per round and kept in the JSON
(``benchmarks/results/stack.json``). A forwarder's added p50 is its p50 less
the upstream echo's own.

    .venv/bin/python benchmarks/bench_stack.py [--requests 1500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from bench_hops import (
    AGENT,
    BODY,
    REACH_CLI,
    TOKEN,
    Call,
    Hop,
    config_file,
    free_port,
    http_path,
    measure,
    medians,
    start,
    stop,
)
from targets import print_verdict, verdict

HERE = Path(__file__).parent
RESULTS = HERE / "results" / "stack.json"
SERVERS = str(HERE / "stack_servers.py")
STACKS = ("starlette", "aiohttp", "granian", "httptools", "layer")
"""The bare candidates and our layer: each runs as an echo and as a forwarder."""
UPSTREAM = "echo_httptools"
"""The echo every forwarder forwards to (the cheapest one, so the upstream costs the forwarders least)."""

TARGETS = {
    "gateway_cpu_us_per_request": ("<=", 260.0),
    "agent_sdk_cpu_vs_aiohttp_echo": ("<=", 1.2),
}
"""Issue 29's targets this benchmark can see (the hop targets are bench_hops', beside the peers)."""


def command(stack: str) -> list[str]:
    """How to start one candidate (granian runs :func:`stack_servers.rsgi_app` under its own CLI)."""
    if stack != "granian":
        return [sys.executable, SERVERS]
    options = ["--interface", "rsgi", "--loop", "uvloop", "--workers", "1", "--log-level", "warning"]
    return [sys.executable, "-m", "granian", *options, "--working-dir", str(HERE), "stack_servers:rsgi_app"]


def server(stack: str, mode: str, upstream: str = "") -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    env = {"BENCH_STACK": stack, "BENCH_MODE": mode, "BENCH_PORT": str(port), "BENCH_UPSTREAM": upstream}
    if stack == "granian":
        env |= {"GRANIAN_HOST": "127.0.0.1", "GRANIAN_PORT": str(port)}
    return start(command(stack), port, env), port


def shedding(session: aiohttp.ClientSession, url: str, shed: list[int]) -> Call:
    """A gateway call that counts a 429 (its adaptive limit shedding load) in ``shed`` instead of failing the run."""
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def call() -> None:
        async with session.post(url, json=BODY, headers=headers) as answer:
            await answer.read()
            if answer.status == 429:
                shed[0] += 1
            elif answer.status != 200:
                raise RuntimeError(f"{url} answered {answer.status}")

    return call


async def bench(args: argparse.Namespace, directory: Path, shed: list[int]) -> list[dict[str, Any]]:
    """Start every candidate in both modes, ours beside them; measure every path, round after round."""
    processes: list[subprocess.Popen[str]] = []
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
    try:
        paths: dict[str, Hop] = {}

        def add(name: str, process: subprocess.Popen[str], url: str, headers: dict[str, str] | None = None) -> None:
            processes.append(process)
            paths[name] = Hop(http_path(session, url, headers), {name: process.pid})

        upstream, upstream_port = server("httptools", "echo")
        add(UPSTREAM, upstream, f"http://127.0.0.1:{upstream_port}/reach")
        upstream_url = f"http://127.0.0.1:{upstream_port}/reach"
        for stack in STACKS:
            if stack == "granian" and importlib.util.find_spec("granian") is None:
                print("granian is not installed (pip install -e '.[bench]'): skipped", flush=True)
                continue
            for mode in ("echo", "forward"):
                if (stack, mode) == ("httptools", "echo"):
                    continue
                process, port = server(stack, mode, upstream_url)
                add(f"{mode}_{stack}", process, f"http://127.0.0.1:{port}/reach")
        agent_port = free_port()
        add(
            "echo_agent_sdk",
            start([sys.executable, "-c", AGENT, str(agent_port)], agent_port),
            f"http://127.0.0.1:{agent_port}/reach",
        )
        config = config_file(directory, upstream_port)
        gateway_port = free_port()
        gateway = start([*REACH_CLI, "gateway", "--config", str(config), "--port", str(gateway_port)], gateway_port)
        processes.append(gateway)
        paths["forward_gateway"] = Hop(
            shedding(session, f"http://127.0.0.1:{gateway_port}/v1/reach", shed), {"forward_gateway": gateway.pid}
        )
        return await measure(paths, args.rounds, args.requests)
    finally:
        await session.close()
        stop(processes)


def figures(paths: dict[str, Any]) -> dict[str, float]:
    """The comparison's figures: CPU per request of each path's server, forwarders' added p50, our ratios."""

    def cpu(name: str) -> float:
        return float(paths[name]["c64"]["cpu_us_per_request"][name])

    out = {f"{name}_cpu_us_per_request": cpu(name) for name in paths}
    base = paths[UPSTREAM]["c1"]["p50_ms"]
    for name in paths:
        if name.startswith("forward_"):
            out[f"{name}_added_p50_ms"] = round(paths[name]["c1"]["p50_ms"] - base, 3)
    out["gateway_cpu_us_per_request"] = cpu("forward_gateway")
    if "echo_aiohttp" in paths:
        out["agent_sdk_cpu_vs_aiohttp_echo"] = round(cpu("echo_agent_sdk") / cpu("echo_aiohttp"), 3)
    return out


def table(paths: dict[str, Any]) -> None:
    head = f"{'path':18} {'c1 p50':>8} {'c1 p99':>8} {'c64 p50':>8} {'c64 p99':>8} {'c64 rps':>8} {'CPU us/req':>10}"
    print(head)
    for name, row in paths.items():
        one, many = row["c1"], row["c64"]
        print(
            f"{name:18} {one['p50_ms']:8.3f} {one['p99_ms']:8.3f} {many['p50_ms']:8.3f} {many['p99_ms']:8.3f}"
            f" {many['rps']:8.0f} {many['cpu_us_per_request'][name]:10.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500, help="requests per latency run (x3 at concurrency 64)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import uvloop

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as directory:
        shed = [0]
        rounds = uvloop.run(bench(args, Path(directory), shed))
    paths = medians(rounds)
    summary = figures(paths)
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "settings": {"requests": args.requests, "rounds": args.rounds, "concurrency": [1, 64], "upstream": UPSTREAM},
        "paths": paths,
        "figures_per_round": [figures(r) for r in rounds],
        "gateway_shed_429": shed[0],
        "summary": summary,
        "targets": verdict(summary, TARGETS),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\nmedians over {args.rounds} rounds; load average {report['load_average_before']} -> "
        f"{report['load_average_after']} (2 cores shared with other work)"
    )
    table(paths)
    print(f"the gateway shed {shed[0]} calls with 429 (its adaptive concurrency limit), counted among its requests")
    print_verdict(report["targets"])


if __name__ == "__main__":
    main()
