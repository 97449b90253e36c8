"""``GET /v1/agents`` of a real ``reach gateway`` process shows the breaker its calls opened, with the reopen time,
as the reason the instance takes no calls of that tenant now (issue 28, deliverable 1)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
from hop_support import TOKENS, demo_tenants, serve_agents, write_config
from test_credentials_hop import hop

from reach_plugins import ReachClient
from reach_plugins.errors import ReachError
from transports.gateway import GatewayTransport


async def test_an_open_breaker_shows_in_the_gateways_agents_view(tmp_path: Path) -> None:
    """Calls to a capability whose handler fails open orders-0's breaker for tenant demo: /v1/agents (demo's
    view) says unavailable, circuit open, reopening within the breaker's open wait."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        async with hop("gateway", config, TOKENS) as transport:
            assert isinstance(transport, GatewayTransport)
            async with ReachClient(str(config), transport, tenant="demo", environ=TOKENS) as client:
                for _ in range(12):
                    with contextlib.suppress(ReachError):  # failing, then refused by the caller's own breaker
                        await client.reach("outage", timeout_ms=5000)
            async with httpx.AsyncClient() as http:
                answer = await http.get(
                    f"{transport.url}/v1/agents", headers={"Authorization": f"Bearer {TOKENS['DEMO_TOKEN']}"}
                )
    assert answer.status_code == 200, answer.text
    (inst,) = next(a for a in answer.json()["agents"] if a["name"] == "orders")["instances"]
    print(f"/v1/agents after 12 failing calls: {inst['reason']}; breaker {inst['breaker']}")
    assert inst["available"] is False and inst["breaker"]["state"] == "open", inst
    assert 0 < inst["breaker"]["reopens_in"] <= 5.0, inst
    assert inst["reason"] == f"circuit open: reopens in {inst['breaker']['reopens_in']:.1f}s", inst
    assert inst["lease"]["alive"] is True and inst["probe"]["ok"] is True, inst
