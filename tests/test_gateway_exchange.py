"""Token exchange at a gateway's issuer role (DESIGN.md 11.4): ``reach gateway --agent-token NAME=ENV`` lets an agent
reached through the gateway exchange the token it received there, with the same checks as ``reach issuer``.

A real ``reach gateway`` process (uvicorn) signing with a key file; agents under uvicorn verifying its JWKS. The
agent ``echo``, reached by tenant acme through the gateway, exchanges its token at the gateway and reaches the next
agent directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from hop_support import TOKENS, free_port, until_true, write_config
from servers import interrupt
from typer.testing import CliRunner

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext
from reach_plugins.cli import app
from reach_plugins.model import AgentDescriptor
from reach_plugins.registry import MemoryRegistry
from reach_plugins.security import RemoteJwks, RemoteTokens, SigningKey, TokenVerifier
from reach_plugins.security.held import received
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport

CLI = "from reach_plugins.cli import main; main()"
ENV = {**TOKENS, "ECHO_ISSUER": "iss-echo"}
TENANTS = {"acme": {"token_env": "ACME_TOKEN", "agents": ["echo", "payments"]}}
"""acme may reach echo and payments, not ledger."""
CAPABILITY = {"payments": "transfer", "ledger": "post_entry"}


@dataclass
class World:
    """The gateway's URL and config file, and what the agents behind it ran (capability, tenant)."""

    gateway: str
    config: Path
    ran: list[tuple[str, str | None]] = field(default_factory=list)


def _target(name: str, capability: str, world: World, jwks: str) -> ReachAgent:
    """An agent verifying the gateway's tokens that records each call it runs."""
    agent = ReachAgent(name, tokens=TokenVerifier(issuer="reach", keys=RemoteJwks(jwks)))

    @agent.capability(capability)
    def run(amount: int, ctx: ReachContext) -> dict[str, Any]:
        world.ran.append((capability, ctx.tenant))
        return {"done": amount}

    return agent


def _echo(world: World, jwks: str, downstream: MemoryRegistry) -> ReachAgent:
    """Agent echo: ``relay`` exchanges the token it received at the gateway for ``target`` (presenting its own issuer
    token, or not) and reaches ``target`` directly with the new one; it answers the issuer's reply and the reach's."""
    agent = ReachAgent("echo", tokens=TokenVerifier(issuer="reach", keys=RemoteJwks(jwks)))

    @agent.capability("relay")
    async def relay(target: str, present: bool, ctx: ReachContext) -> dict[str, Any]:
        bearer = ENV["ECHO_ISSUER"] if present else None
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        async with httpx.AsyncClient() as http:
            answer = await http.post(
                f"{world.gateway}/v1/tokens", json={"audience": target, "subject_token": received()}, headers=headers
            )
        tokens = RemoteTokens(world.gateway, bearer=bearer)
        try:
            async with ReachClient(downstream, DirectTransport(), tenant=ctx.tenant, tokens=tokens) as client:
                reply = await client.reach(CAPABILITY[target], {"amount": 5})
        finally:
            await tokens.aclose()
        return {
            "issuer": answer.status_code,
            "answer": answer.json(),
            "reach": reply.error.type if reply.error else "ok",
        }

    return agent


@contextmanager
def gateway_process(config: Path, port: int, folder: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``reach gateway`` on ``port`` with ``ENV`` (its stderr in a file), stopped with SIGINT."""
    command = [sys.executable, "-c", CLI, "gateway", "--config", str(config), "--port", str(port), *extra]
    with (folder / "gateway.err").open("wb") as stderr:
        process = subprocess.Popen(command, env={**os.environ, **ENV}, stderr=stderr)
    try:
        yield process
    finally:
        interrupt(process)


async def _answering(url: str, process: subprocess.Popen[bytes], errors: Path) -> bool:
    assert process.poll() is None, errors.read_text()
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{url}/healthz", timeout=0.5)).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    port = free_port()
    world = World(f"http://127.0.0.1:{port}", tmp_path / "gateway.yaml")
    jwks = f"{world.gateway}/.well-known/jwks.json"
    key = tmp_path / "issuer.pem"
    key.write_bytes(SigningKey.generate().pem())
    with (
        BackgroundServer(_target("payments", "transfer", world, jwks).app) as payments,
        BackgroundServer(_target("ledger", "post_entry", world, jwks).app) as ledger,
    ):
        downstream = MemoryRegistry()
        for name, served in (("payments", payments), ("ledger", ledger)):
            descriptor = AgentDescriptor(name=name, endpoints=[served.url], capabilities=[CAPABILITY[name]])
            downstream.put_agent(descriptor)
        with BackgroundServer(_echo(world, jwks, downstream).app) as echo:
            agents = {
                "echo": {"endpoints": [echo.url], "capabilities": ["relay"]},
                "payments": {"endpoints": [payments.url], "capabilities": ["transfer"]},
                "ledger": {"endpoints": [ledger.url], "capabilities": ["post_entry"]},
            }
            write_config(world.config, agents, TENANTS)
            options = ("--issuer-key", str(key), "--agent-token", "echo=ECHO_ISSUER")
            with gateway_process(world.config, port, tmp_path, *options) as process:
                await until_true(lambda: _answering(world.gateway, process, tmp_path / "gateway.err"), within=60)
                yield world


async def test_an_agent_behind_the_gateway_exchanges_its_token_there(world: World) -> None:
    """echo, reached by acme through the gateway, exchanges at the gateway with its issuer token: for payments
    (acme's allow-list) 200 and the transfer runs as acme; for ledger ExchangeDenied (403), nothing runs; without
    its bearer 401, nothing runs."""
    replies = {}
    transport = GatewayTransport(world.gateway, token=ENV["ACME_TOKEN"])
    async with ReachClient(str(world.config), transport, tenant="acme", environ=ENV) as client:
        for case, payload in {
            "allowed": {"target": "payments", "present": True},
            "disallowed": {"target": "ledger", "present": True},
            "no bearer": {"target": "payments", "present": False},
        }.items():
            reply = await client.reach("relay", payload)
            assert reply.status == "success", reply.error
            replies[case] = reply.data
    allowed, disallowed, anonymous = replies["allowed"], replies["disallowed"], replies["no bearer"]
    assert (allowed["issuer"], allowed["reach"]) == (200, "ok")
    claims = jwt.decode(allowed["answer"]["token"], options={"verify_signature": False})
    assert (claims["sub"], claims["aud"], claims["tenant"]) == ("echo", "payments", "acme")
    assert (disallowed["issuer"], disallowed["answer"]["error"]["type"], disallowed["reach"]) == (
        403,
        "exchange_denied",
        "exchange_denied",
    )
    assert "may not reach agent 'ledger'" in disallowed["answer"]["error"]["message"]
    assert (anonymous["issuer"], anonymous["answer"]["error"]["type"]) == (401, "unauthenticated")
    assert anonymous["reach"] == "unauthenticated"
    assert world.ran == [("transfer", "acme")]


def test_reach_gateway_names_a_malformed_agent_token_option(tmp_path: Path) -> None:
    """`reach gateway --agent-token` takes NAME=ENV; anything else, an unset variable, or a token a tenant also holds
    exits 2 saying so, before serving."""
    agents = {name: ["http://127.0.0.1:9"] for name in ("echo", "payments")}
    config = write_config(tmp_path / "gateway.yaml", agents, TENANTS)
    runner = CliRunner()
    base = ["gateway", "--config", str(config), "--port", "1"]
    env = {"COLUMNS": "200", **TOKENS}
    malformed = runner.invoke(app, [*base, "--agent-token", "echo"], env=env)
    unset = runner.invoke(app, [*base, "--agent-token", "echo=NO_SUCH_VARIABLE"], env=env)
    shared = runner.invoke(app, [*base, "--agent-token", "echo=ACME_TOKEN"], env=env)
    assert malformed.exit_code == 2 and "NAME=ENV_VARIABLE" in malformed.output
    assert unset.exit_code == 2 and "NO_SUCH_VARIABLE is not set" in unset.output
    assert shared.exit_code == 2 and "share a token with an agent" in shared.output
