"""A keyed call whose reply is too large for the CALLER's dedup store (a gateway's, a client's) still succeeds, and a
replay of its key never runs it again; the agent's own idempotency store has a byte budget of its choosing.

The caller's store keeps the key ``unknown`` where it ran (no reply, only the payload's digest), so a replay is sent
only there and the agent's key check answers it: its stored reply, or ``outcome_unknown`` when the reply was too
large for the agent's budget too. Executions are counted at the agent, served by a real uvicorn.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hop_support import TOKENS, write_config

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import ConfigError
from reach_plugins.gateway.serve import create_app
from reach_plugins.model import ReachRequest
from reach_plugins.stores.budget import Budget
from reach_plugins.stores.dedup import DedupStore, MemoryDedupStore, store_key
from transports.direct import DirectTransport

pytestmark = pytest.mark.integration

REPLY = 10_000
"""Bytes of the reply: over :data:`SMALL`'s byte bound."""
SMALL = Budget(max_entries=100, max_bytes=4096)
DEMO = {"Authorization": "Bearer tok-demo"}


class Served:
    """An agent ``big`` (its executions counted) behind a real gateway whose dedup store is :data:`SMALL`."""

    def __init__(
        self, gateway: BackgroundServer, store: MemoryDedupStore, config: Path, executed: list[int], agent_keeps: bool
    ) -> None:
        self.gateway, self.store, self.config, self.executed = gateway, store, config, executed
        self.agent_keeps = agent_keeps
        """Whether the agent's own idempotency store can hold the reply (then a replay gets it back)."""


def big_agent(executed: list[int], budget: Budget | None, **options: Any) -> ReachAgent:
    agent = ReachAgent("big", idempotency_budget=budget, **options)

    @agent.capability("blob", description="A reply larger than the caller's dedup budget")
    def blob(n: int) -> dict[str, Any]:
        executed.append(n)
        return {"n": n, "blob": "x" * REPLY}

    return agent


@pytest.fixture(params=["agent keeps it", "agent too small"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    """The agent's own store either holds the reply (default budget) or is :data:`SMALL` too."""
    executed: list[int] = []
    budget = None if request.param == "agent keeps it" else SMALL
    with BackgroundServer(big_agent(executed, budget).app) as agent:
        config = write_config(
            tmp_path / "agents.yaml",
            {"big": {"endpoints": [agent.url], "capabilities": ["blob"]}},
            {"demo": {"token_env": "DEMO_TOKEN", "agents": ["big"], "networks": ["127.0.0.0/8"]}},
        )
        store = MemoryDedupStore(budget=SMALL)
        with BackgroundServer(create_app(config, environ=TOKENS, store=store), proxy_headers=False) as gateway:
            yield Served(gateway, store, config, executed, agent_keeps=budget is None)


def replay_is_answered_without_running(world: Served, body: dict[str, Any]) -> None:
    """A replay of a key whose reply the caller could not keep: the agent's kept reply, else ``outcome_unknown``."""
    if world.agent_keeps:
        assert body["status"] == "success" and len(body["data"]["blob"]) == REPLY, body
    else:
        assert body["status"] == "fail" and body["error"]["type"] == "outcome_unknown", body
    assert world.executed == [1]


async def test_through_a_gateway_the_call_succeeds_and_a_replay_never_runs_again(served: Served) -> None:
    """Gateway with a 4 KiB dedup budget, a 10 KB keyed reply: success returned; the same key again, twice,
    is answered without a second execution; the gateway keeps the key as a reply-less marker."""
    request = {"capability": "blob", "payload": {"n": 1}, "idempotency_key": "k-1"}
    async with httpx.AsyncClient(base_url=served.gateway.url, headers=DEMO, timeout=30) as http:
        first = await http.post("/v1/reach", json=request)
        assert first.status_code == 200, first.text
        assert first.json()["status"] == "success" and len(first.json()["data"]["blob"]) == REPLY
        assert served.executed == [1]
        for _ in range(2):
            again = await http.post("/v1/reach", json=request)
            replay_is_answered_without_running(served, again.json())
    key = store_key(ReachRequest(capability="blob", tenant="demo"), "k-1")
    marker = served.store.table.peek(key)
    assert marker is not None and marker.state == "unknown" and marker.result is None
    assert served.store.bytes <= SMALL.max_bytes


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_a_client_whose_store_cannot_keep_the_reply_gets_it_and_a_replay_never_runs_again(
    served: Served, kind: str, request: pytest.FixtureRequest
) -> None:
    """The same with a ReachClient (direct to the agent) whose own dedup store takes 4 KiB: in memory, or the
    shared Redis with ``max_value_bytes=4096``."""
    store: DedupStore | str = MemoryDedupStore(budget=SMALL)
    if kind == "redis":
        redis_url: str = request.getfixturevalue("redis_url")
        store = f"{redis_url}?max_value_bytes={SMALL.max_bytes}&prefix=too-large-{uuid.uuid4().hex[:8]}:"
    client = ReachClient(registry=str(served.config), transport=DirectTransport(), tenant="demo", store=store)
    try:
        first = await client.reach("blob", {"n": 1}, idempotency_key="k-2", timeout_ms=30_000)
        assert first.ok and len(first.data["blob"]) == REPLY
        again = await client.reach("blob", {"n": 1}, idempotency_key="k-2", timeout_ms=30_000)
        replay_is_answered_without_running(served, again.model_dump(mode="json"))
    finally:
        await client.aclose()


def test_an_idempotency_budget_with_a_store_that_brings_its_own_bound_is_refused() -> None:
    """``idempotency_budget`` bounds the memory store; given with a Redis URL it would be ignored, so it is refused."""
    with pytest.raises(ConfigError, match="max_value_bytes"):
        ReachAgent("big", idempotency="redis://127.0.0.1:63790/0", idempotency_budget=SMALL)


async def test_a_committed_result_too_large_for_the_agents_budget_is_answered_not_refused() -> None:
    """A handler's own committed result over the agent's ``idempotency_budget``: the caller gets it (replayed), the
    handler does not run (on main it was refused with EntryTooLarge)."""
    executed: list[int] = []
    committed: list[str] = []

    async def lookup(scope: str) -> dict[str, Any]:
        committed.append(scope)
        return {"n": 1, "blob": "x" * REPLY}

    agent = big_agent(executed, SMALL, tokens="open", committed=lookup)
    request = {"request_id": "r-1", "capability": "blob", "payload": {"n": 1}}
    with BackgroundServer(agent.app) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            answer = await http.post("/reach", json=request, headers={"Idempotency-Key": "k-3"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "success" and len(answer.json()["data"]["blob"]) == REPLY
    assert answer.headers["idempotent-replayed"] == "true"
    assert executed == [] and len(committed) == 1
