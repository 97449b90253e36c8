"""The issue's figure, with real processes: 2 gateway workers and 2 direct clients share one 100 req/s tenant quota.

Four load processes (two direct ``ReachClient``s, two HTTP callers of a
``reach gateway --workers 2``) offer 60 req/s each (240/s in all) to tenant
``demo`` for the same 8 s; one Redis holds the quota. GCRA admits at most
``rate * W + burst`` in any window of ``W`` seconds: every admission falls
between the first request sent and the last answer received (measured over
all four: a loaded machine sends late), so the total stays within that bound.
The steady rate is the agent's executions in the middle 6 s of the schedule
(the burst and the stragglers cut off), within 5 % of 100/s.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hop_support import TOKENS, demo_tenants, free_port, serve_agents, until_true, write_config
from test_credentials_hop import hop

from reach_plugins import ReachClient
from reach_plugins.errors import RateLimited

RATE = 100.0
BURST = 10
DURATION = 8.0
EDGE = 1.0
"""Seconds cut from each end of the schedule for the steady rate: the burst at the start, stragglers at the end."""
OFFERED = 60.0
"""Requests a second each load process sends (open loop: on schedule, whatever the answers)."""
CLI = "from reach_plugins.cli import main; main()"

LOAD = """
import asyncio, json, sys, time
import httpx
from reach_plugins import ReachClient
from reach_plugins.config.loader import load_config
from reach_plugins.errors import RateLimited, ReachError

mode, target, rate, duration, tag = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
counts = {"ok": 0, "limited": 0, "local": 0, "other": 0, "layers": []}

async def main() -> None:
    if mode == "direct":
        client = ReachClient(f"file://{target}", tenant="demo", quotas=load_config(target).quotas)
        assert (await client.reach("query_order", {"order_id": "warm"}, tenant="acme")).ok

        async def one(i: int) -> None:
            try:
                answer = await client.reach("query_order", {"order_id": f"{tag}-{i}"}, timeout_ms=5000)
                counts["ok" if answer.ok else "other"] += 1
            except RateLimited as exc:
                if exc.layer is None:  # this process's own pool to the agent was full (a loaded machine)
                    counts["local"] += 1
                    return
                counts["limited"] += 1
                counts["layers"].append(exc.layer)
            except ReachError:
                counts["other"] += 1
    else:
        client = httpx.AsyncClient(limits=httpx.Limits(max_connections=16), timeout=10.0)
        warm = {"capability": "query_order", "payload": {"order_id": "warm"}}
        assert (await client.post(target, json=warm, headers={"Authorization": "Bearer tok-acme"})).status_code == 200

        async def one(i: int) -> None:
            body = {"capability": "query_order", "payload": {"order_id": f"{tag}-{i}"}}
            try:
                answer = await client.post(target, json=body, headers={"Authorization": "Bearer tok-demo"})
            except httpx.HTTPError:
                counts["other"] += 1
                return
            words = answer.json()["error"]["message"].split() if answer.status_code == 429 else []
            if words[:3] == ["the", "tenant", "quota"] or words[:3] == ["the", "global", "quota"]:
                counts["limited"] += 1
                counts["layers"].append(words[1])
            elif words:
                counts["local"] += 1
            else:
                counts["ok" if answer.status_code == 200 else "other"] += 1
    print("ready", flush=True)
    start = float(sys.stdin.readline())
    tasks = []
    counts["first"] = time.time()
    for i in range(int(rate * duration)):
        delay = start + i / rate - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    counts["last"] = time.time()
    counts["layers"] = sorted(set(counts["layers"]))
    print(json.dumps(counts), flush=True)
    await client.aclose()

asyncio.run(main())
"""


async def line_of(process: subprocess.Popen[str], within: float) -> str:
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), within)
    assert line, f"load process {process.args!r} exited with {process.poll()} before answering"
    return line.strip()


async def sample(executed: list[Any], samples: list[tuple[float, int]], until: float) -> None:
    """Record (time, executions so far) every 20 ms until ``until``: when the agent ran each admitted call."""
    while time.time() < until:
        samples.append((time.time(), len(executed)))
        await asyncio.sleep(0.02)


def steady_rate(samples: list[tuple[float, int]], since: float, until: float) -> float:
    """Executions a second between the samples nearest ``since`` and ``until``."""
    first = min(samples, key=lambda one: abs(one[0] - since))
    last = min(samples, key=lambda one: abs(one[0] - until))
    return (last[1] - first[1]) / (last[0] - first[0])


async def gateway_up(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{url}/healthz", timeout=2.0)).status_code == 200
    except httpx.TransportError:
        return False


async def test_two_gateway_workers_and_two_clients_share_a_tenant_quota(tmp_path: Path, redis_url: str) -> None:
    """Offered 240 req/s by four processes (2 direct clients, 2 callers of a 2-worker gateway), tenant demo is
    admitted 100 req/s over the fleet: within GCRA's bound above and 5 % below; every refusal names the tenant."""
    store = f"{redis_url}?prefix=quota-fleet-{uuid.uuid4().hex[:8]}:"
    env = {**os.environ, **TOKENS}
    processes: list[subprocess.Popen[Any]] = []
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        doc = yaml.safe_load(config.read_text())
        doc["quotas"] = {"store": store, "tenants": {"demo": {"rate": RATE, "burst": BURST}}}
        config.write_text(yaml.safe_dump(doc))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        gateway = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port)]
        gateway += ["--workers", "2", "--dedup-store", store]
        try:
            processes.append(subprocess.Popen(gateway, env=env))

            async def up() -> bool:
                return await gateway_up(url)

            await until_true(up, within=60.0)
            loads = [("direct", str(config)), ("direct", str(config))]
            loads += [("gateway", f"{url}/v1/reach"), ("gateway", f"{url}/v1/reach")]
            callers = [
                subprocess.Popen(
                    [sys.executable, "-c", LOAD, mode, target, str(OFFERED), str(DURATION), f"p{n}"],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for n, (mode, target) in enumerate(loads)
            ]
            processes += callers
            for caller in callers:
                assert await line_of(caller, 60.0) == "ready"
            before = agents[0].count("query_order")
            start = time.time() + 1.0
            samples: list[tuple[float, int]] = []
            sampler = asyncio.create_task(sample(agents[0].executed, samples, start + DURATION + 2 * EDGE))
            for caller in callers:
                assert caller.stdin is not None
                caller.stdin.write(f"{start}\n")
                caller.stdin.flush()
            results = [json.loads(await line_of(caller, DURATION + 60.0)) for caller in callers]
            await sampler
        finally:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        executed = agents[0].count("query_order") - before
    admitted = sum(result["ok"] for result in results)
    window = max(result["last"] for result in results) - min(result["first"] for result in results)
    rate = steady_rate(samples, start + EDGE, start + DURATION - EDGE)
    shares = [(result["ok"], result["local"]) for result in results]
    print(
        f"\nadmitted {rate:.1f} req/s of a {RATE:g} req/s quota (the agent's executions in the steady "
        f"{DURATION - 2 * EDGE:g}s); {admitted} admitted in all over {window:.2f}s; (admitted, shed locally) per "
        f"process {shares}"
    )
    assert all(result["other"] == 0 for result in results), results
    assert sum(result["local"] for result in results) <= 0.05 * admitted, "the machine is too loaded to measure"
    assert all(result["ok"] > 0 for result in results), "a process was starved"
    assert {layer for result in results for layer in result["layers"]} == {"tenant"}
    assert executed == admitted
    assert admitted <= RATE * window + BURST
    assert abs(rate - RATE) <= 0.05 * RATE


@pytest.mark.parametrize("kind", ["gateway", "node"])
async def test_a_hop_refuses_past_the_tenant_quota_naming_the_layer(tmp_path: Path, kind: str) -> None:
    """Behind a real ``reach gateway`` or ``reach node`` with a burst-2 tenant quota, the caller's third call is
    refused as RateLimited naming the tenant layer, with retry_after, over HTTP and gRPC alike."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        doc = yaml.safe_load(config.read_text())
        doc["quotas"] = {"tenants": {"demo": {"rate": 0.1, "burst": 2}}}
        config.write_text(yaml.safe_dump(doc))
        async with hop(kind, config, TOKENS) as transport, ReachClient(str(config), transport, tenant="demo") as client:
            first = await client.reach("query_order", {"order_id": "1"}, timeout_ms=5000)
            second = await client.reach("query_order", {"order_id": "2"}, timeout_ms=5000)
            with pytest.raises(RateLimited) as refused:
                await client.reach("query_order", {"order_id": "3"}, timeout_ms=5000)
        assert first.ok and second.ok and agents[0].count("query_order") == 2
    assert refused.value.layer == "tenant" and "quotas.tenants.demo" in refused.value.message
    assert refused.value.retry_after is not None and 5.0 < refused.value.retry_after <= 10.0


@pytest.mark.parametrize("kind", ["gateway", "node"])
async def test_a_hop_makes_an_online_caller_wait_for_the_quota(tmp_path: Path, kind: str) -> None:
    """Behind a real ``reach gateway`` or ``reach node``, a 10 req/s burst-2 tenant with ``waits: {online: 500ms}``:
    four calls in a row all pass, the last two after waiting their turn (the four span at least 0.2 s)."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        doc = yaml.safe_load(config.read_text())
        doc["quotas"] = {"tenants": {"demo": {"rate": 10, "burst": 2}}, "waits": {"online": "500ms"}}
        config.write_text(yaml.safe_dump(doc))
        async with hop(kind, config, TOKENS) as transport, ReachClient(str(config), transport, tenant="demo") as client:
            start = time.monotonic()
            answers = [await client.reach("query_order", {"order_id": str(n)}, timeout_ms=5000) for n in range(4)]
            elapsed = time.monotonic() - start
        assert all(answer.ok for answer in answers) and agents[0].count("query_order") == 4
    assert elapsed >= 0.2 - 0.01
