"""Token exchange that checks everything: the presenter authenticates, the tenant's allow-list and the chain bind the
new audience, an L3 agent's token is never exchanged for a direct hop, and every exchange is one audited JSON record.

Real servers on 127.0.0.1: a ``reach issuer`` app and agents under uvicorn, a real gateway for the L3 case.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from hop_support import TOKENS, write_config
from typer.testing import CliRunner

from reach_plugins import ReachClient, errors
from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext
from reach_plugins.cli import app
from reach_plugins.gateway import create_app
from reach_plugins.model import AgentDescriptor
from reach_plugins.registry import MemoryRegistry
from reach_plugins.security import AuditEvent, KeyRing, RemoteJwks, RemoteTokens, SigningKey, TokenIssuer, TokenVerifier
from reach_plugins.security.claims import MAX_CHAIN
from reach_plugins.server.issuer_server import create_issuer_app
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport

ENV = {**TOKENS, "ECHO_ISSUER": "iss-echo", "ORDERS_ISSUER": "iss-orders", "PLUGIN_ISSUER": "iss-plugin"}
AGENT_TOKENS = {"echo": "ECHO_ISSUER", "orders": "ORDERS_ISSUER", "plugin": "PLUGIN_ISSUER"}
TENANTS = {
    "acme": {"token_env": "ACME_TOKEN", "agents": ["echo"]},
    "demo": {"token_env": "DEMO_TOKEN", "agents": "*"},
}
"""acme may reach only echo; demo may reach every agent."""


@dataclass
class World:
    """An issuer, and a payments agent verifying its tokens that records who reached it."""

    issuer: BackgroundServer
    payments: BackgroundServer
    key: Path
    transfers: list[dict[str, Any]] = field(default_factory=list)

    def verifier(self) -> TokenVerifier:
        return TokenVerifier(issuer="reach", keys=RemoteJwks(f"{self.issuer.url}/.well-known/jwks.json"))

    def registry(self, **agents: BackgroundServer) -> MemoryRegistry:
        registry = MemoryRegistry()
        registry.put_agent(AgentDescriptor(name="payments", endpoints=[self.payments.url], capabilities=["transfer"]))
        for name, server in agents.items():
            registry.put_agent(AgentDescriptor(name=name, endpoints=[server.url], capabilities=["relay"]))
        return registry


def relay_agent(name: str, world: World, bearer: str, *, trust: Any = "L2") -> ReachAgent:
    """An agent whose ``relay`` reaches payments/transfer, exchanging the token it received with ``bearer``."""
    agent = ReachAgent(name, tokens=world.verifier(), trust=trust)

    @agent.capability("relay")
    async def relay(amount: int, ctx: ReachContext) -> dict[str, Any]:
        tokens = RemoteTokens(world.issuer.url, bearer=bearer)
        try:
            async with ReachClient(world.registry(), DirectTransport(), tenant=ctx.tenant, tokens=tokens) as client:
                reply = await client.reach("transfer", {"amount": amount})
        finally:
            await tokens.aclose()
        if reply.error is not None:
            return {"refused": reply.error.type, "message": reply.error.message}
        return {"transfer": reply.status}

    return agent


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    key = tmp_path / "issuer.pem"
    key.write_bytes(SigningKey.generate().pem())
    config = write_config(tmp_path / "issuer.yaml", {"echo": ["http://127.0.0.1:9"]}, TENANTS)
    issuer = BackgroundServer(create_issuer_app(config, keys=[key], environ=ENV, agent_tokens=AGENT_TOKENS))
    with issuer:
        transfers: list[dict[str, Any]] = []
        payments = ReachAgent(
            "payments", tokens=TokenVerifier(issuer="reach", keys=RemoteJwks(f"{issuer.url}/.well-known/jwks.json"))
        )

        @payments.capability("transfer")
        def transfer(amount: int, ctx: ReachContext) -> dict[str, Any]:
            transfers.append({"amount": amount, "tenant": ctx.tenant})
            return {"sent": amount}

        with BackgroundServer(payments.app) as served:
            yield World(issuer, served, key, transfers)


def _exchanges(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "reach_plugins.security.exchange"]


@contextmanager
def serving(agent: ReachAgent) -> Iterator[BackgroundServer]:
    with BackgroundServer(agent.app) as server:
        yield server


async def test_tenant_allowed_only_echo_cannot_exchange_for_payments(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """acme (allow-list: echo) reaches echo, echo exchanges acme's token for payments: ExchangeDenied naming the
    allow-list, payments runs nothing; demo (allowed everything) through the same echo transfers once. Both
    exchanges are one JSON audit record each."""
    with serving(relay_agent("echo", world, "iss-echo")) as echo, caplog.at_level(logging.INFO):
        for tenant, bearer in (("acme", "tok-acme"), ("demo", "tok-demo")):
            tokens = RemoteTokens(world.issuer.url, bearer=bearer)
            async with ReachClient(world.registry(echo=echo), DirectTransport(), tenant=tenant, tokens=tokens) as c:
                reply = await c.reach("relay", {"amount": 5000})
            await tokens.aclose()
            assert reply.status == "success", reply.error
            if tenant == "acme":
                assert reply.data["refused"] == errors.ExchangeDenied.code
                assert "may not reach agent 'payments'" in reply.data["message"]
            else:
                assert reply.data == {"transfer": "success"}
    assert world.transfers == [{"amount": 5000, "tenant": "demo"}]
    refused, issued = _exchanges(caplog)
    assert (refused["verdict"], refused["code"], refused["presenter"], refused["tenant"], refused["audience"]) == (
        "refused",
        "exchange_denied",
        "echo",
        "acme",
        "payments",
    )
    assert (issued["verdict"], issued["tenant"], issued["chain"], issued["holder"]) == (
        "issued",
        "demo",
        ["tenant:demo"],
        "echo",
    )


async def test_the_presenter_authenticates_as_the_tokens_holder(world: World) -> None:
    """The presented token alone proves nothing: no bearer and a tenant's bearer are 401; another agent's issuer
    token, an exchange to oneself and an agent asking as a tenant are 403 with their own codes."""
    url = f"{world.issuer.url}/v1/tokens"
    received = httpx.post(url, json={"audience": "echo"}, headers={"Authorization": "Bearer tok-demo"}).json()["token"]
    exchange = {"audience": "payments", "subject_token": received}

    def post(body: dict[str, Any], bearer: str | None) -> httpx.Response:
        return httpx.post(url, json=body, headers={"Authorization": f"Bearer {bearer}"} if bearer else {})

    anonymous, as_tenant = post(exchange, None), post(exchange, "tok-demo")
    as_orders, as_echo = post(exchange, "iss-orders"), post(exchange, "iss-echo")
    to_itself = post({"audience": "echo", "subject_token": received}, "iss-echo")
    agent_as_tenant = post({"audience": "payments"}, "iss-echo")
    assert anonymous.status_code == 401 and anonymous.json()["error"]["type"] == "unauthenticated"
    assert as_tenant.status_code == 401 and "presented by the agent" in as_tenant.json()["error"]["message"]
    assert as_orders.status_code == 403 and as_orders.json()["error"]["type"] == "exchange_denied"
    assert "only the agent a token was issued to" in as_orders.json()["error"]["message"]
    assert to_itself.status_code == 403 and to_itself.json()["error"]["type"] == "exchange_denied"
    assert agent_as_tenant.status_code == 403 and agent_as_tenant.json()["error"]["type"] == "permission_denied"
    assert as_echo.status_code == 200
    claims = jwt.decode(as_echo.json()["token"], options={"verify_signature": False})
    assert (claims["sub"], claims["aud"], claims["chain"], claims["tenant"]) == (
        "echo",
        "payments",
        ["tenant:demo"],
        "demo",
    )


async def test_an_l3_agent_never_exchanges_the_gateways_token_for_a_direct_hop(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An L3 plugin reached through a real (audited) gateway tries to exchange the gateway's token and transfer
    directly: refused (ExchangeDenied, 'only through the gateway'), payments runs nothing, the refusal is audited."""
    audited: list[str] = []

    def audit(event: AuditEvent) -> bool:
        audited.append(event.stage)
        return True

    plugin = relay_agent("plugin", world, "iss-plugin", trust="L3")
    with serving(plugin) as served, caplog.at_level(logging.INFO):
        agents = {
            "plugin": {"endpoints": [served.url], "capabilities": ["relay"], "trust": "L3"},
            "payments": {"endpoints": [world.payments.url], "capabilities": ["transfer"]},
            "echo": {"endpoints": ["http://127.0.0.1:9"], "capabilities": ["relay"]},
        }
        config = write_config(tmp_path / "gateway.yaml", agents, TENANTS)
        with BackgroundServer(create_app(config, environ=ENV, issuer_keys=[world.key], audit=audit)) as gateway:
            async with ReachClient(
                str(config), GatewayTransport(gateway.url, token="tok-demo"), tenant="demo", environ=ENV
            ) as client:
                reply = await client.reach("relay", {"amount": 25000})
    assert reply.status == "success", reply.error
    assert reply.data["refused"] == "exchange_denied" and "only through the gateway" in reply.data["message"]
    assert world.transfers == [] and audited == ["request", "reply"]
    [record] = _exchanges(caplog)
    assert (record["verdict"], record["presenter"], record["holder"]) == ("refused", "plugin", "plugin")


async def test_the_chain_may_not_pass_its_hop_limit() -> None:
    """A token whose chain is already at the limit cannot be extended by an exchange (nor loop back)."""
    issuer = TokenIssuer(KeyRing([SigningKey.generate()]))
    chain = tuple(f"agent{i}" for i in range(MAX_CHAIN - 1))
    long = issuer.issue(subject="last", audience="holder", tenant="demo", chain=chain).token
    with pytest.raises(errors.ExchangeDenied, match="hops long"):
        await issuer.exchange(long, audience="payments", presenter="holder")
    short = issuer.issue(subject="agent0", audience="holder", tenant="demo").token
    with pytest.raises(errors.ExchangeDenied, match="a loop"):
        await issuer.exchange(short, audience="agent0", presenter="holder")


def test_reach_issuer_names_a_malformed_agent_token_option(tmp_path: Path) -> None:
    """`reach issuer --agent-token` takes NAME=ENV; anything else, an unset variable, or a token a tenant also holds
    exits 2 saying so."""
    config = write_config(tmp_path / "issuer.yaml", {"echo": ["http://127.0.0.1:9"]}, TENANTS)
    runner = CliRunner()
    base = ["issuer", "--config", str(config), "--port", "1"]
    malformed = runner.invoke(app, [*base, "--agent-token", "echo"], env={"COLUMNS": "200"})
    unset = runner.invoke(app, [*base, "--agent-token", "echo=NO_SUCH_VARIABLE"], env={"COLUMNS": "200", **TOKENS})
    shared = runner.invoke(app, [*base, "--agent-token", "echo=ACME_TOKEN"], env={"COLUMNS": "200", **TOKENS})
    assert malformed.exit_code == 2 and "NAME=ENV_VARIABLE" in malformed.output
    assert unset.exit_code == 2 and "NO_SUCH_VARIABLE is not set" in unset.output
    assert shared.exit_code == 2 and "share a token with an agent" in shared.output
