"""Secure by default, loud opt-outs (DESIGN.md 11.4): SDK agents verify tokens unless started in the named open mode,
a capability needing approval is never served without an approver, ``reach issuer`` refuses to run without tenants
unless told ``--allow-open``, key and token URLs are https unless loopback, and an agent reports its clock offset.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from hop_support import write_config

from reach_plugins import ReachClient, errors
from reach_plugins.agent import ApprovalDecision, BackgroundServer, ReachAgent, ReachContext
from reach_plugins.model import AgentDescriptor, Capability
from reach_plugins.registry import MemoryRegistry
from reach_plugins.security import KeyRing, RemoteJwks, RemoteTokens, SigningKey, TokenIssuer, TokenVerifier
from reach_plugins.security.issuer import RingKeys
from reach_plugins.security.verifier import LEEWAY
from reach_plugins.server.issuer_server import create_issuer_app
from transports.direct import DirectTransport

CLI = "from reach_plugins.cli import main; main()"


def orders(**options: Any) -> tuple[ReachAgent, list[str | None]]:
    """An orders agent recording the tenant of every call it runs."""
    agent = ReachAgent("orders", **options)
    ran: list[str | None] = []

    @agent.capability("query_order")
    def query_order(order_id: str, ctx: ReachContext) -> dict[str, Any]:
        ran.append(ctx.tenant)
        return {"order_id": order_id}

    return agent, ran


def post(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"capability": "query_order", "payload": {"order_id": "A1"}, "tenant": "acme"}
    return httpx.post(f"{url}/reach", json=body, headers=headers or {})


async def test_an_sdk_agent_verifies_tokens_by_default() -> None:
    """With every default, an agent refuses a call without a token, with a spoofed X-Tenant, or with a token of
    another key (401, nothing runs); a client of this process is served, with the tenant from its token."""
    agent, ran = orders()
    rogue = TokenIssuer(KeyRing([SigningKey.generate()])).for_tenant("acme", "orders").token
    with BackgroundServer(agent.app) as server:
        bare, spoofed = post(server.url), post(server.url, {"X-Tenant": "acme"})
        forged = post(server.url, {"X-Reach-Token": rogue, "X-Tenant": "acme"})
        registry = MemoryRegistry()
        registry.put_agent(AgentDescriptor(name="orders", endpoints=[server.url], capabilities=["query_order"]))
        async with ReachClient(registry, DirectTransport(), tenant="demo") as client:
            served = await client.reach("query_order", {"order_id": "A1"})
    for refused in (bare, spoofed, forged):
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "invalid_token"
    assert served.ok and ran == ["demo"]


async def test_the_open_mode_is_named_and_warns_at_start(caplog: pytest.LogCaptureFixture) -> None:
    """tokens="open" verifies nothing and says so at start; any other word, or open on L1/L3, is a ConfigError."""
    agent, ran = orders(tokens="open")
    with caplog.at_level(logging.WARNING, logger="reach_plugins.agent"), BackgroundServer(agent.app) as server:
        reply = post(server.url)
    assert reply.status_code == 200 and ran == ["acme"]
    assert any("runs OPEN" in record.getMessage() for record in caplog.records)
    with pytest.raises(errors.ConfigError, match="'open'"):
        ReachAgent("orders", tokens="off")  # type: ignore[arg-type]
    for trust in ("L1", "L3"):
        with pytest.raises(errors.ConfigError, match="verifies every token"):
            ReachAgent("orders", tokens="open", trust=trust)  # type: ignore[arg-type]


def test_a_capability_needing_approval_is_refused_without_an_approver() -> None:
    """danger_level high or require_approval on an agent without approver= is NoApprover, by decorator or offer."""
    agent = ReachAgent("payments")
    with pytest.raises(errors.NoApprover, match="approver="):
        agent.capability("transfer", danger_level="high")(lambda amount: amount)
    with pytest.raises(errors.NoApprover):
        agent.offer(Capability(name="refund", require_approval=True))(lambda: None)
    assert agent.capabilities == []
    guarded = ReachAgent("payments", approver=lambda request: ApprovalDecision(True, "cfo"))
    guarded.capability("transfer", danger_level="high")(lambda amount: amount)
    assert [cap.name for cap in guarded.capabilities] == ["transfer"]


async def test_a_capability_needing_approval_never_runs_without_one_at_call_time() -> None:
    """Even if the approver is gone after registration, the call is ApprovalRequired and the handler never runs."""
    agent = ReachAgent("payments", approver=lambda request: True)
    ran: list[int] = []
    agent.capability("transfer", danger_level="high")(lambda amount: ran.append(amount))
    agent._approval = None  # what registration refuses: a capability needing approval and no approver
    with BackgroundServer(agent.app) as server:
        registry = MemoryRegistry()
        registry.put_agent(agent.descriptor(server.url))
        async with ReachClient(registry, DirectTransport(), tenant="demo") as client:
            reply = await client.reach("transfer", {"amount": 10**6})
    assert ran == [] and reply.error is not None and reply.error.type == "approval_required"
    assert "has no approver; nothing was executed" in reply.error.message


def test_reach_issuer_refuses_a_config_without_tenants(tmp_path: Path) -> None:
    """Without tenants the issuer would sign for anyone as any tenant: `reach issuer` exits 2 naming --allow-open."""
    config = write_config(tmp_path / "open.yaml", {"orders": ["http://127.0.0.1:9"]})
    done = subprocess.run(
        [sys.executable, "-c", CLI, "issuer", "--config", str(config), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--allow-open" in done.stdout
    with pytest.raises(errors.ConfigError, match="no 'tenants:' section"):
        create_issuer_app(config, environ={})


def test_an_open_issuer_is_chosen_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With allow_open the issuer serves any caller as the tenant it names, and warns at start."""
    config = write_config(tmp_path / "open.yaml", {"orders": ["http://127.0.0.1:9"]})
    with caplog.at_level(logging.WARNING, logger="reach_plugins.server.issuer"):
        app = create_issuer_app(config, environ={}, allow_open=True)
    with BackgroundServer(app) as issuer:
        reply = httpx.post(f"{issuer.url}/v1/tokens", json={"audience": "orders", "tenant": "acme"})
    assert reply.status_code == 200 and "runs OPEN" in caplog.text


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://127.0.0.1/.well-known/jwks.json", "https"),
        ("http:///.well-known/jwks.json", "https"),
        ("http://127.0.0.1:bad/jwks", "not a URL"),
    ],
)
def test_key_and_token_urls_must_be_https_or_loopback(url: str, problem: str) -> None:
    """JWKS and issuer URLs: https, or plain http to a loopback address; anything else is a ConfigError."""
    with pytest.raises(errors.ConfigError, match=problem):
        RemoteJwks(url)
    with pytest.raises(errors.ConfigError, match=problem):
        RemoteTokens(url)
    for fine in ("https://127.0.0.1:8090", "http://127.0.0.1:8090", "http://127.0.0.2:8090"):
        assert RemoteTokens(fine).url == f"{fine}/v1/tokens"
        assert RemoteJwks(f"{fine}/.well-known/jwks.json").url.startswith(fine)


class Clock:
    """A settable wall clock."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_tokens_are_verified_with_a_leeway_and_skew_has_its_own_code() -> None:
    """A fresh token passes on a clock up to the leeway off either way; beyond it the refusal is TokenClockSkew
    (an InvalidToken, code token_clock_skew) for exp and iat alike; the verifier keeps the observed offset."""
    issued_at = 1_800_000_000.0
    ring = KeyRing([SigningKey.generate()])
    token = TokenIssuer(ring, clock=lambda: issued_at).for_tenant("acme", "orders").token
    for offset in (-(LEEWAY - 1), LEEWAY - 1, 300 + LEEWAY - 1):
        clock = Clock(issued_at + offset)
        verifier = TokenVerifier(issuer="reach", keys=RingKeys(ring), clock=clock)
        assert (await verifier.verify(token, audience="orders")).tenant == "acme"
        assert verifier.clock_offset == pytest.approx(-offset, abs=1)
    for offset, match in ((-(LEEWAY + 5), "ahead of this agent's clock"), (300 + LEEWAY + 5, "expired")):
        verifier = TokenVerifier(issuer="reach", keys=RingKeys(ring), clock=Clock(issued_at + offset))
        with pytest.raises(errors.TokenClockSkew, match=match) as refused:
            await verifier.verify(token, audience="orders")
        assert refused.value.code == "token_clock_skew" and isinstance(refused.value, errors.InvalidToken)
    assert TokenVerifier(issuer="reach", keys=RingKeys(ring), leeway=90).leeway == 90


async def test_an_agent_reports_its_clock_offset_in_health() -> None:
    """An agent 400 s ahead of the issuer (5-minute tokens) refuses a fresh token with token_clock_skew, runs nothing,
    and reports the offset (-400 s: the issuer is behind it) in /healthz."""
    ring = KeyRing([SigningKey.generate()])
    issuer = TokenIssuer(ring)
    ahead = TokenVerifier(issuer="reach", keys=RingKeys(ring), clock=lambda: issuer.clock() + 400)
    agent, ran = orders(tokens=ahead)
    with BackgroundServer(agent.app) as server:
        before = httpx.get(f"{server.url}/healthz").json()
        refused = post(server.url, {"X-Reach-Token": issuer.for_tenant("acme", "orders").token})
        after = httpx.get(f"{server.url}/healthz").json()
    assert before["clock_offset_s"] is None and ran == []
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "token_clock_skew"
    assert after["clock_offset_s"] == pytest.approx(-400, abs=2)
