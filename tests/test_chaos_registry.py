"""Fail-static registry, with real processes and a real etcd that is stopped for 45 s.

Agents are separate processes registered in a private etcd (lease TTL 2 s,
default heartbeats every 10 s, down after 30 s without one). The test
process routes calls through that etcd's view while etcd is down: the view
as last seen stays in force and heartbeat age stops counting, so no call
fails while an agent is up; a killed agent is left by its breaker and then,
when etcd answers again, by its expired lease.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from servers import Server, free_port

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError
from reach_plugins.model import Instance
from reach_plugins.registry import open_registry
from reach_plugins.registry.etcd import EtcdRegistry

OUTAGE = 45.0
"""Seconds etcd stays down: longer than the 30 s heartbeat grace, as in issue 13."""
RATE = 10.0
"""Calls a second sent by the test while etcd is down."""
RECONCILE = 3.0
"""Seconds after etcd answers again within which the view must be reconciled (issue 13)."""
LEASE_EXTENSION = 1.0
"""etcd renews every lease on restart (TTL 2 s plus its 1 s election timeout): a dead agent's key outlives
the return by that long whatever the client does, so leaving gets this second on top of RECONCILE."""

AGENT = """
import sys
from reach_plugins.agent import ReachAgent, serve
from reach_plugins.registry import open_registry

registry_url, port = sys.argv[1], int(sys.argv[2])
agent = ReachAgent("orders")

@agent.capability("query_order")
def query_order() -> dict:
    return {"port": port}

serve(agent, "127.0.0.1", port, registry=open_registry(registry_url), loop="asyncio", log_level="warning")
"""


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Agent processes started by a test; killed at the end whatever happened."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


async def calls_during(client: ReachClient, seconds: float, failures: Counter[str]) -> int:
    """Send RATE calls a second for ``seconds``; count failures by error type; return how many were sent."""
    sent = 0
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        sent += 1
        try:
            response = await client.reach("query_order", {}, timeout_ms=5_000)
            if response.status != "success":
                failures[response.error.type if response.error else response.status] += 1
        except ReachError as exc:
            failures[type(exc).__name__] += 1
        await asyncio.sleep(1 / RATE)
    return sent


async def test_etcd_down_45s_keeps_routing_and_reconciles_when_back(
    private_etcd: Server, processes: list[subprocess.Popen[bytes]]
) -> None:
    """etcd stopped 45 s: 0 failed calls while an agent is up; back, the dead instance leaves and a new one joins."""
    async with asyncio.timeout(OUTAGE + 60):
        await _outage(private_etcd, processes)


async def _outage(private_etcd: Server, processes: list[subprocess.Popen[bytes]]) -> None:
    url = f"etcd://127.0.0.1:{private_etcd.port}/reach-chaos-{uuid.uuid4().hex}/?lease_ttl=2"
    ports = [free_port(), free_port()]
    processes.extend(subprocess.Popen([sys.executable, "-c", AGENT, url, str(port)]) for port in ports)
    registry = open_registry(url)
    assert isinstance(registry, EtcdRegistry)
    await registry.start()
    client = ReachClient(registry=registry)
    async with asyncio.timeout(30):
        while len(registry.instances("orders")) < 2:
            await asyncio.sleep(0.05)
    victim_id = next(i for i, inst in registry.instances("orders").items() if inst.endpoint.endswith(f":{ports[1]}"))
    failures: Counter[str] = Counter()
    private_etcd.stop()
    stopped = time.monotonic()
    sent = await calls_during(client, OUTAGE / 3, failures)
    processes[1].send_signal(signal.SIGKILL)
    sent += await calls_during(client, OUTAGE - (time.monotonic() - stopped), failures)
    down_for = time.monotonic() - stopped
    assert victim_id in registry.instances("orders"), "the view as last seen stays while etcd is down"

    private_etcd.start()
    back = time.monotonic()
    newcomer = EtcdRegistry("127.0.0.1", private_etcd.port, prefix=registry.prefix, lease_ttl=2)
    await newcomer.register_instance(
        Instance(agent="orders", instance_id="orders-new", endpoint=f"http://127.0.0.1:{ports[0]}")
    )
    sent += await calls_during(client, 0.5, failures)
    joined = left = None
    async with asyncio.timeout(10):
        while joined is None or left is None:
            now = time.monotonic() - back
            if joined is None and "orders-new" in registry.instances("orders"):
                joined = now
            if left is None and victim_id not in registry.instances("orders"):
                left = now
            await asyncio.sleep(0.02)
    await newcomer.aclose()
    await client.aclose()
    await registry.aclose()
    print(f"etcd down {down_for:.1f}s, {sent} calls, failures {dict(failures)}; joined {joined:.2f}s, left {left:.2f}s")
    assert down_for >= OUTAGE
    assert sent >= OUTAGE * RATE / 2
    assert failures == Counter(), "no call may fail while an agent is up"
    assert joined <= RECONCILE
    assert left <= RECONCILE + LEASE_EXTENSION
