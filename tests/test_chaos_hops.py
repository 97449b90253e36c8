"""Breakers blame the right hop: a gateway that dies and comes back opens its own breaker, not the agents'.

A real ``reach gateway`` process in front of three agent instances; the test
process is the client, sending 50 calls a second through the gateway. The
gateway is killed (SIGKILL, or SIGTERM for a graceful restart) and started
again at once. The client's breakers of the agent instances must never open
(the agents were fine all along); the gateway's own breaker opens, and calls
succeed again within 6 s of the gateway answering.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from hop_support import TOKENS, demo_tenants, free_port, serve_agents, write_config
from servers import startup_seconds

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError
from transports.gateway import GatewayTransport

CLI = "from reach_plugins.cli import main; main()"
RATE = 50.0
BACK_WITHIN = 6.0
"""Seconds after the gateway answers again by which calls succeed (issue 13: a 3 s fault costs about 3 s)."""


def start_gateway(config: Path, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--host", "127.0.0.1"]
    return subprocess.Popen([*command, "--port", str(port)], env={**os.environ, **TOKENS}, stderr=subprocess.DEVNULL)


async def wait_answers(url: str, within: float) -> float:
    """Poll /healthz until it answers 200; the monotonic time it first did."""
    end = time.monotonic() + within
    async with httpx.AsyncClient() as http:
        while time.monotonic() < end:
            try:
                if (await http.get(f"{url}/healthz", timeout=0.5)).status_code == 200:
                    return time.monotonic()
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.02)
    raise AssertionError(f"the gateway at {url} did not answer within {within:g}s")


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
async def test_gateway_restart_opens_only_the_gateway_breaker(
    how: signal.Signals, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Gateway down ~3 s: no agent-instance breaker opens at the client; calls succeed within 6 s of its return."""
    caplog.set_level(logging.INFO, logger="reach_plugins.attempts")
    outcomes: list[tuple[float, bool, str]] = []
    with serve_agents(("orders", "o1"), ("orders", "o2"), ("orders", "o3")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [a.url for a in agents]}, demo_tenants())
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        gateway = start_gateway(config, port)
        try:
            await wait_answers(url, startup_seconds())
            transport = GatewayTransport(url, token=TOKENS["DEMO_TOKEN"])
            async with (
                asyncio.timeout(90),
                ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client,
            ):

                async def one(n: int) -> None:
                    try:
                        response = await client.reach("query_order", {"order_id": f"o{n}"}, timeout_ms=3_000)
                        outcomes.append((time.monotonic(), response.ok, response.error.type if response.error else ""))
                    except ReachError as exc:
                        outcomes.append((time.monotonic(), False, type(exc).__name__))

                ready = math.inf

                def settled() -> bool:
                    """Calls succeed again after the gateway answered, for 3 s already: enough to see a relapse."""
                    back = [t for t, ok, _ in outcomes if ok and t >= ready]
                    return bool(back) and time.monotonic() > min(back) + 3.0

                async def load(seconds: float) -> None:
                    tasks, end = [], time.monotonic() + seconds
                    while time.monotonic() < end and not settled():
                        tasks.append(asyncio.create_task(one(len(outcomes) + len(tasks))))
                        await asyncio.sleep(1 / RATE)
                    await asyncio.gather(*tasks)

                await load(1.0)
                gateway.send_signal(how)
                gateway.wait(10)
                gateway = start_gateway(config, port)
                traffic = asyncio.create_task(load(25.0))
                ready = await wait_answers(url, startup_seconds())
                await traffic
        finally:
            gateway.kill()
            gateway.wait()
    after = [(t - ready, ok, kind) for t, ok, kind in outcomes if t >= ready]
    first = min((t for t, ok, _ in after if ok), default=math.inf)
    late_failures = Counter(kind for t, ok, kind in after if not ok and t > BACK_WITHIN)
    opened = [r.getMessage() for r in caplog.records if "-> open" in r.getMessage()]
    print(f"first success {first:.2f}s after the gateway answered; breakers opened: {opened}")
    assert not [line for line in opened if line.startswith("breaker orders/")], "agent breakers must stay closed"
    assert first <= BACK_WITHIN
    assert late_failures == Counter()
