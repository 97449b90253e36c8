"""internal_only under hostile callers: an unknown source is outside, trust survives a node hop, errors say little.

The gateway listens on a unix socket (it cannot see the caller's address)
and on TCP (127.0.0.1, inside tenant demo's networks). It serves
``whoami`` from an internal_only agent itself, and ``query_order``
through a node whose internal_only ``vault`` serves it: the gateway does not
know that agent is internal, so only the carried source can stop an outside
caller there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from hop_support import TOKENS, Agent, serve_agents, write_config

from reach_plugins.agent import BackgroundServer
from reach_plugins.gateway import create_app
from reach_plugins.node import build_node
from reach_plugins.server.uvicorn import uvicorn_config

DEMO = {"Authorization": "Bearer tok-demo", "Content-Type": "application/json"}
ACME = {"Authorization": "Bearer tok-acme", "Content-Type": "application/json"}
TENANTS: dict[str, Any] = {
    "demo": {
        "token_env": "DEMO_TOKEN",
        "agents": ["hop", "local", "orders"],
        "networks": ["127.0.0.0/8"],
        "credentials": {"hop": {"type": "bearer", "value_env": "NODE_DEMO_TOKEN"}},
    },
    "acme": {"token_env": "ACME_TOKEN", "agents": ["orders"], "networks": ["127.0.0.0/8"]},
}
ENV = {**TOKENS, "NODE_DEMO_TOKEN": "tok-node-demo"}
"""The gateway presents tenant demo to the node with a token of the node's own (never the tenant's gateway token)."""


@dataclass
class World:
    tcp: str
    uds: Path
    vault: Agent

    def client(self, *, unix: bool) -> httpx.AsyncClient:
        if unix:
            return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(self.uds)), base_url="http://gateway")
        return httpx.AsyncClient(base_url=self.tcp)

    async def post(self, capability: str, *, unix: bool, headers: dict[str, str] = DEMO) -> httpx.Response:
        async with self.client(unix=unix) as http:
            payload = {"order_id": "V1"} if capability == "query_order" else {}
            return await http.post("/v1/reach", json={"capability": capability, "payload": payload}, headers=headers)


class UnixServer:
    """uvicorn on a unix socket, in a thread."""

    def __init__(self, app: Any, path: Path) -> None:
        self.server = uvicorn.Server(uvicorn_config(app, uds=str(path)))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    with serve_agents(("vault", "v1"), ("orders", "o1"), ("local", "l1")) as (vault, orders, local):
        node_config = write_config(
            tmp_path / "node.yaml",
            {"vault": {"endpoints": [vault.url], "internal_only": True, "capabilities": ["query_order"]}},
            {"demo": {"token_env": "NODE_DEMO_TOKEN", "agents": ["vault"], "networks": ["127.0.0.0/8"]}},
        )
        async with build_node(node_config, environ=ENV) as node:
            config = write_config(
                tmp_path / "gateway.yaml",
                {
                    "hop": {"endpoints": [f"grpc://{node.target}"], "capabilities": ["query_order"]},
                    "local": {"endpoints": [local.url], "internal_only": True, "capabilities": ["whoami"]},
                    "orders": {"endpoints": [orders.url], "capabilities": ["refuse"]},
                },
                TENANTS,
            )
            uds = tmp_path / "gateway.sock"
            unix = UnixServer(create_app(config, environ=ENV), uds)
            try:
                with BackgroundServer(create_app(config, environ=ENV)) as tcp:
                    yield World(tcp.url, uds, vault)
            finally:
                unix.stop()


async def test_an_unknown_source_is_outside(world: World) -> None:
    """Through a unix socket the caller's address is unknown: internal_only is refused (TCP from inside is served)."""
    inside = await world.post("whoami", unix=False)
    unknown = await world.post("whoami", unix=True)
    assert inside.status_code == 200 and inside.json()["status"] == "success"
    assert unknown.status_code == 403
    assert "from outside" in unknown.json()["error"]["message"]


async def test_trust_is_carried_across_a_node_hop(world: World) -> None:
    """An outside caller reaching the node's internal agent through the gateway is refused there, never served."""
    inside = await world.post("query_order", unix=False)
    served = world.vault.count("query_order")
    outside = await world.post("query_order", unix=True)
    assert inside.status_code == 200 and inside.json()["status"] == "success"
    assert outside.status_code != 200 or outside.json()["status"] != "success"
    assert world.vault.count("query_order") == served


@pytest.mark.parametrize("capability", ["whoami", "query_order"])
async def test_a_caller_cannot_vouch_for_itself(world: World, capability: str) -> None:
    """X-Reach-Source from the caller only adds addresses: naming an inside one does not lift an unknown source."""
    before = world.vault.count(capability)
    answer = await world.post(capability, unix=True, headers={**DEMO, "X-Reach-Source": "127.0.0.1"})
    assert answer.status_code != 200 or answer.json()["status"] != "success"
    assert world.vault.count(capability) == before


async def test_a_long_forged_chain_cannot_push_out_the_observed_source(world: World) -> None:
    """Forty forged inside addresses in X-Reach-Source still leave the gateway's own observation in the chain."""
    forged = ",".join(["127.0.0.1"] * 40)
    before = world.vault.count("query_order")
    answer = await world.post("query_order", unix=True, headers={**DEMO, "X-Reach-Source": forged})
    assert answer.status_code != 200 or answer.json()["status"] != "success"
    assert world.vault.count("query_order") == before


async def test_closest_known_names_only_what_the_caller_may_reach(world: World) -> None:
    """A typo gets hints from the caller's own capabilities: acme (orders only) never hears of whoami."""
    demo = await world.post("whoamii", unix=False)
    acme = await world.post("whoamii", unix=False, headers=ACME)
    outside = await world.post("whoamii", unix=True)
    assert (demo.status_code, acme.status_code, outside.status_code) == (404, 404, 404)
    assert "closest known: whoami" in demo.json()["error"]["message"]
    assert "closest known" not in acme.json()["error"]["message"]
    assert "closest known" not in outside.json()["error"]["message"]
