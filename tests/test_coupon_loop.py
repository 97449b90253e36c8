"""The seed's coupon loop (seed 004, 4.1) through a real gateway: two agents reaching each other with fresh ids.

``ops_config`` is unsure why a coupon does not apply and reaches ``orders``; ``orders``, to check the coupon's
order, reaches ``ops_config`` back for the coupon rules. Every reach is a fresh request with a short hop chain,
so the loop guard never fires; the gateway, which sees both directions, must raise the dependency-loop alert
within the window (a 3 s window in this test, 2 reaches a second each way), list the pair at ``GET /v1/loops``
and in ``reach agents --loops``, and count it on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hop_support import TOKENS, demo_tenants, write_config
from typer.testing import CliRunner

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.cli import app as cli
from reach_plugins.gateway import create_app
from reach_plugins.registry import Registry, open_registry
from reach_plugins.security.context import current_hops
from transports.gateway import GatewayTransport

WINDOW = 3.0
THRESHOLD = 2.0
DEMO = {"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"}


class Loop:
    """The two agents and the gateway between them; each agent reaches the other through the gateway."""

    def __init__(self) -> None:
        self.config: Path | None = None
        self.registry: Registry | None = None
        self.gateway_url = ""

    async def reach(self, capability: str, coupon: str) -> dict[str, Any]:
        """A fresh reach through the gateway from inside a handler (its hop chain: the agent serving now)."""
        assert self.registry is not None
        transport = GatewayTransport(self.gateway_url, token=TOKENS["DEMO_TOKEN"])
        async with ReachClient(self.registry, transport, tenant="demo", environ=TOKENS) as client:
            answer = await client.reach(capability, {"coupon": coupon}, hops=current_hops(), timeout_ms=5_000)
        data: dict[str, Any] = answer.raise_for_status().data
        return data

    def agents(self) -> tuple[ReachAgent, ReachAgent]:
        ops, orders = ReachAgent("ops_config"), ReachAgent("orders")

        @ops.capability("explain_coupon")
        async def explain_coupon(coupon: str) -> dict[str, Any]:
            return {"coupon": coupon, "order": await self.reach("coupon_order", coupon)}

        @ops.capability("coupon_rules")
        def coupon_rules(coupon: str) -> dict[str, Any]:
            return {"coupon": coupon, "min_spend": 100}

        @orders.capability("coupon_order")
        async def coupon_order(coupon: str) -> dict[str, Any]:
            return {"order": "o-1", "rules": await self.reach("coupon_rules", coupon)}

        return ops, orders


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Loop]:
    with serve_loop(tmp_path, "alert") as world:
        yield world


@pytest.fixture
def shedding(tmp_path: Path) -> Iterator[Loop]:
    with serve_loop(tmp_path, "shed") as world:
        yield world


@contextmanager
def serve_loop(tmp_path: Path, on_loop: str) -> Iterator[Loop]:
    """The two agents and a gateway whose config has a short ``loops:`` window, and ``on_loop``."""
    world = Loop()
    ops, orders = world.agents()
    with BackgroundServer(ops.app) as ops_server, BackgroundServer(orders.app) as orders_server:
        config = tmp_path / "agents.yaml"
        write_config(
            config,
            {
                "ops_config": {"endpoints": [ops_server.url], "capabilities": ["explain_coupon", "coupon_rules"]},
                "orders": {"endpoints": [orders_server.url], "capabilities": ["coupon_order"]},
            },
            demo_tenants(),
        )
        loops = f"loops:\n  window: {WINDOW}\n  buckets: 30\n  threshold: {THRESHOLD}\n  on_loop: {on_loop}\n"
        doc = config.read_text() + loops
        config.write_text(doc)
        world.config = config
        world.registry = open_registry(str(config))
        with BackgroundServer(create_app(config, environ=TOKENS), proxy_headers=False) as gateway:
            world.gateway_url = gateway.url
            yield world


async def test_the_coupon_loop_is_alerted_within_the_window(loop: Loop, caplog: pytest.LogCaptureFixture) -> None:
    """Rounds of fresh reaches both ways: one alert within the window, the pair listed, counted and in the CLI."""
    caplog.set_level(logging.WARNING, logger="reach_plugins.loops")
    assert loop.config is not None
    transport = GatewayTransport(loop.gateway_url, token=TOKENS["DEMO_TOKEN"])
    async with ReachClient(str(loop.config), transport, tenant="demo", environ=TOKENS) as user:
        started = time.time()
        rounds = 0
        async with asyncio.timeout(30):
            while not any(r.name == "reach_plugins.loops" for r in caplog.records):
                answers = await asyncio.gather(*(user.reach("explain_coupon", {"coupon": "c-9"}) for _ in range(3)))
                assert all(answer.ok for answer in answers), [a.error for a in answers]
                rounds += 3
        alert = next(r for r in caplog.records if r.name == "reach_plugins.loops")
        latency = alert.created - started
        print(f"coupon loop: alert after {latency:.2f}s and {rounds} rounds (window {WINDOW}s, {THRESHOLD}/s)")
        assert latency <= WINDOW, f"alert after {latency:.2f}s, the window is {WINDOW}s"
        assert "ops_config and orders" in alert.getMessage()
        assert "newer direction orders -> ops_config" in alert.getMessage()

        async with httpx.AsyncClient(base_url=loop.gateway_url) as http:
            listed = (await http.get("/v1/loops", headers=DEMO)).json()
            scraped = (await http.get("/metrics")).text
            unauthenticated = await http.get("/v1/loops")
    [pair] = listed["loops"]
    assert pair["pair"] == ["ops_config", "orders"] and pair["rate"] >= THRESHOLD
    assert unauthenticated.status_code == 401
    assert "reach_gateway_dependency_loops 1.0" in scraped
    assert 'reach_dependency_loop_alerts_total{reach_dependency_pair="ops_config<->orders"} 1.0' in scraped

    shown = await asyncio.to_thread(
        CliRunner().invoke, cli, ["agents", "--loops", loop.gateway_url, "--json"], env={"REACH_TOKEN": "tok-demo"}
    )
    assert shown.exit_code == 0, shown.output
    assert [p["pair"] for p in json.loads(shown.stdout)] == [["ops_config", "orders"]]


async def test_shedding_refuses_the_newer_direction_only(shedding: Loop) -> None:
    """``on_loop: shed``: once the pair loops, orders -> ops_config is refused (409), ops_config -> orders is not."""
    assert shedding.config is not None
    transport = GatewayTransport(shedding.gateway_url, token=TOKENS["DEMO_TOKEN"])
    async with ReachClient(str(shedding.config), transport, tenant="demo", environ=TOKENS) as user:
        async with asyncio.timeout(30):
            while (await user.reach("explain_coupon", {"coupon": "c-9"})).ok:
                pass
        async with httpx.AsyncClient(base_url=shedding.gateway_url) as http:
            newer = {"capability": "coupon_rules", "payload": {"coupon": "c-9"}}
            older = {"capability": "coupon_order", "payload": {"coupon": "c-9"}}
            refused = await http.post("/v1/reach", json=newer, headers={**DEMO, "X-Reach-Hops": "orders/coupon_order"})
            allowed = await http.post(
                "/v1/reach", json=older, headers={**DEMO, "X-Reach-Hops": "ops_config/explain_coupon"}
            )
    assert refused.status_code == 409 and "orders -> ops_config is shed" in refused.json()["error"]["message"]
    assert allowed.status_code == 200  # routed and answered (its own onward reach is the shed one)
