"""Which gRPC server stack the node should stand on: grpc.aio against the sync server with a thread pool.

Issue 29 item 1, the node part. A bare echo server for the node's ``Call``
method (the ``ReachNode`` stubs, the reply a successful call gets) is served
by each candidate stack in its own process on 127.0.0.1:

* ``grpc_aio_uvloop``: ``grpc.aio.server()`` on uvloop, the stack ``reach
  node`` runs on today;
* ``grpc_aio``: the same on asyncio's own loop;
* ``grpc_sync_4`` / ``grpc_sync_16``: ``grpc.server`` with a
  ``ThreadPoolExecutor`` of 4 / 16 threads and a plain (blocking) servicer;
* ``reach_node``: the real ``reach node`` forwarding to an agent (SDK, HTTP),
  for reference: what the node's own work adds on top of its stack.

One grpc.aio client (one channel per server, as ``GrpcNodeTransport`` keeps)
drives them the way ``bench_hops`` drives its paths: concurrency 1
interleaved across servers (p50/p99), then each server at concurrency 64
(req/s, and CPU time of the server process over the requests it answered),
round after round; figures are medians over the rounds. The load average is
recorded before and after. Results go to ``benchmarks/results/node_stack.json``.

    .venv/bin/python benchmarks/bench_node_stack.py [--requests 1500] [--rounds 3]
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
import tempfile
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import uvloop
from bench_hops import AGENT, TOKEN, Call, Hop, config_file, free_port, medians, one_round, start

from reach_plugins.wire.proto import reach_pb2, reach_pb2_grpc

RESULTS = Path(__file__).parent / "results" / "node_stack.json"

SERVER = textwrap.dedent(
    """
    import asyncio, sys
    from concurrent.futures import ThreadPoolExecutor
    import grpc, uvloop
    from reach_plugins.wire.proto import reach_pb2, reach_pb2_grpc

    def reply(request):
        result = reach_pb2.Result(request_id=request.request_id, status=reach_pb2.SUCCESS, data=request.payload)
        return reach_pb2.CallReply(result=result)

    class Echo(reach_pb2_grpc.ReachNodeServicer):
        def Call(self, request, context):
            return reply(request)

    class AsyncEcho(reach_pb2_grpc.ReachNodeServicer):
        async def Call(self, request, context):
            return reply(request)

    async def serve_aio(port):
        server = grpc.aio.server()
        reach_pb2_grpc.add_ReachNodeServicer_to_server(AsyncEcho(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    stack, threads, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if stack == "sync":
        server = grpc.server(ThreadPoolExecutor(max_workers=threads))
        reach_pb2_grpc.add_ReachNodeServicer_to_server(Echo(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        server.wait_for_termination()
    elif stack == "aio_uvloop":
        uvloop.run(serve_aio(port))
    else:
        asyncio.run(serve_aio(port))
    """
)

STACKS = {
    "grpc_aio_uvloop": ("aio_uvloop", 0),
    "grpc_aio": ("aio", 0),
    "grpc_sync_4": ("sync", 4),
    "grpc_sync_16": ("sync", 16),
}
"""Candidate name -> (stack, thread-pool size) passed to :data:`SERVER`."""

BASELINE = "grpc_aio_uvloop"
"""The stack ``reach node`` runs on: every other one is compared with it."""

METADATA = (("authorization", f"Bearer {TOKEN}"), ("x-tenant", "bench"))
"""What the real node needs to admit a call (the echo servers ignore it)."""


def stub_path(channel: grpc.aio.Channel) -> Call:
    """One ``Call`` over ``channel``, failing loudly on anything but a successful result."""
    stub = reach_pb2_grpc.ReachNodeStub(channel)  # type: ignore[no-untyped-call]
    message = reach_pb2.ReachCall(request_id="r", capability="echo", payload=b'{"order_id":"A1"}', deadline_ms=10_000)

    async def call() -> None:
        reply = await stub.Call(message, metadata=METADATA, timeout=10.0)
        if reply.result.status != reach_pb2.SUCCESS:
            raise RuntimeError(f"bench call failed: {reply}")

    return call


async def bench(args: argparse.Namespace, directory: Path) -> list[dict[str, Any]]:
    """Start every server, then measure them all, round after round."""
    processes: list[subprocess.Popen[str]] = []
    channels: list[grpc.aio.Channel] = []
    try:
        paths: dict[str, Hop] = {}
        for name, (stack, threads) in STACKS.items():
            port = free_port()
            process = start([sys.executable, "-c", SERVER, stack, str(threads), str(port)], port)
            processes.append(process)
            channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
            paths[name] = Hop(stub_path(channels[-1]), {"server": process.pid})
        agent_port, node_port = free_port(), free_port()
        agent = start([sys.executable, "-c", AGENT, str(agent_port)], agent_port)
        processes.append(agent)
        config = config_file(directory, agent_port)
        cli = [sys.executable, "-c", "from reach_plugins.cli import main; main()"]
        node = start([*cli, "node", "--config", str(config), "--port", str(node_port)], node_port)
        processes.append(node)
        channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{node_port}"))
        paths["reach_node"] = Hop(stub_path(channels[-1]), {"server": node.pid, "agent": agent.pid})
        for path in paths.values():  # warm-up: connections open, code paths hot
            for _ in range(200):
                await path.call()
        rounds = []
        for number in range(args.rounds):
            print(f"round {number + 1} of {args.rounds} (load average {os.getloadavg()[0]:.1f})", flush=True)
            rounds.append(await one_round(paths, args.requests))
        return rounds
    finally:
        for channel in channels:
            await channel.close()
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)


def against_baseline(runs: dict[str, Any]) -> dict[str, float]:
    """One round's comparison of each stack with :data:`BASELINE`: CPU per request and req/s at 64, p50 at 1."""
    base = runs[BASELINE]
    out: dict[str, float] = {}
    for name in STACKS:
        if name == BASELINE:
            continue
        run = runs[name]
        cpu = run["c64"]["cpu_us_per_request"]["server"] / base["c64"]["cpu_us_per_request"]["server"]
        out[f"{name}_cpu_vs_{BASELINE}"] = round(cpu, 3)
        out[f"{name}_rps_c64_vs_{BASELINE}"] = round(run["c64"]["rps"] / base["c64"]["rps"], 3)
        out[f"{name}_p50_c1_vs_{BASELINE}"] = round(run["c1"]["p50_ms"] / base["c1"]["p50_ms"], 3)
    return out


def print_table(paths: dict[str, Any], load: tuple[list[float], list[float]]) -> None:
    print(f"\nload average before {load[0]}, after {load[1]} ({os.cpu_count()} cores)")
    head = ("server", "c1 p50 ms", "c1 p99 ms", "c64 p50 ms", "c64 p99 ms", "c64 req/s", "CPU us/req")
    print(f"{head[0]:>16} " + " ".join(f"{column:>10}" for column in head[1:]))
    for name, figures in paths.items():
        c1, c64 = figures["c1"], figures["c64"]
        row = (c1["p50_ms"], c1["p99_ms"], c64["p50_ms"], c64["p99_ms"], c64["rps"])
        cpu = c64["cpu_us_per_request"]["server"]
        print(f"{name:>16} " + " ".join(f"{value:>10}" for value in (*row, cpu)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500, help="requests per latency run (x3 at concurrency 64)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    uvloop.install()
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as directory:
        rounds = asyncio.run(bench(args, Path(directory)))
    per_round = [against_baseline(r) for r in rounds]
    load_after = [round(x, 2) for x in os.getloadavg()]
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "grpc": grpc.__version__},
        "load_average_before": load_before,
        "load_average_after": load_after,
        "settings": {"requests": args.requests, "rounds": args.rounds, "concurrency": [1, 64], "interleaved": True},
        "paths": medians(rounds),
        "vs_baseline_per_round": per_round,
        "vs_baseline": {key: round(statistics.median(r[key] for r in per_round), 3) for key in per_round[0]},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report["paths"], (load_before, load_after))
    print(json.dumps(report["vs_baseline"], indent=2))


if __name__ == "__main__":
    main()
