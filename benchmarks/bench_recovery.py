"""Recovery from short faults with real processes: how long a fault really costs, and who paid for it.

Three agent processes (raw reach-protocol servers) serve ``query_order``; the
benchmark process runs two clients at 25 calls/s each and injects one fault
per scenario:

* ``kill``   — SIGKILL of one of the three agent processes, directly;
* ``storm``  — every agent answers 503 for 3 s, then 20 s;
* ``gateway`` — through a ``reach gateway`` process killed with SIGKILL and
  started again at once.

For each it prints the time from the fault's end (the gateway answering
again, the agents healthy again) to the first successful call, the time until
calls stay successful, the calls that failed while a healthy agent instance
existed, and the agent requests per call during the fault.

    python benchmarks/bench_recovery.py     # prints the table, writes benchmarks/results/recovery.json
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError
from transports.gateway import GatewayTransport

RATE = 25.0
"""Calls a second from each of the two clients."""
RESULTS = Path(__file__).parent / "results" / "recovery.json"
TOKEN = "bench-token"
CLI = "from reach_plugins.cli import main; main()"

AGENT = """
import os, sys
from aiohttp import web

storm = sys.argv[2]

async def reach(request):
    body = await request.json()
    with open(sys.argv[3], "a") as log:
        log.write("r")
    if os.path.exists(storm):
        return web.json_response({"status": "fail", "error": {"type": "transient", "message": "storm"}}, status=503)
    return web.json_response({"request_id": body["request_id"], "status": "success", "data": {"ok": True}})

app = web.Application()
app.router.add_post("/reach", reach)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def client(registry: str, transport: GatewayTransport | None = None) -> ReachClient:
    """A client of the benchmark's tenant (the config names one, so every call must say which)."""
    return ReachClient(registry, transport, tenant="bench", environ={"BENCH_TOKEN": TOKEN})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def listening(port: int, within: float = 30.0) -> float:
    """Wait until something accepts connections on ``port``; the monotonic time it first did."""
    end = time.monotonic() + within
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return time.monotonic()
        except OSError:
            if time.monotonic() > end:
                raise RuntimeError(f"nothing listens on {port} after {within:g}s") from None
            await asyncio.sleep(0.02)


@dataclass
class Run:
    """The calls of one scenario: (started, ended, ok) each, and the fault's window."""

    calls: list[tuple[float, float, bool]] = field(default_factory=list)
    fault: tuple[float, float] = (0.0, 0.0)

    async def one(self, client: ReachClient, n: int) -> None:
        started = time.monotonic()
        try:
            ok = (await client.reach("query_order", {"n": n}, timeout_ms=5_000)).ok
        except ReachError:
            ok = False
        self.calls.append((started, time.monotonic(), ok))

    async def load(self, clients: list[ReachClient], seconds: float) -> None:
        tasks: list[asyncio.Task[None]] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for client in clients:
                tasks.append(asyncio.create_task(self.one(client, len(tasks))))
            await asyncio.sleep(1 / RATE)
        await asyncio.gather(*tasks)

    def summary(self, received: int, healthy_existed: bool) -> dict[str, Any]:
        start, end = self.fault
        after = sorted((t, ok) for _, t, ok in self.calls if t >= end)
        first = next((t - end for t, ok in after if ok), None)
        last_failure = max((t for t, ok in after if not ok), default=end)
        during = sum(1 for s, _, _ in self.calls if start <= s < end)
        failed = sum(1 for _, _, ok in self.calls if not ok)
        return {
            "calls": len(self.calls),
            "failed": failed,
            "failed_while_healthy_existed": failed if healthy_existed else None,
            "first_success_after_s": first,
            "stable_after_s": last_failure - end,
            "agent_requests_per_call_during_fault": received / during if during else None,
        }


class Agents:
    """Three agent processes, a storm flag file, and a log of requests they received."""

    def __init__(self, workdir: Path) -> None:
        self.storm = workdir / "storm"
        self.log = workdir / "received"
        self.ports = [free_port() for _ in range(3)]
        self.processes = [
            subprocess.Popen([sys.executable, "-c", AGENT, str(port), str(self.storm), str(self.log)])
            for port in self.ports
        ]
        self.config = workdir / "agents.yaml"
        endpoints = "".join(f"      - http://127.0.0.1:{port}\n" for port in self.ports)
        tenants = "tenants:\n  bench:\n    token_env: BENCH_TOKEN\n    agents: '*'\n    networks: [127.0.0.0/8]\n"
        self.config.write_text(
            f"agents:\n  - name: orders\n    capabilities: [query_order]\n    endpoints:\n{endpoints}{tenants}"
        )

    def received(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    async def ready(self) -> None:
        for port in self.ports:
            await listening(port)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


async def kill_one(workdir: Path) -> dict[str, Any]:
    agents = Agents(workdir)
    try:
        await agents.ready()
        run = Run()
        registry = f"file://{agents.config}"
        async with client(registry) as first, client(registry) as second:
            load = asyncio.create_task(run.load([first, second], 10.0))
            await asyncio.sleep(3.0)
            agents.processes[1].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            run.fault = (killed, killed)
            await load
        return run.summary(0, healthy_existed=True)
    finally:
        agents.stop()


async def storm(workdir: Path, length: float) -> dict[str, Any]:
    agents = Agents(workdir)
    try:
        await agents.ready()
        run = Run()
        registry = f"file://{agents.config}"
        async with client(registry) as first, client(registry) as second:
            await run.load([first, second], 1.0)
            load = asyncio.create_task(run.load([first, second], length + 30.0))
            before = agents.received()
            agents.storm.touch()
            began = time.monotonic()
            await asyncio.sleep(length)
            agents.storm.unlink()
            run.fault = (began, time.monotonic())
            received = agents.received() - before
            await load
        return run.summary(received, healthy_existed=False)
    finally:
        agents.stop()


async def gateway_restart(workdir: Path) -> dict[str, Any]:
    agents = Agents(workdir)
    port = free_port()
    command = [sys.executable, "-c", CLI, "gateway", "--config", str(agents.config)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "BENCH_TOKEN": TOKEN}

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    gateway = start()
    try:
        await agents.ready()
        await listening(port)
        run = Run()
        transport = GatewayTransport(f"http://127.0.0.1:{port}", token=TOKEN)
        clients = [client(str(agents.config), transport) for _ in range(2)]
        load = asyncio.create_task(run.load(clients, 16.0))
        await asyncio.sleep(2.0)
        gateway.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        gateway.wait()
        gateway = start()
        run.fault = (killed, await listening(port))
        await load
        for each in clients:
            await each.aclose()
        return run.summary(0, healthy_existed=False)
    finally:
        gateway.kill()
        gateway.wait()
        agents.stop()


def table(results: dict[str, Any]) -> str:
    head = (
        f"{'scenario':34} {'calls':>6} {'failed':>7} {'first ok after':>15} {'stable after':>13} {'agent req/call':>15}"
    )
    lines = [head, "-" * len(head)]
    for name, m in results.items():
        first = "-" if m["first_success_after_s"] is None else f"{m['first_success_after_s']:.2f} s"
        per_call = m["agent_requests_per_call_during_fault"]
        lines.append(
            f"{name:34} {m['calls']:6d} {m['failed']:7d} {first:>15} {m['stable_after_s']:11.2f} s "
            f"{'-' if per_call is None else f'{per_call:.2f}':>15}"
        )
    return "\n".join(lines)


async def run_all() -> dict[str, Any]:
    results: dict[str, Any] = {}
    scenarios = [
        ("kill -9 one of 3 instances", kill_one),
        ("every agent 503 for 3 s", lambda d: storm(d, 3.0)),
        ("every agent 503 for 20 s", lambda d: storm(d, 20.0)),
        ("gateway kill -9, restarted at once", gateway_restart),
    ]
    for name, scenario in scenarios:
        with tempfile.TemporaryDirectory() as workdir:
            results[name] = await scenario(Path(workdir))
    return results


def main() -> int:
    logging.getLogger("reach_plugins").setLevel(logging.CRITICAL)
    results = asyncio.run(run_all())
    print(table(results))
    settings = {"rate_per_client_rps": RATE, "clients": 2, "agents": 3}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"settings": settings, "scenarios": results}, indent=2, sort_keys=True) + "\n")
    print(f"\nwritten to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
