"""Short agent faults stay short: real HTTP agents that crash or answer 503 for a while, real timing.

* One of three agent processes is killed (SIGKILL) under 50 calls a second
  from two clients: no call fails, two healthy instances were always there.
* Every agent answers 503 for 3 s (or 20 s): the breakers open, then probe
  after 5 s (doubling on each failed probe), so calls succeed again within
  6 s (25 s) of the agents' recovery, and the storm is not multiplied.
"""

from __future__ import annotations

import asyncio
import math
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
from aiohttp import web
from servers import free_port, startup_seconds

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError

KILLED_FOR = 33.0
"""Seconds of calls after the kill: past the first release's 30 s open time, so probes of the dead instance happen."""

AGENT = """
import asyncio, sys
from reach_plugins.agent import ReachAgent, serve

agent = ReachAgent("orders")

@agent.capability("query_order")
async def query_order(n: int) -> dict:
    await asyncio.sleep(0.05)  # some work, so calls are in flight when the process is killed
    return {"n": n}

serve(agent, "127.0.0.1", int(sys.argv[1]), loop="asyncio", log_level="warning")
"""


def agents_yaml(path: Path, ports: list[int]) -> str:
    endpoints = "".join(f"      - http://127.0.0.1:{port}\n" for port in ports)
    path.write_text(f"agents:\n  - name: orders\n    capabilities: [query_order]\n    endpoints:\n{endpoints}")
    return f"file://{path}"


@pytest.fixture
def agent_processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


async def wait_listening(port: int, within: float) -> None:
    end = time.monotonic() + within
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            assert time.monotonic() < end, f"nothing listens on {port} after {within}s"
            await asyncio.sleep(0.05)


@dataclass
class Calls:
    """Outcomes of calls: (monotonic time it ended, success, error type), and when each started."""

    ended: list[tuple[float, bool, str]] = field(default_factory=list)
    started: list[float] = field(default_factory=list)

    async def one(self, client: ReachClient, n: int) -> None:
        self.started.append(time.monotonic())
        try:
            response = await client.reach("query_order", {"n": n}, timeout_ms=5_000)
            self.ended.append((time.monotonic(), response.ok, response.error.type if response.error else ""))
        except ReachError as exc:
            self.ended.append((time.monotonic(), False, type(exc).__name__))

    def settled(self, since: float, margin: float) -> bool:
        """Whether a call succeeded after ``since``, ``margin`` seconds ago or more (enough to see relapses)."""
        return any(ok and since <= t <= time.monotonic() - margin for t, ok, _ in self.ended)

    async def load(
        self, client: ReachClient, rate: float, seconds: float, *, stop: Callable[[], bool] = lambda: False
    ) -> None:
        """Start ``rate`` calls a second for ``seconds`` (or until ``stop()``), then wait for them all."""
        tasks: list[asyncio.Task[None]] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop():
            tasks.append(asyncio.create_task(self.one(client, len(tasks))))
            await asyncio.sleep(1 / rate)
        await asyncio.gather(*tasks)


async def test_killing_one_of_three_instances_fails_no_call(
    tmp_path: Path, agent_processes: list[subprocess.Popen[bytes]]
) -> None:
    """kill -9 of one of three agent processes under 50 calls/s from two clients, 33 s on: 0 failed calls.

    Long enough for the dead instance's breaker to be probed (half-open) several times: each probe is refused
    and must cost no call (the first release failed calls there, with its 30 s open and a drained budget).
    """
    ports = [free_port() for _ in range(3)]
    agent_processes.extend(subprocess.Popen([sys.executable, "-c", AGENT, str(port)]) for port in ports)
    registry = agents_yaml(tmp_path / "agents.yaml", ports)
    calls = Calls()
    async with asyncio.timeout(KILLED_FOR + 40):
        for port in ports:
            await wait_listening(port, startup_seconds())
        async with ReachClient(registry) as first, ReachClient(registry) as second:
            loads = [asyncio.create_task(calls.load(client, 25.0, KILLED_FOR + 2.0)) for client in (first, second)]
            await asyncio.sleep(2.0)
            agent_processes[1].send_signal(signal.SIGKILL)
            await asyncio.gather(*loads)
    failures = Counter(kind for _, ok, kind in calls.ended if not ok)
    assert len(calls.ended) >= 25 * KILLED_FOR
    assert failures == Counter(), f"{sum(failures.values())} of {len(calls.ended)} calls failed"


@dataclass
class Storm:
    """Three raw reach agents that answer 503 while the storm lasts; counts what reaches them."""

    until: float = 0.0
    received: int = 0
    runners: list[web.AppRunner] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    async def reach(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received += 1
        if time.monotonic() < self.until:
            return web.json_response({"status": "fail", "error": {"type": "transient", "message": "storm"}}, status=503)
        return web.json_response({"request_id": body["request_id"], "status": "success", "data": {"ok": True}})

    async def start(self) -> None:
        for _ in range(3):
            app = web.Application()
            app.router.add_post("/reach", self.reach)
            runner = web.AppRunner(app)
            await runner.setup()
            port = free_port()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)
            self.ports.append(port)


@pytest.fixture
async def storm() -> AsyncIterator[Storm]:
    agents = Storm()
    await agents.start()
    yield agents
    for runner in agents.runners:
        await runner.cleanup()


@pytest.mark.parametrize(("length", "back_within"), [(3.0, 6.0), (20.0, 25.0)])
async def test_a_503_storm_ends_soon_after_the_agents_recover(
    length: float, back_within: float, storm: Storm, tmp_path: Path
) -> None:
    """Every agent 503 for 3 s (20 s) at 30 calls/s: calls succeed again within 6 s (25 s) of recovery."""
    registry = agents_yaml(tmp_path / "agents.yaml", storm.ports)
    calls = Calls()
    async with asyncio.timeout(length + 60), ReachClient(registry) as client:
        await calls.load(client, 30.0, 1.0)
        began, received = time.monotonic(), storm.received
        storm.until = began + length
        settled = partial(calls.settled, began + length, 3.0)
        load = asyncio.create_task(calls.load(client, 30.0, length + back_within + 4.0, stop=settled))
        await asyncio.sleep(length)
        reached = storm.received - received
        await load
    recovered = storm.until
    during = reached / sum(1 for t in calls.started if began <= t < recovered)
    first = min((t for t, ok, _ in calls.ended if ok and t >= recovered), default=math.inf) - recovered
    late = Counter(kind for t, ok, kind in calls.ended if not ok and t > recovered + back_within)
    print(f"storm {length:g}s: first success {first:.2f}s after recovery; {during:.2f} agent requests per call")
    assert first <= back_within
    assert late == Counter()
    assert during <= 1.2, "the storm is not multiplied by retries"
