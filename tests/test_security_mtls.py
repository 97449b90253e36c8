"""L1 agents: mutual TLS both ways plus a token (DESIGN.md 11.4), over real TLS on 127.0.0.1."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trustme

from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext, mtls, serve
from reach_plugins.client.client import ReachClient
from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor
from reach_plugins.registry import MemoryRegistry
from reach_plugins.security import LocalTokens, TokenIssuer


@dataclass
class Pki:
    ca: Path
    server: tuple[Path, Path]
    client: tuple[Path, Path]
    stranger: tuple[Path, Path]
    """A client certificate from another CA."""


def _pair(tmp_path: Path, name: str, cert: trustme.LeafCert) -> tuple[Path, Path]:
    chain, key = tmp_path / f"{name}.pem", tmp_path / f"{name}-key.pem"
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    return chain, key


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return Pki(
        tmp_path / "ca.pem",
        _pair(tmp_path, "server", ca.issue_cert("127.0.0.1")),
        _pair(tmp_path, "client", ca.issue_cert("front.reach")),
        _pair(tmp_path, "stranger", other.issue_cert("front.reach")),
    )


@dataclass
class Payments:
    url: str
    executed: list[str | None]
    issuer: TokenIssuer


@pytest.fixture
def payments(pki: Pki) -> Iterator[Payments]:
    """An L1 payments agent served with mutual TLS and token checks."""
    issuer = TokenIssuer(issuer="reach")
    agent = ReachAgent("payments", tokens=issuer.verifier(), trust="L1")
    executed: list[str | None] = []

    @agent.capability("refund")
    def refund(order_id: str, ctx: ReachContext) -> dict[str, str | None]:
        executed.append(ctx.tenant)
        return {"refunded": order_id, "tenant": ctx.tenant}

    with BackgroundServer(agent.app, **mtls(*pki.server, pki.ca)) as server:
        yield Payments(server.url, executed, issuer)


def registry_for(payments: Payments, pki: Pki, client: tuple[Path, Path] | None) -> MemoryRegistry:
    auth = (
        {"type": "cert", "client_cert": str(client[0]), "client_key": str(client[1]), "ca_file": str(pki.ca)}
        if client
        else {}
    )
    registry = MemoryRegistry()
    registry.put_agent(
        AgentDescriptor(name="payments", endpoints=[payments.url], capabilities=["refund"], trust="L1", auth=auth)
    )
    return registry


async def test_l1_call_with_client_certificate_and_token_succeeds(payments: Payments, pki: Pki) -> None:
    """The direct transport presents the client certificate, the token rides along: the refund runs once."""
    registry = registry_for(payments, pki, pki.client)
    async with ReachClient(registry, tenant="alpha", tokens=LocalTokens(payments.issuer)) as client:
        reply = await client.reach("refund", {"order_id": "A1"})
    assert reply.status == "success", reply.error
    assert payments.executed == ["alpha"]


async def test_client_refuses_l1_without_client_certificate(payments: Payments, pki: Pki) -> None:
    """Without a 'cert' credential the client refuses before sending: L1 needs mutual TLS."""
    registry = registry_for(payments, pki, None)
    async with ReachClient(registry, tenant="alpha", tokens=LocalTokens(payments.issuer)) as client:
        reply = await client.reach("refund", {"order_id": "A1"})
    assert reply.status == "fail" and reply.error is not None
    assert "client certificate" in reply.error.message
    assert payments.executed == []


def test_agent_refuses_tls_without_or_with_a_foreign_client_certificate(payments: Payments, pki: Pki) -> None:
    """At the TLS layer: no client certificate, or one from another CA, never gets an HTTP exchange."""
    for cert in (None, pki.stranger):
        context = ssl.create_default_context(cafile=str(pki.ca))
        if cert is not None:
            context.load_cert_chain(str(cert[0]), str(cert[1]))
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            httpx.post(f"{payments.url}/reach", json={"capability": "refund", "payload": {}}, verify=context)
    assert payments.executed == []


async def test_certificate_without_token_is_still_refused(payments: Payments, pki: Pki) -> None:
    """mTLS alone is not enough for L1: a client with the certificate but no token gets the 401."""
    registry = registry_for(payments, pki, pki.client)
    async with ReachClient(registry, tenant="alpha", tokens=False) as client:
        reply = await client.reach("refund", {"order_id": "A1"})
    assert reply.status == "fail" and reply.error is not None and "X-Reach-Token" in reply.error.message
    assert payments.executed == []


def test_l1_agent_is_never_served_without_mutual_tls() -> None:
    """serve() refuses an L1 agent without mutual TLS options, before listening."""
    with pytest.raises(ConfigError, match="mutual TLS"):
        serve(ReachAgent("payments", trust="L1"), port=1)
