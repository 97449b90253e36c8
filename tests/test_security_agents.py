"""Agents refuse calls without a valid token for themselves; the tenant comes from the token (DESIGN.md 11.4).

Real agents under uvicorn on 127.0.0.1, a real in-process issuer; each attack
counts what the agents actually executed.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext
from reach_plugins.client.client import ReachClient
from reach_plugins.model import AgentDescriptor
from reach_plugins.registry import MemoryRegistry
from reach_plugins.security import HEADER_TOKEN, KeyRing, LocalTokens, SigningKey, TokenIssuer


@dataclass
class Served:
    """What one agent executed: (tenant, token it received) per call."""

    url: str = ""
    calls: list[tuple[str | None, str | None]] = field(default_factory=list)


@dataclass
class World:
    issuer: TokenIssuer
    agents: dict[str, Served]
    registry: MemoryRegistry


def _agent(name: str, issuer: TokenIssuer, served: Served, registry: MemoryRegistry) -> ReachAgent:
    agent = ReachAgent(name, tokens=issuer.verifier())

    @agent.capability(f"ask_{name}")
    async def ask(ctx: ReachContext, then: str | None = None) -> dict[str, Any]:
        served.calls.append((ctx.tenant, ctx.headers.get(HEADER_TOKEN.lower())))
        answer: dict[str, Any] = {"agent": name, "tenant": ctx.tenant}
        if then:
            async with ReachClient(registry, tokens=LocalTokens(issuer)) as client:
                reply = await client.reach(f"ask_{then}", {})
            answer["then"] = (
                reply.data if reply.status == "success" else reply.error.model_dump() if reply.error else None
            )
        return answer

    return agent


@pytest.fixture
def world() -> Iterator[World]:
    issuer = TokenIssuer(KeyRing([SigningKey.generate()]), issuer="reach")
    registry = MemoryRegistry()
    agents = {name: Served() for name in ("front", "orders", "tickets")}
    servers = []
    try:
        for name, served in agents.items():
            server = BackgroundServer(_agent(name, issuer, served, registry).app).start()
            servers.append(server)
            served.url = server.url
            registry.put_agent(AgentDescriptor(name=name, endpoints=[server.url], capabilities=[f"ask_{name}"]))
        yield World(issuer, agents, registry)
    finally:
        for server in servers:
            server.stop()


def _post(url: str, capability: str, token: str | None, **extra: Any) -> httpx.Response:
    headers = {HEADER_TOKEN: token} if token else {}
    headers.update(extra.pop("headers", {}))
    body = {"request_id": "r1", "capability": capability, "payload": {}, **extra}
    return httpx.post(f"{url}/reach", json=body, headers=headers, timeout=5)


def test_call_without_token_is_refused_with_401(world: World) -> None:
    """A direct call with no token (the old open door) is a 401 naming the missing header; nothing runs."""
    reply = _post(world.agents["orders"].url, "ask_orders", None, headers={"X-Tenant": "alpha"})
    assert reply.status_code == 401
    assert "missing X-Reach-Token" in reply.json()["error"]["message"]
    assert world.agents["orders"].calls == []


def test_spoofed_tenant_is_ignored(world: World) -> None:
    """With a token of tenant alpha, X-Tenant: beta and body tenant beta change nothing: the handler sees alpha."""
    token = world.issuer.for_tenant("alpha", "orders").token
    reply = _post(world.agents["orders"].url, "ask_orders", token, tenant="beta", headers={"X-Tenant": "beta"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["data"]["tenant"] == "alpha"
    assert world.agents["orders"].calls == [("alpha", token)]


def test_token_replayed_to_a_third_agent_is_refused(world: World) -> None:
    """orders' token presented to tickets (lateral movement with a leaked token) is a 403; tickets runs nothing."""
    token = world.issuer.for_tenant("alpha", "orders").token
    reply = _post(world.agents["tickets"].url, "ask_tickets", token)
    assert reply.status_code == 403
    assert "for agent 'orders', not 'tickets'" in reply.json()["error"]["message"]
    assert world.agents["tickets"].calls == []


def test_expired_token_is_refused(world: World) -> None:
    """A token that expired (issued 20 minutes ago) is a 401 saying so."""
    past = TokenIssuer(world.issuer.keys, issuer="reach", clock=lambda: time.time() - 1200)
    reply = _post(world.agents["orders"].url, "ask_orders", past.for_tenant("alpha", "orders").token)
    assert reply.status_code == 401
    assert "expired" in reply.json()["error"]["message"]
    assert world.agents["orders"].calls == []


def test_token_of_another_issuer_is_refused(world: World) -> None:
    """A token signed by a key the issuer does not publish is a 401, even with the right iss and aud."""
    rogue = TokenIssuer(KeyRing([SigningKey.generate()]), issuer="reach")
    reply = _post(world.agents["orders"].url, "ask_orders", rogue.for_tenant("alpha", "orders").token)
    assert reply.status_code == 401
    assert "does not publish" in reply.json()["error"]["message"]
    assert world.agents["orders"].calls == []


def test_stream_requires_a_token_too(world: World) -> None:
    """POST /reach/stream is guarded like /reach."""
    reply = httpx.post(
        f"{world.agents['orders'].url}/reach/stream", json={"capability": "ask_orders", "payload": {}}, timeout=5
    )
    assert reply.status_code == 401


async def test_client_with_tokens_reaches_and_without_is_told_why(world: World) -> None:
    """ReachClient(tokens=...) gets through; without tokens, or with tokens of another (the in-process default)
    issuer, the client gets a fail naming what is wrong."""
    async with ReachClient(world.registry, tenant="alpha", tokens=LocalTokens(world.issuer)) as client:
        ok = await client.reach("ask_orders", {})
    assert ok.status == "success" and ok.data["tenant"] == "alpha"
    async with ReachClient(world.registry, tenant="alpha", tokens=False) as client:
        missing = await client.reach("ask_orders", {})
    async with ReachClient(world.registry, tenant="alpha") as client:
        foreign = await client.reach("ask_orders", {})
    assert missing.error is not None and "missing X-Reach-Token" in missing.error.message
    assert foreign.error is not None and "does not publish" in foreign.error.message
    assert len(world.agents["orders"].calls) == 1


async def test_agent_without_tokens_never_exchanges_what_it_was_sent(world: World) -> None:
    """An agent in the open mode that receives some token reaches further with a fresh token of its own issuer,
    never by exchanging (or forwarding) the unverified one."""
    relay = ReachAgent("relay", tokens="open")

    @relay.capability("ask_relay")
    async def ask_relay() -> Any:
        async with ReachClient(world.registry, tenant="alpha", tokens=LocalTokens(world.issuer)) as client:
            return (await client.reach("ask_orders", {})).data

    with BackgroundServer(relay.app) as server:
        reply = _post(server.url, "ask_relay", "not.a.token")
    assert reply.status_code == 200 and reply.json()["data"] == {"agent": "orders", "tenant": "alpha"}
    [(_, token)] = world.agents["orders"].calls
    assert token != "not.a.token"


async def test_embedded_default_needs_no_setup() -> None:
    """Agents served in this process with the in-process issuer's verifier (the default) accept a plain
    ReachClient's reaches."""
    agent = ReachAgent("orders")

    @agent.capability("ask_orders")
    def ask(ctx: ReachContext) -> str | None:
        return ctx.tenant

    with BackgroundServer(agent.app) as server:
        registry = MemoryRegistry()
        registry.put_agent(AgentDescriptor(name="orders", endpoints=[server.url], capabilities=["ask_orders"]))
        async with ReachClient(registry, tenant="demo") as client:
            reply = await client.reach("ask_orders", {})
    assert reply.status == "success" and reply.data == "demo"


async def test_cascade_exchanges_the_token_and_never_forwards_it(world: World) -> None:
    """front reaching orders sends a new token (sub front, chain from the tenant), never the one it received."""
    async with ReachClient(world.registry, tenant="alpha", tokens=LocalTokens(world.issuer)) as client:
        reply = await client.reach("ask_front", {"then": "orders"})
    assert reply.status == "success", reply.error
    assert reply.data["then"] == {"agent": "orders", "tenant": "alpha"}
    [(_, to_front)] = world.agents["front"].calls
    [(tenant, to_orders)] = world.agents["orders"].calls
    assert tenant == "alpha" and to_orders is not None and to_orders != to_front
    claims = await world.issuer.verifier().verify(to_orders, audience="orders")
    assert (claims.subject, claims.chain) == ("front", ("tenant:alpha",))
    assert _post(world.agents["orders"].url, "ask_orders", to_front).status_code == 403


def test_refused_before_the_body_is_read(world: World) -> None:
    """A call without a token announcing a 1 MB body it never sends gets its 401 at once: the body is not awaited."""
    host, port = world.agents["orders"].url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(
            b"POST /reach HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
        )
        reply = conn.recv(4096)
    assert reply.startswith(b"HTTP/1.1 401")
