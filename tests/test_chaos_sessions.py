"""One pin per conversation across processes: two client processes sharing Redis agree on every session.

Each process routes the same 1,000 conversations at once (rendezvous hashing
with bounded load, counted per process). With the session store in Redis the
first pick written wins and the other process adopts it, so both send every
conversation to the same instance, and keep doing so.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from reach_plugins import ReachClient
from reach_plugins.model import AgentDescriptor, Capability
from reach_plugins.registry.memory import MemoryRegistry
from reach_plugins.routing.affinity import Rendezvous
from reach_plugins.routing.sharedpins import agree_on_pin
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.sessions import MemorySessions, session_key
from reach_plugins.transport import MockTransport, Reply

SESSIONS = 1000

PRIVATE = 300
"""Conversations each process also serves on its own first, all hashed to one instance (a different one each)."""

CLIENT = """
import asyncio, json, sys
from reach_plugins import ReachClient
from reach_plugins.routing.affinity import Rendezvous
from reach_plugins.transport import MockTransport, Reply

registry, store, shared, private, hot = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
CONCURRENCY = 64  # calls in flight per process

async def main() -> None:
    transport = MockTransport(lambda call: Reply(status="success", data=call.instance.instance_id))
    client = ReachClient(registry=registry, transport=transport, sessions=store)
    keys = sorted(("orders", i) for i in client.registry.instances("orders"))
    hrw, tag = Rendezvous(), f"own-{hot}"
    own = [s for s in (f"{tag}-{n}" for n in range(50 * private)) if hrw.scores(s, keys)[0][1] == keys[hot]][:private]
    calls = asyncio.Semaphore(CONCURRENCY)

    async def reach(session_id: str) -> str:
        async with calls:
            return (await client.reach("query_order", {}, session_id=session_id)).data

    await asyncio.gather(*(reach(s) for s in own))
    print("ready", flush=True)
    sys.stdin.readline()
    ids = [f"conversation-{n}" for n in range(shared)]
    rounds = []
    for _ in range(2):
        rounds.append(dict(zip(ids, await asyncio.gather(*(reach(s) for s in ids)))))
    active = {i: n for (_, i), n in client.router.sessions.active.items()}
    print(json.dumps({"rounds": rounds, "active": active}), flush=True)
    await client.aclose()

asyncio.run(main())
"""


@pytest.fixture
def clients() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


async def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), timeout)
    assert line, f"client process exited with {process.wait()} before answering"
    return line.strip()


def agents_file(tmp_path: Path) -> Path:
    path = tmp_path / "agents.yaml"
    endpoints = "\n".join(f"      - http://127.0.0.1:{port}" for port in (9101, 9102, 9103))
    path.write_text(f"agents:\n  - name: orders\n    capabilities: [query_order]\n    endpoints:\n{endpoints}\n")
    return path


async def test_two_processes_pin_every_conversation_alike(
    redis_url: str, tmp_path: Path, clients: list[subprocess.Popen[str]]
) -> None:
    """Two processes with different other traffic, the same 1,000 sessions at once: 100 % agree, bounded load holds."""
    store = f"{redis_url}?prefix=reach-pins-{uuid.uuid4().hex}:"
    registry = f"file://{agents_file(tmp_path)}"
    for hot in (0, 1):
        command = [sys.executable, "-c", CLIENT, registry, store, str(SESSIONS), str(PRIVATE), str(hot)]
        clients.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    async with asyncio.timeout(120):
        for process in clients:
            assert await read_line(process, 60) == "ready"
        for process in clients:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        a, b = [json.loads(await read_line(p, 60)) for p in clients]
    (a_first, a_second), (b_first, b_second) = a["rounds"], b["rounds"]
    disagree = [s for s in a_first if a_first[s] != b_first[s]]
    assert disagree == [], f"{len(disagree)} of {SESSIONS} conversations pinned differently"
    assert a_second == a_first and b_second == b_first
    for active in (a["active"], b["active"]):
        cap = math.ceil(Rendezvous().bounded_load * (SESSIONS + PRIVATE + 1) / len(active))
        assert max(active.values()) <= cap, (active, cap)


async def test_a_stored_pin_that_cannot_serve_here_is_replaced_once() -> None:
    """A pin to an instance gone from this process's view is replaced by the local pick; others then adopt it."""
    store = MemorySessions(budget=DEFAULT_BUDGET)
    await store.claim_pin(session_key(None, "s-1"), "orders", "orders-gone")
    registry = two_instances()
    client = ReachClient(registry, MockTransport(lambda call: Reply(status="success", data=call.instance.instance_id)))
    request = client.request("query_order", {}, session_id="s-1")
    await agree_on_pin(client.router, store, request)
    replaced = await store.claim_pin(session_key(None, "s-1"), "orders", "anything")
    assert replaced != "orders-gone"
    assert (await client.pipeline.run(request)).data == replaced
    await client.aclose()


def two_instances() -> MemoryRegistry:
    registry = MemoryRegistry()
    endpoints = ["http://127.0.0.1:9101", "http://127.0.0.1:9102"]
    registry.put_agent(
        AgentDescriptor(name="orders", capabilities=[Capability(name="query_order")], endpoints=endpoints)
    )
    return registry
