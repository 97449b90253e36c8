"""Which gRPC server stack the node should stand on: every candidate side by side in one run, beside ``reach node``.

Issue 29 item 1, the node part. A bare echo server for the node's ``Call``
method (the ``ReachNode`` stubs, the node's server options, the reply a
successful call gets) is served by each candidate stack in its own process on
127.0.0.1:

* ``grpc_aio_uvloop``: ``grpc.aio.server()`` on uvloop, the stack ``reach
  node`` runs on today (``run_node`` picks uvloop when it is installed);
* ``grpc_aio``: the same on asyncio's own loop;
* ``grpc_sync_2`` / ``_4`` / ``_16``: ``grpc.server`` with a
  ``ThreadPoolExecutor`` of 2 / 4 / 16 threads and a plain (blocking) servicer;
* ``grpc_sync_4_bridged``: the sync server with 4 threads, each call handed to
  an asyncio (uvloop) loop in its own thread and waited for: what the node
  would pay on the sync stack, its forwarder, queue and tickets being asyncio;
* ``reach_node``: the real ``reach node`` forwarding to an echo agent (the
  agent SDK, over HTTP), and ``agent_direct``, a plain aiohttp POST to that
  agent, to see what the node's hop adds over calling the agent directly.

One grpc.aio client (one channel per server, as ``GrpcNodeTransport`` keeps)
drives them with :mod:`bench_hops`' helpers: concurrency 1 interleaved across
servers (p50/p99), then each server at concurrency 64 (req/s, and CPU time of
the server process from ``/proc`` over the requests it answered), round after
round; figures are medians over the rounds. A call the node sheds under its
adaptive limit (``RESOURCE_EXHAUSTED``, or a ``Backpressure`` reply) is
counted in ``errors`` and in the CPU's divisor, left out of latency and req/s.
The load average is recorded before and after. Results go to
``benchmarks/results/node_stack.json``.

    .venv/bin/python benchmarks/bench_node_stack.py [--requests 1500] [--rounds 3]
"""

from __future__ import annotations

import argparse
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

import aiohttp
import grpc
import uvloop
from bench_hops import (
    AGENT,
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

from reach_plugins.wire.proto import reach_pb2, reach_pb2_grpc

RESULTS = Path(__file__).parent / "results" / "node_stack.json"

SERVER = textwrap.dedent(
    """
    import asyncio, sys, threading
    from concurrent.futures import ThreadPoolExecutor
    import grpc, uvloop
    from reach_plugins.node.server import SLOW_CLIENTS
    from reach_plugins.wire.proto import reach_pb2, reach_pb2_grpc

    def reply(request):
        result = reach_pb2.Result(request_id=request.request_id, status=reach_pb2.SUCCESS, data=request.payload)
        return reach_pb2.CallReply(result=result)

    async def areply(request):
        return reply(request)

    class Echo(reach_pb2_grpc.ReachNodeServicer):
        def Call(self, request, context):
            return reply(request)

    class Bridged(reach_pb2_grpc.ReachNodeServicer):
        def __init__(self):
            self.loop = uvloop.new_event_loop()
            threading.Thread(target=self.loop.run_forever, daemon=True).start()

        def Call(self, request, context):
            return asyncio.run_coroutine_threadsafe(areply(request), self.loop).result(context.time_remaining())

    class AsyncEcho(reach_pb2_grpc.ReachNodeServicer):
        async def Call(self, request, context):
            return reply(request)

    async def serve_aio(port):
        server = grpc.aio.server(options=SLOW_CLIENTS)
        reach_pb2_grpc.add_ReachNodeServicer_to_server(AsyncEcho(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    stack, threads, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if stack in ("sync", "bridged"):
        server = grpc.server(ThreadPoolExecutor(max_workers=threads), options=SLOW_CLIENTS)
        reach_pb2_grpc.add_ReachNodeServicer_to_server(Echo() if stack == "sync" else Bridged(), server)
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
    "grpc_sync_2": ("sync", 2),
    "grpc_sync_4": ("sync", 4),
    "grpc_sync_16": ("sync", 16),
    "grpc_sync_4_bridged": ("bridged", 4),
}
"""Candidate name -> (stack, thread-pool size) passed to :data:`SERVER`."""

BASELINE = "grpc_aio_uvloop"
"""The stack ``reach node`` runs on: every other one is compared with it."""

METADATA = (("authorization", f"Bearer {TOKEN}"), ("x-tenant", "bench"))
"""What the real node needs to admit a call (the echo servers ignore it)."""

TARGETS = {
    "node_added_p50_ms": ("<=", 0.7),
    "node_throughput_share_c64": (">=", 0.60),
}
"""Issue 29's node targets as this benchmark sees them: ``reach_node`` against ``agent_direct`` (raw calls on both
sides; ``bench_hops`` measures the same through ``ReachClient``)."""


class CallFailed(Exception):
    """A call neither answered nor shed: no RuntimeError, so :func:`bench_hops.loaded` lets it end the run."""


def stub_path(channel: grpc.aio.Channel) -> Call:
    """One ``Call`` over ``channel``: a shed call raises RuntimeError (counted), any other failure ends the run."""
    stub = reach_pb2_grpc.ReachNodeStub(channel)  # type: ignore[no-untyped-call]
    message = reach_pb2.ReachCall(request_id="r", capability="echo", payload=b'{"order_id":"A1"}', deadline_ms=10_000)

    async def call() -> None:
        try:
            reply = await stub.Call(message, metadata=METADATA, timeout=10.0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            raise RuntimeError(f"shed: {exc.details()}") from exc
        if reply.HasField("backpressure"):
            raise RuntimeError(f"shed: {reply.backpressure.reason}")
        if reply.result.status != reach_pb2.SUCCESS:
            raise CallFailed(f"bench call failed: {reply}")

    return call


async def bench(args: argparse.Namespace, directory: Path) -> list[dict[str, Any]]:
    """Start every server, then measure them all, round after round."""
    processes: list[subprocess.Popen[str]] = []
    channels: list[grpc.aio.Channel] = []
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))
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
        node = start([*REACH_CLI, "node", "--config", str(config), "--port", str(node_port)], node_port)
        processes.append(node)
        channels.append(grpc.aio.insecure_channel(f"127.0.0.1:{node_port}"))
        paths["reach_node"] = Hop(stub_path(channels[-1]), {"server": node.pid, "agent": agent.pid})
        agent_url = f"http://127.0.0.1:{agent_port}/reach"
        paths["agent_direct"] = Hop(http_path(session, agent_url), {"server": agent.pid})
        return await measure(paths, args.rounds, args.requests)
    finally:
        await session.close()
        for channel in channels:
            await channel.close()
        stop(processes)


def figures(runs: dict[str, Any]) -> dict[str, float]:
    """One round's (or the medians') comparison: each stack against :data:`BASELINE`, the node against the agent."""
    base = runs[BASELINE]

    def cpu(name: str) -> float:
        return float(runs[name]["c64"]["cpu_us_per_request"]["server"])

    out: dict[str, float] = {}
    for name in STACKS:
        if name != BASELINE:
            run = runs[name]
            out[f"{name}_cpu_vs_{BASELINE}"] = round(cpu(name) / cpu(BASELINE), 3)
            out[f"{name}_rps_c64_vs_{BASELINE}"] = round(run["c64"]["rps"] / base["c64"]["rps"], 3)
            out[f"{name}_p50_c1_vs_{BASELINE}"] = round(run["c1"]["p50_ms"] / base["c1"]["p50_ms"], 3)
    node, direct = runs["reach_node"], runs["agent_direct"]
    out["node_cpu_us_per_request"] = cpu("reach_node")
    out["node_cpu_above_stack_us"] = round(cpu("reach_node") - cpu(BASELINE), 1)
    out["node_added_p50_ms"] = round(node["c1"]["p50_ms"] - direct["c1"]["p50_ms"], 3)
    out["node_throughput_share_c64"] = round(node["c64"]["rps"] / direct["c64"]["rps"], 3)
    return out


def table(paths: dict[str, Any]) -> None:
    head = f"{'server':20} {'c1 p50':>8} {'c1 p99':>8} {'c64 p50':>8} {'c64 p99':>8} {'c64 rps':>8} {'shed':>6}"
    print(f"{head} {'CPU us/req':>10}")
    for name, row in paths.items():
        one, many = row["c1"], row["c64"]
        print(
            f"{name:20} {one['p50_ms']:8.3f} {one['p99_ms']:8.3f} {many['p50_ms']:8.3f} {many['p99_ms']:8.3f}"
            f" {many['rps']:8.0f} {many['errors']:6} {many['cpu_us_per_request']['server']:10.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500, help="requests per latency run (x3 at concurrency 64)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load_before = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory() as directory:
        rounds = uvloop.run(bench(args, Path(directory)))
    paths = medians(rounds)
    per_round = [figures(r) for r in rounds]
    summary = {key: round(statistics.median(r[key] for r in per_round), 3) for key in per_round[0]}
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "grpc": grpc.__version__},
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "settings": {"requests": args.requests, "rounds": args.rounds, "concurrency": [1, 64], "interleaved": True},
        "paths": paths,
        "figures_per_round": per_round,
        "summary": summary,
        "targets": verdict(summary, TARGETS),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\nmedians over {args.rounds} rounds; load average {report['load_average_before']} -> "
        f"{report['load_average_after']} ({os.cpu_count()} cores shared with other work)"
    )
    table(paths)
    print(json.dumps(summary, indent=2))
    print_verdict(report["targets"])


if __name__ == "__main__":
    main()
