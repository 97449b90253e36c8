"""The approver sees verified facts (DESIGN.md 11.4): caller, tenant and chain from the verified token, never from
``X-Reach-Hops``; the whole payload; and an audit record that is one JSON object, whatever the request fields hold.

Each case runs over the three ways to reach an agent: direct (real uvicorn), through a real gateway, and through a
real node (grpc.aio). The agent verifies tokens with its defaults (this process's issuer, which the in-process
gateway and node sign with).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from hop_support import TOKENS, write_config

from reach_plugins import ReachClient
from reach_plugins.agent import ApprovalDecision, ApprovalRequest, BackgroundServer, ReachAgent
from reach_plugins.gateway import create_app
from reach_plugins.node import build_node
from reach_plugins.security import default_issuer
from transports.direct import DirectTransport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

TENANTS = {"demo": {"token_env": "DEMO_TOKEN", "agents": "*"}}
FORGED_ID = 'r-1\napproval approved: payments/transfer request r-1 tenant=demo caller=billing by=cfo reason="ok"'
"""A request id that, spliced into a log format, would write an approval line of its own."""
PADDED = {"memo": "x" * 2000, "to": "mallory", "amount": 1_000_000}
"""A padded field in front: a cut of the payload's JSON at 500 characters would hide ``amount``."""


class Payments:
    """A payments agent whose approver records what it is shown and denies everything."""

    def __init__(self) -> None:
        self.asked: list[ApprovalRequest] = []
        self.ran: list[dict[str, Any]] = []
        self.agent = ReachAgent("payments", approver=self.deny)

        @self.agent.capability("transfer", danger_level="high")
        def transfer(to: str, amount: int, memo: str = "") -> dict[str, Any]:
            self.ran.append({"to": to, "amount": amount})
            return {"sent": amount}

    def deny(self, request: ApprovalRequest) -> ApprovalDecision:
        self.asked.append(request)
        return ApprovalDecision(False, "risk-desk", "denied in this test")


@pytest.fixture
def payments() -> Iterator[tuple[Payments, BackgroundServer]]:
    agent = Payments()
    with BackgroundServer(agent.agent.app) as server:
        yield agent, server


@asynccontextmanager
async def client_over(hop: str, url: str, tmp_path: Path) -> AsyncIterator[ReachClient]:
    """A client of tenant demo reaching payments at ``url`` directly, through a real gateway, or a real node."""
    agents = {"payments": {"endpoints": [url], "capabilities": ["transfer"]}}
    config = str(write_config(tmp_path / f"{hop}.yaml", agents, TENANTS))
    if hop == "direct":
        async with ReachClient(config, DirectTransport(), tenant="demo", environ=TOKENS) as client:
            yield client
    elif hop == "gateway":
        with BackgroundServer(create_app(config, environ=TOKENS)) as gateway:
            transport = GatewayTransport(gateway.url, token=TOKENS["DEMO_TOKEN"])
            async with ReachClient(config, transport, tenant="demo", environ=TOKENS) as client:
                yield client
    else:
        async with build_node(config, environ=TOKENS) as node:
            transport = GrpcNodeTransport(node.target, token=TOKENS["DEMO_TOKEN"])
            async with ReachClient(config, transport, tenant="demo", environ=TOKENS) as client:
                yield client


def _audit(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """Every approval audit line, each of which must be one JSON object."""
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "reach_plugins.agent.approval"]


@pytest.mark.parametrize("hop", ["direct", "gateway", "node"])
async def test_the_approver_sees_the_verified_chain_the_whole_payload_and_one_json_audit_line(
    hop: str, payments: tuple[Payments, BackgroundServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller claiming X-Reach-Hops 'billing/pay', padding the payload and writing a request id with a newline and
    a fake 'approved by=cfo' line: the approver sees caller tenant:demo from the token, amount 1000000 in the
    payload, and the log holds exactly one denial, as JSON, whose request_id is the caller's string verbatim."""
    agent, server = payments
    with caplog.at_level(logging.INFO, logger="reach_plugins.agent.approval"):
        async with client_over(hop, server.url, tmp_path) as client:
            request = client.request("transfer", PADDED, hops=["billing/pay"]).model_copy(
                update={"request_id": FORGED_ID}
            )
            reply = await client.send(request)
    assert reply.status == "fail" and reply.error is not None and "denied by risk-desk" in reply.error.message
    assert agent.ran == []
    (asked,) = agent.asked
    assert asked.verified and (asked.tenant, asked.caller) == ("demo", "tenant:demo")
    assert asked.chain == ("tenant:demo",) and "billing" not in json.dumps(asked.chain)
    assert asked.payload == PADDED and asked.payload["amount"] == 1_000_000
    [record] = _audit(caplog)
    assert (record["verdict"], record["by"], record["caller"], record["chain"]) == (
        "denied",
        "risk-desk",
        "tenant:demo",
        ["tenant:demo"],
    )
    assert record["request_id"] == FORGED_ID
    lines = [line for r in caplog.records for line in r.getMessage().splitlines()]
    assert not any("by=cfo" in line and not line.startswith("{") for line in lines)


async def test_a_forged_hops_header_on_a_raw_call_is_not_what_the_approver_sees(
    payments: tuple[Payments, BackgroundServer],
) -> None:
    """A raw POST with a valid token for tenant demo and X-Reach-Hops naming billing: caller and chain are the
    token's."""
    agent, server = payments
    token = default_issuer().for_tenant("demo", "payments").token
    reply = httpx.post(
        f"{server.url}/reach",
        json={"capability": "transfer", "payload": PADDED, "request_id": FORGED_ID},
        headers={"X-Reach-Token": token, "X-Reach-Hops": "billing/pay,billing/approve"},
    )
    assert reply.status_code == 200 and reply.json()["error"]["type"] == "business"
    (asked,) = agent.asked
    assert (asked.caller, asked.chain, asked.request_id) == ("tenant:demo", ("tenant:demo",), FORGED_ID)


async def test_an_a2a_message_id_with_a_newline_forges_no_audit_line(
    payments: tuple[Payments, BackgroundServer], caplog: pytest.LogCaptureFixture
) -> None:
    """An A2A message/send whose messageId carries a newline and an 'approved by=cfo' line: the approver is asked
    once, the audit is one JSON denial keeping the messageId verbatim, and nothing ran."""
    agent, server = payments
    token = default_issuer().for_tenant("demo", "payments").token
    message = {"messageId": FORGED_ID, "role": "user", "parts": [{"kind": "data", "data": PADDED}]}
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}
    with caplog.at_level(logging.INFO, logger="reach_plugins.agent.approval"):
        reply = httpx.post(f"{server.url}/a2a", json=rpc, headers={"X-Reach-Token": token})
    assert reply.status_code == 200 and agent.ran == []
    [record] = _audit(caplog)
    assert (record["verdict"], record["request_id"], record["caller"]) == ("denied", FORGED_ID, "tenant:demo")
    assert all(r.getMessage().startswith("{") for r in caplog.records if r.name == "reach_plugins.agent.approval")
