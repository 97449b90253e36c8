"""Rolling restarts under keyed load drop no call (issue 28, deliverable 6): the gateway's workers, and the nodes.

The operator's rolling restart: SIGTERM to one worker (or node), wait until its
replacement answers, then the next. Meanwhile a client sends 30 keyed calls a
second; every call must succeed, and each key must run exactly once at the
agents. The gateway's workers are replaced by their supervisor on one port; the
nodes are two ``reach node`` processes behind one gRPC channel balancing round
robin over both, each started again on its port by the test.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import httpx
from hop_support import TOKENS, demo_tenants, free_port, serve_agents, until_true, write_config
from test_gateway_workers import alive, both_workers_answer, workers_of

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError
from reach_plugins.transport import Transport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

CLI = "from reach_plugins.cli import main; main()"
RATE = 30
"""Keyed calls a second during the restart."""
BALANCED = [
    ("grpc.lb_policy_name", "round_robin"),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]
"""The client's channel to both nodes: calls go round robin to the nodes that are up; a node that went away is
tried again within half a second (gRPC's default backoff grows to two minutes)."""
SERVED = re.compile(r"^reach_client_requests_total\{[^}]*\} (\S+)$", re.MULTILINE)


async def keyed_load(
    config: Path, transport: Transport, prefix: str, restart: Callable[[], Awaitable[None]]
) -> dict[str, str]:
    """Each key's outcome of :data:`RATE` keyed calls a second sent through ``transport`` from 1 s before
    ``restart()`` until 1 s after it."""
    outcomes: dict[str, str] = {}
    async with (
        asyncio.timeout(180),
        ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client,
    ):

        async def one(key: str) -> None:
            try:
                response = await client.reach("query_order", {"order_id": key}, idempotency_key=key, timeout_ms=10_000)
                outcomes[key] = (
                    "success"
                    if response.ok
                    else (f"{response.error.type}: {response.error.message}" if response.error else "?")
                )
            except ReachError as exc:
                outcomes[key] = f"{type(exc).__name__}: {exc}"

        stop = asyncio.Event()

        async def load() -> None:
            tasks = []
            while not stop.is_set():
                tasks.append(asyncio.create_task(one(f"{prefix}-{len(tasks)}")))
                await asyncio.sleep(1 / RATE)
            await asyncio.gather(*tasks)

        traffic = asyncio.create_task(load())
        await asyncio.sleep(1.0)
        await restart()
        await asyncio.sleep(1.0)
        stop.set()
        await traffic
    return outcomes


def check(what: str, outcomes: dict[str, str], executed: Counter[str]) -> None:
    """Every call succeeded, and ran once at the agents."""
    failed = {key: outcome for key, outcome in outcomes.items() if outcome != "success"}
    twice = {key: times for key, times in executed.items() if times > 1}
    print(
        f"rolling restart of {what} at {RATE} keyed calls/s: {len(outcomes)} calls, {len(failed)} failed, "
        f"{len(twice)} keys run twice"
    )
    assert len(outcomes) >= RATE * 2
    assert failed == {}
    assert twice == {}
    assert set(executed) == set(outcomes)


async def test_a_rolling_restart_of_the_gateway_workers_drops_no_call(tmp_path: Path, redis_url: str) -> None:
    prefix = f"rolling-{uuid.uuid4().hex[:8]}"
    with serve_agents(("orders", "o1"), ("orders", "o2")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [a.url for a in agents]}, demo_tenants())
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port)]
        command += ["--workers", "2", "--dedup-store", f"{redis_url}?prefix={prefix}:"]
        supervisor = subprocess.Popen(command, env={**os.environ, **TOKENS})
        try:
            first = await both_workers_answer(supervisor, url)

            async def restart() -> None:
                for victim in sorted(first):
                    os.kill(victim, signal.SIGTERM)

                    async def replaced(victim: int = victim) -> bool:
                        assert supervisor.poll() is None, "the supervisor exited"
                        workers = workers_of(supervisor)
                        return not alive(victim) and len(workers) == 2 and victim not in workers

                    await until_true(replaced, within=30.0)
                    await both_workers_answer(supervisor, url)

            outcomes = await keyed_load(config, GatewayTransport(url, token=TOKENS["DEMO_TOKEN"]), prefix, restart)
        finally:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(30)
        executed = Counter(payload["order_id"] for agent in agents for _, payload in agent.executed)
    check("2 gateway workers", outcomes, executed)


async def node_answers(port: int) -> bool:
    """Whether a node listens on ``port`` (a token-less Call is refused UNAUTHENTICATED only by a running node)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            await channel.unary_unary("/reach.v1.ReachNode/Call")(b"", timeout=2)
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.UNAUTHENTICATED
    return False


async def node_served(metrics_port: int) -> bool:
    """Whether the node whose ``/metrics`` is on ``metrics_port`` has forwarded a call (the client reaches it)."""
    try:
        async with httpx.AsyncClient() as http:
            page = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2)).text
    except httpx.TransportError:
        return False
    return sum(float(value) for value in SERVED.findall(page)) > 0


async def test_a_rolling_restart_of_two_nodes_drops_no_call(tmp_path: Path) -> None:
    """Each node comes back on its port and is restarted only once the client's calls reach the other again
    (its /metrics counts them): what an operator watches between two steps of a rolling restart."""
    prefix = f"rolling-node-{uuid.uuid4().hex[:8]}"
    with serve_agents(("orders", "o1"), ("orders", "o2")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [a.url for a in agents]}, demo_tenants())
        ports = [(free_port(), free_port()) for _ in range(2)]

        def start(port: int, metrics_port: int) -> subprocess.Popen[bytes]:
            command = [sys.executable, "-c", CLI, "node", "--config", str(config), "--port", str(port)]
            command += ["--metrics-port", str(metrics_port)]
            return subprocess.Popen(command, env={**os.environ, **TOKENS})

        nodes = [start(*pair) for pair in ports]
        try:
            for port, _ in ports:
                await until_true(lambda port=port: node_answers(port), within=60.0)

            async def restart() -> None:
                for index, (port, metrics_port) in enumerate(ports):
                    nodes[index].send_signal(signal.SIGTERM)
                    await asyncio.to_thread(nodes[index].wait, 30)
                    nodes[index] = start(port, metrics_port)
                    await until_true(lambda metrics_port=metrics_port: node_served(metrics_port), within=60.0)

            target = "ipv4:" + ",".join(f"127.0.0.1:{port}" for port, _ in ports)
            transport = GrpcNodeTransport(target, token=TOKENS["DEMO_TOKEN"], options=BALANCED)
            outcomes = await keyed_load(config, transport, prefix, restart)
        finally:
            for node in nodes:
                node.send_signal(signal.SIGTERM)
            for node in nodes:
                node.wait(30)
        executed = Counter(payload["order_id"] for agent in agents for _, payload in agent.executed)
    check("2 nodes", outcomes, executed)
