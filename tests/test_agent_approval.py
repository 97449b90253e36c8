"""Approval at the target: a dangerous reach runs at the agent only after its approver says yes, and is audited."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from reach_plugins import ReachClient, errors
from reach_plugins.agent import ApprovalDecision, ApprovalRequest, BackgroundServer, ReachAgent
from reach_plugins.registry import MemoryRegistry
from transports.direct import DirectTransport

Approver = Callable[[ApprovalRequest], Any]


def refunds_agent(approver: Approver | str, executed: list[str]) -> ReachAgent:
    agent = ReachAgent("payments", approver=approver)

    @agent.capability("refund_payment", danger_level="high", description="Refund a payment")
    def refund(payment_id: str) -> dict[str, str]:
        executed.append(payment_id)
        return {"refunded": payment_id}

    @agent.capability("query_payment", description="Look a payment up")
    def query(payment_id: str) -> dict[str, str]:
        executed.append(f"query:{payment_id}")
        return {"payment": payment_id}

    return agent


async def reach_it(server: BackgroundServer, capability: str, timeout_ms: int = 3000, **options: Any) -> Any:
    registry = MemoryRegistry()
    registry.put_agent(refunds_agent("http://127.0.0.1:9", []).descriptor(server.url))
    async with ReachClient(registry, DirectTransport(), tenant="acme") as client:
        return await client.reach(capability, {"payment_id": "P-1"}, timeout_ms=timeout_ms, **options)


@pytest.fixture
def served() -> Iterator[Callable[[Approver | str], tuple[BackgroundServer, list[str]]]]:
    servers: list[BackgroundServer] = []

    def serve(approver: Approver | str) -> tuple[BackgroundServer, list[str]]:
        executed: list[str] = []
        server = BackgroundServer(refunds_agent(approver, executed).app).start()
        servers.append(server)
        return server, executed

    yield serve
    for server in servers:
        server.stop()


async def test_approved_reach_runs_once_and_the_approver_sees_who_asks(served: Any) -> None:
    """The approver is asked with the verified tenant, caller and chain (not the X-Reach-Hops the caller wrote) and
    the whole payload; on yes the handler runs once."""
    asked: list[ApprovalRequest] = []

    async def approve(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        return ApprovalDecision(True, "alice@finance")

    server, executed = served(approve)
    response = await reach_it(server, "refund_payment", hops=["desk/handle_refund"])
    assert response.ok and response.data == {"refunded": "P-1"} and executed == ["P-1"]
    (request,) = asked
    assert (request.capability, request.tenant, request.caller) == ("refund_payment", "acme", "tenant:acme")
    assert request.chain == ("tenant:acme",) and request.verified and request.payload == {"payment_id": "P-1"}


async def test_denied_reach_is_a_business_error_naming_who_denied(
    served: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A denial never runs the handler; the caller reads who denied it and why; the decision is audited."""
    server, executed = served(lambda request: ApprovalDecision(False, "bob@risk", "refund above the daily limit"))
    with caplog.at_level(logging.INFO, logger="reach_plugins.agent.approval"):
        response = await reach_it(server, "refund_payment")
    assert executed == [] and response.status == "fail" and response.error is not None
    assert (
        response.error.type == "business"
        and "denied by bob@risk: refund above the daily limit" in response.error.message
    )
    with pytest.raises(errors.BusinessError):
        response.raise_for_status()
    [record] = [json.loads(r.getMessage()) for r in caplog.records if r.name == "reach_plugins.agent.approval"]
    assert (record["verdict"], record["agent"], record["capability"]) == ("denied", "payments", "refund_payment")
    assert (record["tenant"], record["by"], record["reason"]) == ("acme", "bob@risk", "refund above the daily limit")


async def test_an_approver_that_never_answers_ends_in_approval_required(served: Any) -> None:
    """No decision within the caller's deadline: nothing runs, the caller gets ApprovalRequired."""
    never = threading.Event()

    async def silent(request: ApprovalRequest) -> bool:
        await asyncio.to_thread(never.wait, 10)
        return True

    server, executed = served(silent)
    try:
        response = await reach_it(server, "refund_payment", timeout_ms=800)
    finally:
        never.set()
    assert executed == [] and response.error is not None and response.error.type == "approval_required"
    with pytest.raises(errors.ApprovalRequired, match="nothing was executed"):
        response.raise_for_status()


async def test_low_danger_capabilities_never_wait_for_approval(served: Any) -> None:
    """Only danger_level high / require_approval capabilities ask; others run at once."""
    server, executed = served(lambda request: pytest.fail("the approver must not be asked"))
    response = await reach_it(server, "query_payment")
    assert response.ok and executed == ["query:P-1"]


async def test_a_webhook_approver_decides_without_following_redirects(served: Any) -> None:
    """The approver can be a webhook URL (on 127.0.0.1 here): its JSON decides; a redirect is a denial."""
    calls: list[dict[str, Any]] = []

    async def decide(request: Request) -> JSONResponse:
        calls.append(await request.json())
        return JSONResponse({"approved": True, "by": "webhook"})

    async def moved(request: Request) -> JSONResponse:
        return JSONResponse({}, status_code=307, headers={"Location": "/decide"})

    app = Starlette(routes=[Route("/decide", decide, methods=["POST"]), Route("/moved", moved, methods=["POST"])])
    with BackgroundServer(app) as hook:
        server, executed = served(f"{hook.url}/decide")
        approved = await reach_it(server, "refund_payment")
        redirected_server, redirected_executed = served(f"{hook.url}/moved")
        redirected = await reach_it(redirected_server, "refund_payment")
    assert approved.ok and executed == ["P-1"] and calls[0]["capability"] == "refund_payment"
    assert redirected_executed == [] and redirected.error is not None and "HTTP 307" in redirected.error.message
    assert len(calls) == 1
