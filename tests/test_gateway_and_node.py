"""ReachClient through a gateway or a node, end to end: one client code, one retry layer, failover, refusals."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hop_support import TOKENS, AgentProcess, demo_tenants, free_port, serve_agents, write_config

from reach_plugins import ReachClient, errors
from reach_plugins.agent import BackgroundServer
from reach_plugins.config.loader import load_config
from reach_plugins.gateway import create_app
from reach_plugins.node import build_node
from reach_plugins.registry import MemoryRegistry
from reach_plugins.transport import Transport
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

FAST_RETRY = {"base_wait": 0.01, "max_wait": 0.02}
Hop = Callable[[Path], AbstractAsyncContextManager[Callable[..., Transport]]]


@asynccontextmanager
async def through_gateway(config: Path) -> AsyncIterator[Callable[..., Transport]]:
    with BackgroundServer(create_app(config, environ=TOKENS), proxy_headers=False) as server:
        yield lambda token=TOKENS["DEMO_TOKEN"]: GatewayTransport(server.url, token=token)


@asynccontextmanager
async def through_node(config: Path) -> AsyncIterator[Callable[..., Transport]]:
    async with build_node(config, environ=TOKENS) as node:
        yield lambda token=TOKENS["DEMO_TOKEN"]: GrpcNodeTransport(node.target, token=token)


@asynccontextmanager
async def direct(config: Path) -> AsyncIterator[Callable[..., Transport]]:
    yield lambda token=None: DirectTransport()


HOPS: dict[str, Hop] = {"gateway": through_gateway, "node": through_node}


async def ask(client: ReachClient) -> tuple[Any, str | None]:
    """The one piece of client code every transport runs."""
    response = await client.reach("query_order", {"order_id": "A1"}, session_id="s-1", timeout_ms=3000)
    return response.raise_for_status().data, response.agent


async def test_one_client_code_three_transports(tmp_path: Path) -> None:
    """The same ReachClient code works with DirectTransport, GatewayTransport and GrpcNodeTransport."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        answers = []
        for hop in (direct, through_gateway, through_node):
            async with (
                hop(config) as transport,
                ReachClient(str(config), transport(), tenant="demo", environ=TOKENS) as client,
            ):
                answers.append(await ask(client))
    assert answers == [({"order_id": "A1", "by": "o1"}, "orders")] * 3
    assert agents[0].count("query_order") == 3


@pytest.mark.parametrize("name", ["gateway", "node"])
async def test_retries_happen_at_one_layer_only(tmp_path: Path, name: str) -> None:
    """During an outage the agent sees exactly max_attempts tries: the hop retries, the client's core does not."""
    with serve_agents(("orders", "o1")) as agents:
        body = {"endpoints": [agents[0].url], "retry": {"max_attempts": 3, **FAST_RETRY}}
        config = write_config(tmp_path / "agents.yaml", {"orders": body}, demo_tenants())
        async with (
            HOPS[name](config) as transport,
            ReachClient(str(config), transport(), tenant="demo", environ=TOKENS) as client,
        ):
            response = await client.reach("outage", timeout_ms=5000)
    assert response.status == "fail" and response.error is not None
    assert agents[0].count("outage") == 3
    assert response.attempts == 3


async def test_direct_client_retries_itself(tmp_path: Path) -> None:
    """Without a hop the client's core is the retry layer, with the same total: max_attempts."""
    with serve_agents(("orders", "o1")) as agents:
        body = {"endpoints": [agents[0].url], "retry": {"max_attempts": 3, **FAST_RETRY}}
        config = write_config(tmp_path / "agents.yaml", {"orders": body}, demo_tenants())
        async with ReachClient(str(config), DirectTransport(), tenant="demo", environ=TOKENS) as client:
            response = await client.reach("outage", timeout_ms=5000)
    assert response.status == "fail"
    assert agents[0].count("outage") == response.attempts == 3


@pytest.mark.parametrize("name", ["gateway", "node"])
async def test_agent_killed_mid_run_fails_over_and_loses_nothing(tmp_path: Path, name: str) -> None:
    """An agent process is SIGKILLed mid-run: every request still succeeds, the survivor serves the rest."""
    processes = [AgentProcess("orders", label, free_port()) for label in ("a", "b")]
    try:
        for process in processes:
            process.wait_ready()
        body = {"endpoints": [p.url for p in processes], "retry": {"max_attempts": 3, **FAST_RETRY}}
        config = write_config(tmp_path / "agents.yaml", {"orders": body}, demo_tenants())
        responses: list[Any] = []

        async def worker(client: ReachClient, number: int) -> None:
            for index in range(6):
                response = await client.reach("query_order", {"order_id": f"{number}-{index}"}, timeout_ms=5000)
                responses.append(response)
                if len(responses) == 12:
                    processes[0].kill()

        async with (
            HOPS[name](config) as transport,
            ReachClient(str(config), transport(), tenant="demo", environ=TOKENS) as client,
        ):
            await asyncio.gather(*(worker(client, number) for number in range(8)))
    finally:
        for process in processes:
            process.kill()
    assert len(responses) == 48
    assert all(response.ok for response in responses), [r.error for r in responses if not r.ok]
    assert {response.data["order_id"] for response in responses} == {f"{n}-{i}" for n in range(8) for i in range(6)}
    assert {response.data["by"] for response in responses[-12:]} == {"b"}
    assert processes[0].executed and processes[1].executed


@pytest.mark.parametrize("name", ["gateway", "node"])
async def test_the_hop_enforces_tenant_rules(tmp_path: Path, name: str) -> None:
    """A client routing without a tenant table is refused by the hop: PermissionDenied, raised as direct would."""
    with serve_agents(("orders", "o1"), ("tickets", "t1")) as agents:
        tickets = {"endpoints": [agents[1].url], "capabilities": ["create_ticket"]}
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url], "tickets": tickets}, demo_tenants())
        registry = MemoryRegistry()
        for agent in load_config(config).agents:
            await registry.register_agent(agent)
        async with (
            HOPS[name](config) as transport,
            ReachClient(registry, transport(TOKENS["ACME_TOKEN"]), tenant="acme") as client,
        ):
            with pytest.raises(errors.PermissionDenied, match="tenant 'acme' may not reach capability 'create_ticket'"):
                await client.reach("create_ticket", {}, timeout_ms=3000)
            allowed = await client.reach("query_order", {"order_id": "ok"}, timeout_ms=3000)
    assert allowed.ok and allowed.data == {"order_id": "ok", "by": "o1"}
