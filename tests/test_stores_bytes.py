"""Stores bounded by bytes, measured where it matters: the resident memory of a real gateway and a real agent.

Keyed calls with 0.9 MB replies (1,100 in the issue, :data:`CALLS` here) go through a real gateway process
(uvicorn) to a real agent process, and as many A2A messages with 0.9 MB results go to the agent;
every reply is kept by some store (the gateway's dedup claims, the agent's idempotency store, the agent's A2A
task table). Each store holds at most its :data:`~reach_plugins.stores.budget.DEFAULT_BUDGET` (64 MiB), so a
process grows by that and its working set, never by what went through it (today's main: the A2A table kept
1,024 tasks, about 0.9 GiB).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from servers import free_port, wait_until

from reach_plugins import ReachClient
from reach_plugins.agent import ReachAgent
from reach_plugins.security.source import default_issuer
from reach_plugins.stores.budget import DEFAULT_BUDGET, MIB, Budget
from reach_plugins.stores.dedup import MemoryDedupStore
from reach_plugins.wire.headers import HEADER_TOKEN
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport

pytestmark = pytest.mark.integration

REPLY = 900_000
"""Bytes of each reply."""
CALLS = int(os.environ.get("REACH_TEST_BYTES_CALLS", "400"))
"""Calls per scenario: 400 (360 MB through, over twice what the bound allows) keeps CI short; the issue's figure
is 1,100 (``REACH_TEST_BYTES_CALLS=1100``)."""
CONCURRENCY = 4
TOKEN = "tok-bytes"
WORKING_SET = 48 * MIB + CONCURRENCY * 8 * REPLY
"""What a process may add besides its stores' budget: the allocator's arenas and caches (measured 20-40 MiB on an
idle-then-busy uvicorn process) plus, per call in flight, a handful of copies of its reply (string, JSON, bytes)."""

AGENT = """
import sys
from reach_plugins.agent import ReachAgent, serve

agent = ReachAgent("big")

@agent.capability("blob", description="A large reply")
def blob(n: int) -> dict:
    return {"n": n, "blob": "x" * int(sys.argv[2])}

serve(agent, "127.0.0.1", int(sys.argv[1]), log_level="warning")
"""

GATEWAY = """
import sys
import uvicorn
from reach_plugins.gateway.serve import create_app
from reach_plugins.server.uvicorn import uvicorn_config

port, config = sys.argv[1:3]
app = create_app(config, environ={"BYTES_TOKEN": "tok-bytes"}, store="memory://")
uvicorn.Server(uvicorn_config(app, host="127.0.0.1", port=int(port), log_level="warning")).run()
"""


def rss(process: subprocess.Popen[bytes]) -> int:
    """Resident bytes of ``process`` (``VmRSS`` in /proc)."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {process.pid}")


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=0.5).status_code < 500
    except httpx.HTTPError:
        return False


def spawn(code: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, subprocess.Popen[bytes], str, Path]]:
    """(agent process, its URL, gateway process, its URL, the registry file both are described in)."""
    agent_port, gateway_port = free_port(), free_port()
    agent_url, gateway_url = f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{gateway_port}"
    config = tmp_path / "reach.yaml"
    capability = {"name": "blob", "idempotency_key": "${params.n}"}
    doc = {
        "agents": [{"name": "big", "endpoints": [agent_url], "capabilities": [capability]}],
        "tenants": {"bytes": {"token_env": "BYTES_TOKEN", "agents": ["big"], "networks": ["127.0.0.0/8"]}},
    }
    config.write_text(yaml.safe_dump(doc))
    agent = spawn(AGENT, str(agent_port), str(REPLY))
    gateway = spawn(GATEWAY, str(gateway_port), str(config))
    try:
        for process, url in ((agent, agent_url), (gateway, gateway_url)):
            wait_until(lambda u=url, p=process: answers(u) or p.poll() is not None, 60, f"{url} start")
            assert process.poll() is None, f"{url} exited with {process.returncode}"
        yield agent, agent_url, gateway, gateway_url, config
    finally:
        for process in (agent, gateway):
            process.kill()
            process.wait()


async def keyed_calls(client: ReachClient, prefix: str) -> None:
    """:data:`CALLS` keyed calls (each its own key), :data:`CONCURRENCY` at a time; every one succeeds."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(n: int) -> None:
        async with gate:
            response = await client.reach("blob", {"n": n}, idempotency_key=f"{prefix}-{n}", timeout_ms=30_000)
            assert response.ok and len(response.data["blob"]) == REPLY

    await asyncio.gather(*(one(n) for n in range(CALLS)))


def bound(grown: int, what: str) -> None:
    print(f"\n{what}: grew {grown / MIB:.0f} MiB over {CALLS} replies of {REPLY / 1e6:.1f} MB")
    assert grown <= DEFAULT_BUDGET.max_bytes + WORKING_SET, f"{what} grew {grown / MIB:.0f} MiB"


async def test_keyed_calls_through_a_gateway_grow_neither_process_past_its_budget(
    served: tuple[subprocess.Popen[bytes], str, subprocess.Popen[bytes], str, Path],
) -> None:
    """Keyed 0.9 MB replies through a real gateway: gateway and agent each grow by at most budget + working set."""
    agent, _, gateway, gateway_url, config = served
    client = ReachClient(registry=str(config), transport=GatewayTransport(gateway_url, token=TOKEN), tenant="bytes")
    agent_before, gateway_before = rss(agent), rss(gateway)
    await keyed_calls(client, uuid.uuid4().hex[:8])
    await client.aclose()
    bound(rss(gateway) - gateway_before, "gateway")
    bound(rss(agent) - agent_before, "agent behind the gateway")


async def test_keyed_calls_straight_to_an_agent_grow_it_by_its_budget_at_most(
    served: tuple[subprocess.Popen[bytes], str, subprocess.Popen[bytes], str, Path],
) -> None:
    """Keyed 0.9 MB replies sent straight to a real agent: it grows by at most budget + working set."""
    agent, _, _, _, config = served
    client = ReachClient(registry=str(config), transport=DirectTransport(), tenant="bytes")
    before = rss(agent)
    await keyed_calls(client, uuid.uuid4().hex[:8])
    await client.aclose()
    bound(rss(agent) - before, "agent")


async def test_a2a_messages_grow_an_agent_by_its_task_budget_at_most(
    served: tuple[subprocess.Popen[bytes], str, subprocess.Popen[bytes], str, Path],
) -> None:
    """A2A SendMessage calls of one tenant, 0.9 MB results: the task table keeps at most its budget. (Token-less
    messages are refused now that agents verify by default; the table is bounded for the callers it does serve.)"""
    agent, agent_url, _, _, _ = served
    before = rss(agent)
    gate = asyncio.Semaphore(CONCURRENCY)
    token = default_issuer().issue(subject="bytes", audience="big", tenant="bytes").token
    async with httpx.AsyncClient(timeout=30, headers={HEADER_TOKEN: token}) as http:

        async def one(n: int) -> None:
            message = {
                "messageId": f"m-{n}",
                "role": "ROLE_USER",
                "parts": [{"data": {"n": n}}],
                "metadata": {"reach.capability": "blob"},
            }
            body = {"jsonrpc": "2.0", "id": n, "method": "SendMessage", "params": {"message": message}}
            async with gate:
                answer = await http.post(f"{agent_url}/a2a", json=body, headers={"A2A-Version": "1.0"})
            assert answer.status_code == 200 and "result" in answer.json(), answer.text[:300]

        await asyncio.gather(*(one(n) for n in range(CALLS)))
    bound(rss(agent) - before, "agent answering A2A")


async def test_a_reply_over_the_agents_byte_bound_is_answered_then_never_replayed_nor_run_again() -> None:
    """A keyed reply larger than the agent's store may hold: its caller gets it; the same key again is
    ``outcome_unknown`` (not kept, so not replayable), and the handler ran once."""
    executed: list[int] = []
    agent = ReachAgent(
        "big", idempotency=MemoryDedupStore(budget=Budget(max_entries=10, max_bytes=4096)), tokens="open"
    )

    @agent.capability("blob")
    def blob(n: int) -> dict[str, Any]:
        executed.append(n)
        return {"n": n, "blob": "x" * 10_000}

    request = {"request_id": "r-1", "capability": "blob", "payload": {"n": 1}}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=agent.app), base_url="http://127.0.0.1") as http:
        first = await http.post("/reach", json=request, headers={"Idempotency-Key": "k-1"})
        again = await http.post("/reach", json=request, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 200 and len(first.json()["data"]["blob"]) == 10_000
    assert again.json()["error"]["type"] == "outcome_unknown" and "too large" in again.json()["error"]["message"]
    assert executed == [1]
