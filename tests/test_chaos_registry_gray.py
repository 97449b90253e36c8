"""Gray registry faults with real processes: a hung etcd (SIGSTOP, then SIGCONT), and an agent starting while etcd is
down (issue 25, deliverables 3 and 7).

Three agent instances register in an etcd of the test's own (lease TTL 2 s).
The test process routes keyed calls through its own view of that etcd. A hung
etcd answers nothing and closes nothing: the registry must notice it (probes
with a timeout), serve the view as last seen meanwhile, and not read the
heartbeats it could not see as dead instances. When etcd resumes, it revokes
every lease that ran out during the hang at once; the instances come back
under new leases and the routers keep them meanwhile, so nothing fails after.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from chaos_support import port_answers
from hop_support import until
from servers import Server, free_port, wait_until

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError
from reach_plugins.model import AgentDescriptor, HealthCheck
from reach_plugins.registry import open_registry
from reach_plugins.registry.etcd import EtcdRegistry

HANG = 12.0
"""Seconds etcd stays stopped (SIGSTOP): twice the heartbeat grace below, six lease TTLs."""
BEAT = 2.0
"""Heartbeat interval of the agents; down after 3 missed (6 s), so the hang outlasts the grace."""
RATE = 20.0
"""Keyed calls a second started by the test, before, during and after the hang."""
AFTER = 8.0
"""Seconds of calls after SIGCONT."""
RETRY_FOR = 15.0
"""A caller retries a failed call with the same key for this long before it counts as failed for good."""

AGENT = """
import sys
from reach_plugins.agent import ReachAgent, ReachContext, serve

registry_url, port, instance_id, log, beat = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
out = open(log, "a", buffering=1)
agent = ReachAgent("orders")

@agent.capability("work")
def work(n: int, ctx: ReachContext) -> dict:
    out.write(f"{ctx.idempotency_key}\\n")
    return {"n": n, "by": instance_id}

endpoint = f"http://127.0.0.1:{port}"
agent.register_on_startup(registry_url, endpoint, instance_id=instance_id, interval=beat)
serve(agent, "127.0.0.1", port, loop="asyncio", log_level="warning")
"""


Starter = Callable[[str, str], tuple[subprocess.Popen[bytes], int]]


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Starter]:
    """Start agent processes (``start(registry_url, instance_id)`` -> process, port); all killed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(registry_url: str, instance_id: str) -> tuple[subprocess.Popen[bytes], int]:
        port = free_port()
        log = tmp_path / f"{instance_id}.log"
        command = [sys.executable, "-c", AGENT, registry_url, str(port), instance_id, str(log), str(BEAT)]
        started.append(subprocess.Popen(command, stderr=subprocess.PIPE))
        return started[-1], port

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def executions(folder: Path) -> Counter[str]:
    return Counter(key for log in folder.glob("*.log") for key in log.read_text().split())


async def orders_registry(etcd: Server, **options: str) -> EtcdRegistry:
    """A registry under a prefix of its own holding the operator's orders descriptor (heartbeats every BEAT s)."""
    query = "&".join(f"{k}={v}" for k, v in {"lease_ttl": "2", "timeout": "2", **options}.items())
    registry = open_registry(f"etcd://127.0.0.1:{etcd.port}/gray-{uuid.uuid4().hex[:8]}/?{query}")
    assert isinstance(registry, EtcdRegistry)
    health = HealthCheck(interval=BEAT, missed_heartbeats=3)
    await registry.register_agent(AgentDescriptor(name="orders", capabilities=["work"], health_check=health))
    return registry


@dataclass
class Call:
    """One keyed call: when it started (seconds after SIGSTOP), its first and its final outcome."""

    started: float
    first: str = ""
    final: str = ""


async def keyed_call(client: ReachClient, key: str, call: Call) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + RETRY_FOR
    while True:
        try:
            response = await client.reach("work", {"n": 0}, idempotency_key=key, timeout_ms=4_000)
            outcome = "success" if response.ok else (response.error.type if response.error else response.status)
        except ReachError as exc:
            outcome = type(exc).__name__
        call.first = call.first or outcome
        call.final = outcome
        if outcome == "success" or loop.time() > end:
            return
        await asyncio.sleep(0.2)


async def test_hung_etcd_costs_no_call(private_etcd: Server, agents: Starter, tmp_path: Path) -> None:
    """etcd SIGSTOPped 12 s (twice the heartbeat grace) under 20 keyed calls/s to 3 instances: 0 failed for good,
    0 failed first try after SIGCONT, 0 duplicates; the hang is noticed within a few seconds, no instance is lost."""
    assert private_etcd.process is not None
    registry = await orders_registry(private_etcd)
    url = f"etcd://127.0.0.1:{private_etcd.port}{registry.prefix}?lease_ttl=2&timeout=2"
    started = [agents(url, f"orders-{i}") for i in range(3)]
    wait_until(lambda: all(port_answers(port) for _, port in started), 30, "3 agents serving")
    await until(lambda: len(registry.instances("orders")) == 3, within=30)
    client = ReachClient(registry=registry)
    calls: list[Call] = []
    tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    noticed: float | None = None

    async def send_for(seconds: float, origin: float) -> None:
        nonlocal noticed
        end = loop.time() + seconds
        while loop.time() < end:
            call = Call(started=loop.time() - origin)
            calls.append(call)
            tasks.append(asyncio.create_task(keyed_call(client, uuid.uuid4().hex, call)))
            if noticed is None and not registry.reachable:
                noticed = loop.time() - origin
            await asyncio.sleep(1 / RATE)

    await send_for(2.0, loop.time() + 2.0)
    stopped = loop.time()
    private_etcd.process.send_signal(signal.SIGSTOP)
    try:
        await send_for(HANG, stopped)
    finally:
        private_etcd.process.send_signal(signal.SIGCONT)
    resumed = loop.time() - stopped
    await send_for(AFTER, stopped)
    async with asyncio.timeout(RETRY_FOR + 10):
        await asyncio.gather(*tasks)
    alive = sorted(i for i, inst in registry.instances("orders").items() if registry.is_alive(inst, time.time()))
    await client.aclose()
    await registry.aclose()
    duplicates = {key: n for key, n in executions(tmp_path).items() if n > 1}
    during = [c for c in calls if 0 <= c.started < resumed]
    after = [c for c in calls if c.started >= resumed]
    print(
        f"hung etcd {HANG:g}s: {len(calls)} keyed calls ({len(during)} during, {len(after)} after); "
        f"first try failed during={sum(c.first != 'success' for c in during)} "
        f"after={sum(c.first != 'success' for c in after)} {dict(Counter(c.first for c in calls))}; "
        f"failed for good={sum(c.final != 'success' for c in calls)}; duplicates={len(duplicates)}; "
        f"hang noticed after {noticed}s"
    )
    assert len(after) >= AFTER * RATE / 2 and len(during) >= HANG * RATE / 2
    assert [c for c in calls if c.final != "success"] == [], "no call may fail for good while 3 instances are up"
    assert [c for c in after if c.first != "success"] == [], "recovery after SIGCONT is immediate"
    assert duplicates == {}
    assert noticed is not None and noticed <= 5.0, "a hung etcd is noticed within a few seconds"
    assert alive == ["orders-0", "orders-1", "orders-2"]


async def test_agent_started_while_etcd_is_down_serves_and_registers_when_it_is_back(
    private_etcd: Server, agents: Starter
) -> None:
    """An agent process started while its etcd is stopped comes up and answers; once etcd runs again its instance
    appears (registration retried in the background) and serves a routed call."""
    registry = await orders_registry(private_etcd)
    private_etcd.stop()
    process, port = agents(f"etcd://127.0.0.1:{private_etcd.port}{registry.prefix}?lease_ttl=2&timeout=1", "late")
    wait_until(lambda: port_answers(port) or process.poll() is not None, 30, "the agent serving")
    assert process.poll() is None, process.stderr.read() if process.stderr else ""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        assert (await http.get("/readyz")).status_code == 200
    private_etcd.start()
    await until(lambda: "late" in registry.instances("orders"), within=20)
    async with ReachClient(registry=registry) as client:
        reply = await client.reach("work", {"n": 1}, idempotency_key=uuid.uuid4().hex, timeout_ms=4_000)
    await registry.aclose()
    assert reply.ok and reply.data == {"n": 1, "by": "late"}
