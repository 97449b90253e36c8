"""Loop guard: hop chains, cycles named, max hops; and the seeds' ping-pong through two pipelines."""

from __future__ import annotations

import pytest
from core_fakes import FakeRouter, make_agent

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import LoopDetected, ReachError
from reach_plugins.model import ErrorInfo, Hop, ReachRequest
from reach_plugins.policy.loopguard import check_length, check_target, hops_header, parse_hops_header
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, MockTransport, Reply


def hops(*names: str) -> list[Hop]:
    return [Hop.parse(name) for name in names]


def test_target_already_in_the_chain_names_the_cycle() -> None:
    """Reaching an (agent, capability) already visited fails with the cycle spelled out."""
    with pytest.raises(LoopDetected, match=r"a/ask -> b/answer -> a/ask"):
        check_target(hops("x/start", "a/ask", "b/answer"), "a", "ask")


def test_same_agent_other_capability_is_not_a_loop() -> None:
    """Only the same (agent, capability) pair is a loop."""
    check_target(hops("a/ask", "b/summarize"), "a", "summarize")


def test_chain_longer_than_max_hops_is_refused() -> None:
    """A chain that already holds max_hops hops cannot grow."""
    chain = hops(*(f"agent{i}/cap" for i in range(8)))
    with pytest.raises(LoopDetected, match="limit is 8"):
        check_length(chain, 8)
    check_length(chain[:7], 8)


def test_hops_header_round_trips() -> None:
    """X-Reach-Hops lists the chain plus this hop and parses back to the same hops."""
    header = hops_header(hops("a/ask"), "b", "answer")
    assert header == "a/ask,b/answer"
    assert parse_hops_header(header) == hops("a/ask", "b/answer")
    assert parse_hops_header(None) == []


async def test_pipeline_refuses_a_looping_request_without_sending() -> None:
    """A request whose target is already in its hops raises LoopDetected; the transport is never called."""
    transport = MockTransport(lambda call: {"ok": True})
    pipeline = Pipeline(router=FakeRouter([make_agent()]), transport=transport, clock=FakeClock())
    request = ReachRequest(capability="query_order", hops=hops("desk/triage", "orders/query_order"))
    with pytest.raises(LoopDetected, match="orders/query_order -> orders/query_order"):
        await pipeline.run(request)
    assert transport.calls == []


async def test_seed_ping_pong_between_two_agents_stops_on_the_second_lap() -> None:
    """Seed story: alpha asks beta, beta asks alpha back, forever; the hop chain stops it after two sends."""
    agents = [make_agent("alpha", capability="ask_alpha"), make_agent("beta", capability="ask_beta")]
    pipeline: Pipeline

    async def agent_side(call: Call) -> Reply:
        chain = parse_hops_header(call.headers["X-Reach-Hops"])
        other = "ask_beta" if call.agent.name == "alpha" else "ask_alpha"
        try:
            onward = await pipeline.run(ReachRequest(capability=other, hops=chain))
        except ReachError as exc:
            return Reply(status="fail", error=ErrorInfo(type="rejected", message=exc.message))
        return Reply(status="success" if onward.ok else "fail", data=onward.data, error=onward.error)

    transport = MockTransport(agent_side)
    pipeline = Pipeline(router=FakeRouter(agents), transport=transport, clock=FakeClock())
    response = await pipeline.run(ReachRequest(capability="ask_alpha"))
    assert response.status == "fail" and response.error is not None
    assert "alpha/ask_alpha -> beta/ask_beta -> alpha/ask_alpha" in response.error.message
    assert len(transport.calls) == 2
