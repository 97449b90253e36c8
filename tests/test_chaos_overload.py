"""Overload is not a failure: 10x the capacity of a real agent costs goodput nothing and opens no breaker.

One agent process serves ``query_order`` with ``max_concurrency=3`` and 0.1 s
of work: a capacity of 30 calls a second, which the agent SDK enforces itself
(the rest answered "not executed", 503 + Retry-After). The test process sends
10 calls a second, then 300 a second for a while, then 10 again, directly or
through a real gateway process, with the limit declared in the registry or
not (then only the agent's refusals teach the caller its window). Asserted:

* the agent never runs more than ``LIMIT`` at once;
* goodput (executions the agent completed during the overload) at least 95 %
  of capacity, less the window's edges (each of the ``LIMIT`` seats finishes
  one call a ``WORK``, so counting by finishing time is off by at most one
  call a seat);
* every call that did not succeed was shed as overload (RateLimited or
  Backpressure), none as a fault or an unknown outcome;
* no breaker opened (the client's, and the gateway's own);
* every call started from one second after the overload ended succeeded.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from hop_support import TOKENS, demo_tenants, free_port, write_config
from servers import startup_seconds
from test_chaos_agents import wait_listening

from reach_plugins import ReachClient
from reach_plugins.agent import ReachAgent
from reach_plugins.errors import ReachError
from transports.gateway import GatewayTransport

LIMIT = 3
WORK = 0.1
CAPACITY = LIMIT / WORK
"""Calls a second the agent can complete: ``LIMIT`` seats, each busy ``WORK`` seconds a call."""
NORMAL = 10.0
OVERLOAD = 10 * CAPACITY
OVER_FOR = 8.0
SHED = {"RateLimited", "Backpressure", "rate_limited", "backpressure"}

AGENT = """
import asyncio, sys, time
from reach_plugins.agent import ReachAgent, serve

port, log, limit, work = sys.argv[1:5]
out = open(log, "a", buffering=1)
agent = ReachAgent("orders")
running = 0

@agent.capability("query_order", max_concurrency=int(limit))
async def query_order(order_id: str) -> dict:
    global running
    running += 1
    try:
        await asyncio.sleep(float(work))
        out.write(f"{time.time()} {running}\\n")
    finally:
        running -= 1
    return {"order_id": order_id}

serve(agent, "127.0.0.1", int(port), loop="asyncio", log_level="warning")
"""

GATEWAY = """
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from reach_plugins.cli import main
main()
"""


def spawn(args: list[str], stderr: Path) -> subprocess.Popen[bytes]:
    with stderr.open("wb") as sink:
        return subprocess.Popen([sys.executable, "-c", *args], env={**os.environ, **TOKENS}, stderr=sink)


class Load:
    """Open-loop calls: each one's start, end (monotonic), and outcome."""

    def __init__(self, client: ReachClient) -> None:
        self.client = client
        self.calls: list[tuple[float, float, str]] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def one(self, n: int) -> None:
        started = time.monotonic()
        try:
            response = await self.client.reach("query_order", {"order_id": f"o{n}"}, timeout_ms=3_000)
            outcome = "success" if response.ok else (response.error.type if response.error else "fail")
        except ReachError as exc:
            outcome = type(exc).__name__
        self.calls.append((started, time.monotonic(), outcome))

    async def offer(self, rate: float, seconds: float) -> None:
        """Start ``rate`` calls a second for ``seconds`` (paced against the clock, so a slow loop catches up)."""
        begin = time.monotonic()
        sent = 0
        while (now := time.monotonic()) < begin + seconds:
            due = int((now - begin) * rate) + 1
            for _ in range(due - sent):
                self.tasks.append(asyncio.create_task(self.one(len(self.tasks))))
            sent = due
            await asyncio.sleep(min(0.01, 1 / rate))


async def test_the_agent_sdk_enforces_max_concurrency_before_claiming_the_key() -> None:
    """max_concurrency 1: one runs, one waits its turn, the rest are answered 503 "not executed" (rate_limited,
    Retry-After) without their key being claimed, so the same key runs once a seat is free."""
    agent = ReachAgent("orders", tokens="open")  # the wire spoken by hand
    gate = asyncio.Event()
    ran: list[str] = []

    @agent.capability("hold", max_concurrency=1)
    async def hold(n: int) -> dict[str, int]:
        ran.append(str(n))
        await gate.wait()
        return {"n": n}

    transport = httpx.ASGITransport(app=agent.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:

        async def call(n: int) -> httpx.Response:
            body = {"request_id": f"r{n}", "capability": "hold", "payload": {"n": n}}
            return await http.post("/reach", json=body, headers={"Idempotency-Key": f"k{n}"})

        first, second = asyncio.create_task(call(0)), asyncio.create_task(call(1))
        async with asyncio.timeout(10):
            while not ran:
                await asyncio.sleep(0.01)
        refused = await asyncio.gather(call(2), call(3))
        gate.set()
        answered = await asyncio.gather(first, second)
        again = await call(2)
    for reply in refused:
        assert reply.status_code == 503 and "retry-after" in reply.headers
        assert reply.json()["error"]["type"] == "rate_limited" and "not executed" in reply.json()["error"]["message"]
    assert [reply.status_code for reply in answered] == [200, 200]
    assert again.status_code == 200 and again.json()["data"] == {"n": 2} and ran == ["0", "1", "2"]


def executions(log: Path) -> list[tuple[float, int]]:
    """Each completed execution: when (wall clock) and how many ran at once as it finished."""
    return [(float(at), int(running)) for at, running in (line.split() for line in log.read_text().splitlines())]


@pytest.mark.parametrize(
    ("hop", "declared"),
    [("direct", True), ("direct", False), ("gateway", True)],
    ids=["direct-declared", "direct-undeclared", "gateway-declared"],
)
async def test_ten_times_capacity_keeps_goodput_and_opens_no_breaker(
    hop: str, declared: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """10x overload of a 30/s agent: goodput >= 95 % of capacity, only overload sheds, no breaker opens, and
    service is normal one second after the overload ends."""
    caplog.set_level(logging.INFO, logger="reach_plugins.attempts")
    port, log = free_port(), tmp_path / "executions.log"
    agent = spawn([AGENT, str(port), str(log), str(LIMIT), str(WORK)], tmp_path / "agent.err")
    processes = [agent]
    try:
        capability: dict[str, object] = {"name": "query_order"}
        if declared:
            capability["max_concurrency"] = LIMIT
        spec = {"endpoints": [f"http://127.0.0.1:{port}"], "capabilities": [capability]}
        config = write_config(tmp_path / "agents.yaml", {"orders": spec}, demo_tenants())
        await wait_listening(port, startup_seconds())
        transport = None
        if hop == "gateway":
            gateway_port = free_port()
            command = [GATEWAY, "gateway", "--config", str(config), "--host", "127.0.0.1", "--port", str(gateway_port)]
            processes.append(spawn(command, tmp_path / "gateway.err"))
            await wait_listening(gateway_port, startup_seconds())
            transport = GatewayTransport(f"http://127.0.0.1:{gateway_port}", token=TOKENS["DEMO_TOKEN"])
        async with asyncio.timeout(120), ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client:
            load = Load(client)
            await load.offer(NORMAL, 1.0)
            wall_start, start = time.time(), time.monotonic()
            await load.offer(OVERLOAD, OVER_FOR)
            wall_end, end = time.time(), time.monotonic()
            await load.offer(NORMAL, 2.5)
            await asyncio.gather(*load.tasks)
            assert client.pipeline.is_available("orders", "orders-0") or hop == "gateway"
    finally:
        for process in processes:
            process.kill()
            process.wait()
    ran = executions(log)
    done = sum(1 for at, _ in ran if wall_start + 1.0 <= at <= wall_end)
    most = max(running for _, running in ran)
    floor = 0.95 * CAPACITY * (wall_end - wall_start - 1.0) - LIMIT
    outcomes = Counter(outcome for _, _, outcome in load.calls)
    late = Counter(outcome for began, _, outcome in load.calls if began >= end + 1.0)
    opened = [r.getMessage() for r in caplog.records if "-> open" in r.getMessage()]
    if hop == "gateway":
        opened += [line for line in (tmp_path / "gateway.err").read_text().splitlines() if "-> open" in line]
    goodput = done / (wall_end - wall_start - 1.0)
    print(f"{hop} declared={declared}: goodput {goodput:.1f}/s of {CAPACITY:g} ({done} >= {floor:.0f}); {outcomes}")
    assert most <= LIMIT, f"the agent ran {most} calls at once; it declares max_concurrency={LIMIT}"
    assert done >= floor, f"goodput {goodput:.1f}/s is under 95 % of {CAPACITY:g}/s"
    assert set(outcomes) - {"success"} <= SHED, outcomes
    assert not opened, opened
    assert late and set(late) == {"success"}, late
    assert start < end
