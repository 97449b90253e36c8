"""Tokens through a real gateway: its issuer role, agents fetching its JWKS, rotation, L3 via the gateway only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hop_support import TOKENS, demo_tenants, free_port, write_config

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext
from reach_plugins.gateway import create_app
from reach_plugins.node import build_node
from reach_plugins.security import (
    HEADER_TOKEN,
    AuditEvent,
    RemoteJwks,
    RemoteTokens,
    SigningKey,
    TokenVerifier,
    default_issuer,
)
from reach_plugins.server.issuer_server import create_issuer_app
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

ACME_AGENT = {"orders": {"endpoints": ["http://127.0.0.1:9"], "capabilities": ["unused"]}}
"""demo_tenants() names agent orders in tenant acme's allow-list: a placeholder keeps the config consistent."""


class Recorder:
    """An agent's executions: (tenant, token claims subject/via) per call."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []


def served_agent(name: str, jwks_url: str, recorder: Recorder, *, trust: Any = "L2") -> BackgroundServer:
    """A real agent verifying tokens against the JWKS at ``jwks_url`` (refetched on an unknown key at once)."""
    verifier = TokenVerifier(issuer="reach", keys=RemoteJwks(jwks_url, min_interval=0))
    agent = ReachAgent(name, tokens=verifier, trust=trust)

    @agent.capability("query_order")
    def query_order(order_id: str, ctx: ReachContext) -> dict[str, Any]:
        recorder.calls.append({"tenant": ctx.tenant, "token": ctx.headers.get(HEADER_TOKEN.lower())})
        return {"order_id": order_id, "by": name, "tenant": ctx.tenant}

    return BackgroundServer(agent.app)


@contextmanager
def gateway_with(tmp_path: Path, agents: dict[str, Any], port: int = 0, **options: Any) -> Iterator[BackgroundServer]:
    """A real gateway (issuer role on, its own signing key) for ``agents``, on ``port`` if given."""
    config = write_config(tmp_path / "agents.yaml", agents, demo_tenants())
    key = tmp_path / "issuer.pem"
    key.write_bytes(SigningKey.generate().pem())
    app = create_app(config, environ=TOKENS, issuer_keys=[key], **options)
    with BackgroundServer(app, port=port, proxy_headers=False) as server:
        yield server


@pytest.fixture
def gateway_port() -> int:
    """The gateway's port, known before it starts (agents need its JWKS URL)."""
    return free_port()


async def test_gateway_reaches_token_checking_agents_with_the_tenant_in_the_token(
    tmp_path: Path, gateway_port: int
) -> None:
    """Through the gateway, the agent sees a valid token for itself and the caller's tenant from it."""
    recorder = Recorder()
    with served_agent("orders", f"http://127.0.0.1:{gateway_port}/.well-known/jwks.json", recorder) as agent:
        agents = {"orders": {"endpoints": [agent.url], "capabilities": ["query_order"]}}
        with gateway_with(tmp_path, agents, gateway_port) as gateway:
            async with ReachClient(
                str(tmp_path / "agents.yaml"),
                GatewayTransport(gateway.url, token=TOKENS["DEMO_TOKEN"]),
                tenant="demo",
                environ=TOKENS,
            ) as client:
                first = await client.reach("query_order", {"order_id": "A1"})
                second = await client.reach("query_order", {"order_id": "A2"})
    assert first.status == second.status == "success", first.error
    assert [call["tenant"] for call in recorder.calls] == ["demo", "demo"]
    assert recorder.calls[0]["token"] == recorder.calls[1]["token"], "the gateway caches the agent's token"


async def test_issuer_endpoint_serves_tenants_and_refuses_strangers(tmp_path: Path) -> None:
    """POST /v1/tokens: a tenant's bearer gets a token; no bearer is 401; an agent outside its allow-list is 403;
    an exchange without the presenting agent's own issuer token is 401 (the presented token proves nothing)."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    with BackgroundServer(create_issuer_app(config, environ=TOKENS)) as issuer:
        url = f"{issuer.url}/v1/tokens"
        ok = httpx.post(url, json={"audience": "orders"}, headers={"Authorization": "Bearer tok-demo"})
        anonymous = httpx.post(url, json={"audience": "orders"})
        outside = httpx.post(url, json={"audience": "tickets"}, headers={"Authorization": "Bearer tok-acme"})
        exchanged = httpx.post(url, json={"audience": "tickets", "subject_token": ok.json()["token"]})
        forged = httpx.post(url, json={"audience": "tickets", "subject_token": "x.y.z"})
    assert ok.status_code == 200 and 0 < ok.json()["expires_in"] <= 300
    assert anonymous.status_code == 401 and "Authorization" in anonymous.json()["error"]["message"]
    assert outside.status_code == 403 and "may not reach agent 'tickets'" in outside.json()["error"]["message"]
    assert exchanged.status_code == 401 and "Authorization" in exchanged.json()["error"]["message"]
    assert forged.status_code == 401


async def test_remote_tokens_and_key_rotation_without_downtime(tmp_path: Path) -> None:
    """A direct client with RemoteTokens reaches the agent; after the issuer restarts on [new, old] keys, tokens of
    both keys are accepted (the agent refetches the JWKS on the unknown kid) and no call fails."""
    config = write_config(tmp_path / "agents.yaml", {"orders": ["http://127.0.0.1:9"]}, demo_tenants())
    old, new = tmp_path / "old.pem", tmp_path / "new.pem"
    old.write_bytes(SigningKey.generate().pem())
    new.write_bytes(SigningKey.generate().pem())
    issuer = BackgroundServer(create_issuer_app(config, keys=[old], environ=TOKENS))
    recorder = Recorder()
    statuses = []
    with served_agent("orders", f"{issuer.url}/.well-known/jwks.json", recorder) as agent:
        registry_config = write_config(tmp_path / "direct.yaml", {"orders": [agent.url]})
        with issuer:
            before = RemoteTokens(issuer.url, bearer=TOKENS["DEMO_TOKEN"])
            async with ReachClient(str(registry_config), DirectTransport(), tenant="demo", tokens=before) as client:
                statuses.append((await client.reach("query_order", {"order_id": "A1"})).status)
        rotated = BackgroundServer(create_issuer_app(config, keys=[new, old], environ=TOKENS), port=issuer.port)
        with rotated:
            after = RemoteTokens(rotated.url, bearer=TOKENS["DEMO_TOKEN"])
            async with ReachClient(str(registry_config), DirectTransport(), tenant="demo", tokens=after) as client:
                statuses.append((await client.reach("query_order", {"order_id": "A2"})).status)
            async with ReachClient(str(registry_config), DirectTransport(), tenant="demo", tokens=before) as client:
                statuses.append((await client.reach("query_order", {"order_id": "A3"})).status)
            await before.aclose()
            await after.aclose()
    assert statuses == ["success"] * 3
    assert len({call["token"] for call in recorder.calls}) == 2


async def test_l3_agent_only_through_the_gateway_and_audited(tmp_path: Path, gateway_port: int) -> None:
    """An L3 agent: the gateway's call passes the audit (which sees request and reply); a direct client is refused
    before sending; a token from the issuer endpoint (not the gateway's own) is refused by the agent."""
    recorder, seen = Recorder(), []

    def audit(event: AuditEvent) -> bool:
        seen.append((event.stage, event.agent, event.payload.get("order_id")))
        return event.payload.get("order_id") != "forbidden"

    with served_agent(
        "plugin", f"http://127.0.0.1:{gateway_port}/.well-known/jwks.json", recorder, trust="L3"
    ) as agent:
        agents = {"plugin": {"endpoints": [agent.url], "capabilities": ["query_order"], "trust": "L3"}, **ACME_AGENT}
        with gateway_with(tmp_path, agents, gateway_port, audit=audit) as gateway:
            config = str(tmp_path / "agents.yaml")
            async with ReachClient(
                config, GatewayTransport(gateway.url, token="tok-demo"), tenant="demo", environ=TOKENS
            ) as client:
                allowed = await client.reach("query_order", {"order_id": "A1"})
                refused = await client.reach("query_order", {"order_id": "forbidden"})
            async with ReachClient(config, DirectTransport(), tenant="demo", environ=TOKENS) as client:
                direct = await client.reach("query_order", {"order_id": "A2"})
            token = httpx.post(
                f"{gateway.url}/v1/tokens", json={"audience": "plugin"}, headers={"Authorization": "Bearer tok-demo"}
            ).json()["token"]
            sneaked = httpx.post(
                f"{agent.url}/reach",
                json={"capability": "query_order", "payload": {"order_id": "A3"}},
                headers={HEADER_TOKEN: token},
            )
    assert allowed.status == "success", allowed.error
    assert seen[:2] == [("request", "plugin", "A1"), ("reply", "plugin", "A1")]
    assert refused.status == "fail" and refused.error is not None and "content audit refused" in refused.error.message
    assert direct.status == "fail" and direct.error is not None and "only through the gateway" in direct.error.message
    assert sneaked.status_code == 403 and "only through the gateway" in sneaked.json()["error"]["message"]
    assert [call["tenant"] for call in recorder.calls] == ["demo"], "only the audited gateway call ran"


async def test_gateway_without_audit_refuses_l3(tmp_path: Path) -> None:
    """An L3 agent behind a gateway that has no audit configured is refused: never unaudited."""
    with served_agent("plugin", "http://127.0.0.1:9/jwks", Recorder(), trust="L3") as agent:
        agents = {"plugin": {"endpoints": [agent.url], "capabilities": ["query_order"], "trust": "L3"}, **ACME_AGENT}
        with gateway_with(tmp_path, agents) as gateway:
            async with ReachClient(
                str(tmp_path / "agents.yaml"),
                GatewayTransport(gateway.url, token="tok-demo"),
                tenant="demo",
                environ=TOKENS,
            ) as client:
                response = await client.reach("query_order", {"order_id": "A1"})
    assert response.status == "fail" and response.error is not None
    assert "no content audit" in response.error.message


async def test_node_reaches_token_checking_agents(tmp_path: Path) -> None:
    """A node in this process signs with the process key (no key configured): an agent verifying it is reached,
    and sees the tenant of the caller."""
    recorder = Recorder()
    agent = ReachAgent("orders", tokens=default_issuer().verifier())

    @agent.capability("query_order")
    def query_order(order_id: str, ctx: ReachContext) -> dict[str, Any]:
        recorder.calls.append({"tenant": ctx.tenant})
        return {"order_id": order_id}

    with BackgroundServer(agent.app) as server:
        config = write_config(
            tmp_path / "agents.yaml",
            {"orders": {"endpoints": [server.url], "capabilities": ["query_order"]}},
            demo_tenants(),
        )
        async with (
            build_node(config, environ=TOKENS) as node,
            ReachClient(
                str(config), GrpcNodeTransport(node.target, token=TOKENS["DEMO_TOKEN"]), tenant="demo", environ=TOKENS
            ) as client,
        ):
            reply = await client.reach("query_order", {"order_id": "A1"})
    assert reply.status == "success", reply.error
    assert recorder.calls == [{"tenant": "demo"}]
