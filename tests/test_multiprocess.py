"""Several real processes sharing Redis and etcd: one execution per key, dead agents leave routing.

Client and agent processes are small Python programs started with the test's
interpreter; they talk to the shared test servers and report on stdout.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from servers import free_port

from reach_plugins import ReachClient
from reach_plugins.registry import open_registry
from reach_plugins.registry.etcd import EtcdRegistry

LEASE_TTL = 2
AGENT_WORK = 1.0
"""Seconds the counting agent takes per execution: long enough for both clients' claims to overlap."""

CLIENT = """
import asyncio, sys
from reach_plugins import ReachClient

async def main() -> None:
    client = ReachClient(registry=sys.argv[1], store=sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()
    response = await client.reach("create_ticket", {"title": "printer"}, idempotency_key="ticket-7", timeout_ms=10_000)
    print(response.model_dump_json(), flush=True)
    await client.aclose()

asyncio.run(main())
"""

AGENT = """
import sys
from reach_plugins.agent import ReachAgent, serve
from reach_plugins.registry import open_registry

registry_url, port = sys.argv[1], int(sys.argv[2])
agent = ReachAgent("orders")

@agent.capability("query_order")
def query_order() -> dict:
    return {"port": port}

serve(agent, "127.0.0.1", port, registry=open_registry(registry_url), loop="asyncio")
"""


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes started by a test; killed at the end whatever happened."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()


async def counting_agent(executions: list[str]) -> tuple[web.AppRunner, int]:
    """A raw reach-protocol agent (no agent-side dedup) that records every execution."""

    async def reach(request: web.Request) -> web.Response:
        body = await request.json()
        executions.append(body["request_id"])
        await asyncio.sleep(AGENT_WORK)
        data = {"ticket": len(executions)}
        return web.json_response({"request_id": body["request_id"], "status": "success", "data": data})

    app = web.Application()
    app.router.add_post("/reach", reach)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), timeout)
    assert line, f"process {process.args!r} exited with {process.wait()} before answering"
    return line.strip()


@pytest.mark.parametrize(("store", "runs"), [("redis", 1), ("memory", 2)])
async def test_same_key_from_two_processes(
    store: str, runs: int, redis_url: str, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """Two processes send one key at once: with Redis it runs once and both get that result (memory: twice)."""
    executions: list[str] = []
    runner, port = await counting_agent(executions)
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        f"agents:\n  - name: tickets\n    endpoint: http://127.0.0.1:{port}\n    capabilities: [create_ticket]\n"
    )
    store_url = f"{redis_url}?prefix=reach-test:{uuid.uuid4().hex}:" if store == "redis" else "memory://"
    processes.extend(spawn(CLIENT, f"file://{agents}", store_url) for _ in range(2))
    for process in processes:
        assert await read_line(process, 30) == "ready"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    answers = [json.loads(await read_line(process, 30)) for process in processes]
    await runner.cleanup()
    assert len(executions) == runs
    assert all(answer["status"] == "success" for answer in answers)
    if runs == 1:
        assert answers[0]["data"] == answers[1]["data"] == {"ticket": 1}


async def test_killed_agent_leaves_routing_within_the_lease(
    etcd_url: str, processes: list[subprocess.Popen[str]]
) -> None:
    """An agent killed with SIGKILL leaves routing within the lease TTL; its session moves with context restore."""
    prefix = f"/reach-test/{uuid.uuid4().hex}/"
    ports = [free_port(), free_port()]
    processes.extend(spawn(AGENT, f"{etcd_url}{prefix}?lease_ttl={LEASE_TTL}", str(port)) for port in ports)
    registry = open_registry(f"{etcd_url}{prefix}")
    assert isinstance(registry, EtcdRegistry)
    await registry.start()
    client = ReachClient(registry=registry)
    async with asyncio.timeout(30):
        while len(registry.instances("orders")) < 2:
            await asyncio.sleep(0.05)
    first = await client.reach("query_order", {}, session_id="s-1")
    assert first.status == "success" and first.instance is not None
    victim = processes[ports.index(first.data["port"])]
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    async with asyncio.timeout(LEASE_TTL + 3):
        while first.instance in registry.instances("orders"):
            await asyncio.sleep(0.02)
    left_after = time.monotonic() - killed
    second = await client.reach("query_order", {}, session_id="s-1")
    await client.aclose()
    await registry.aclose()
    assert left_after < LEASE_TTL + 1.0
    assert second.status == "success" and second.instance != first.instance
    assert second.context_restore
