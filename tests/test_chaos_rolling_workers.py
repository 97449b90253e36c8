"""A rolling restart of ``reach gateway --workers 2`` under keyed load drops no call (issue 28, deliverable 6).

The operator's rolling restart: SIGTERM to one worker, wait until the supervisor's
replacement answers, then the other. Meanwhile a client sends 30 keyed calls a
second through the gateway port; every call must succeed, and each key must run
exactly once at the agents (the workers share the Redis dedup store).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from hop_support import TOKENS, demo_tenants, free_port, serve_agents, until_true, write_config
from test_gateway_workers import alive, both_workers_answer, workers_of

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError
from transports.gateway import GatewayTransport

CLI = "from reach_plugins.cli import main; main()"
RATE = 30
"""Keyed calls a second during the restart."""


async def test_a_rolling_restart_of_the_gateway_workers_drops_no_call(tmp_path: Path, redis_url: str) -> None:
    prefix = f"rolling-{uuid.uuid4().hex[:8]}"
    outcomes: dict[str, str] = {}
    with serve_agents(("orders", "o1"), ("orders", "o2")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [a.url for a in agents]}, demo_tenants())
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port)]
        command += ["--workers", "2", "--dedup-store", f"{redis_url}?prefix={prefix}:"]
        supervisor = subprocess.Popen(command, env={**os.environ, **TOKENS})
        try:
            first = await both_workers_answer(supervisor, url)
            transport = GatewayTransport(url, token=TOKENS["DEMO_TOKEN"])
            async with (
                asyncio.timeout(180),
                ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client,
            ):

                async def one(key: str) -> None:
                    try:
                        response = await client.reach(
                            "query_order", {"order_id": key}, idempotency_key=key, timeout_ms=10_000
                        )
                        outcomes[key] = "success" if response.ok else (response.error.type if response.error else "?")
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
                for victim in sorted(first):
                    os.kill(victim, signal.SIGTERM)

                    async def replaced(victim: int = victim) -> bool:
                        assert supervisor.poll() is None, "the supervisor exited"
                        workers = workers_of(supervisor)
                        return not alive(victim) and len(workers) == 2 and victim not in workers

                    await until_true(replaced, within=30.0)
                    await both_workers_answer(supervisor, url)
                await asyncio.sleep(1.0)
                stop.set()
                await traffic
        finally:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(30)
        executed = Counter(payload["order_id"] for agent in agents for _, payload in agent.executed)
    failed = {key: outcome for key, outcome in outcomes.items() if outcome != "success"}
    twice = {key: times for key, times in executed.items() if times > 1}
    print(f"rolling restart of 2 workers at {RATE} keyed calls/s: {len(outcomes)} calls, {len(failed)} failed, "
          f"{len(twice)} keys run twice")
    assert len(outcomes) >= RATE * 2
    assert failed == {}
    assert twice == {}
    assert set(executed) == set(outcomes)
