"""Review of the merged pipeline: quotas, turns and dedup in the order issue 30 asks, on unary and stream paths."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reach_plugins import AgentDescriptor, ReachClient
from reach_plugins.attempts.quotas import Quotas
from reach_plugins.config.quotas import QuotaConfig
from reach_plugins.errors import RateLimited
from reach_plugins.model import Instance, ReliefPolicy
from reach_plugins.policy.gcra import QuotaLayer, Refusal
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing.affinity import InstanceKey
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.stores.quotas import MemoryQuotaStore
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, EventStream, MockTransport, StreamEvent
from reach_plugins.wire.body import refusal
from reach_plugins.wire.headers import ERROR_TYPE, RETRY_AFTER
from transports.gateway.transport import _error as gateway_error
from transports.grpcnode.transport import _refusal as node_refusal

ORDERS: dict[str, Any] = {
    "name": "orders",
    "endpoints": ["http://127.0.0.1:9"],
    "capabilities": [{"name": "query_order"}],
}


def echo(call: Call) -> dict[str, Any]:
    return {"ok": True}


class Recorded(MemoryQuotaStore):
    """A memory quota store that writes each acquire and release into a shared log."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    async def acquire(self, layers: Sequence[QuotaLayer], share: float, lease: str, ttl: float) -> Refusal | None:
        self.log.append("admit")
        return await super().acquire(layers, share, lease, ttl)

    async def release(self, layers: Sequence[QuotaLayer], lease: str) -> None:
        self.log.append("leave")
        await super().release(layers, lease)


async def client_logging(log: list[str], config: QuotaConfig) -> ReachClient:
    registry = MemoryRegistry()
    await registry.register_agent(AgentDescriptor.model_validate(ORDERS))
    quotas = Quotas(config, store=Recorded(log))
    client = ReachClient(registry, MockTransport(echo), tenant="demo", quotas=quotas, clock=FakeClock())
    relief = client.router.relief
    assert relief is not None
    started, ended = relief.turn_started, relief.turn_ended

    def turn_started(conversation: ScopedKey, where: InstanceKey) -> None:
        log.append("turn start")
        started(conversation, where)

    def turn_ended(conversation: ScopedKey, now: float) -> None:
        log.append("turn end")
        ended(conversation, now)

    relief.turn_started = turn_started  # type: ignore[method-assign]
    relief.turn_ended = turn_ended  # type: ignore[method-assign]
    return client


ORDER = ["turn start", "admit", "leave", "turn end"]


@pytest.mark.parametrize("streamed", [False, True])
async def test_admit_turn_start_turn_end_leave_on_both_paths(streamed: bool) -> None:
    """A conversation's call: its turn starts as it is routed, the quota admits it, gives its slot back once the
    call is over, then the turn ends (the lease never outlives the turn, the turn covers every await)."""
    log: list[str] = []
    client = await client_logging(log, QuotaConfig.model_validate({"tenants": {"demo": {"concurrency": 2}}}))
    try:
        if streamed:
            async for _ in client.stream("query_order", session_id="s1"):
                pass
        else:
            assert (await client.reach("query_order", session_id="s1")).ok
        assert log == ORDER
    finally:
        await client.aclose()


async def test_a_replayed_duplicate_is_not_charged_to_the_quota() -> None:
    """A retry with the same idempotency key is answered from the dedup store: it sends nothing, so the quota
    (like the per-attempt limits) does not charge it and does not refuse it."""
    log: list[str] = []
    config = QuotaConfig.model_validate({"tenants": {"demo": {"rate": 1, "burst": 1}}})
    client = await client_logging(log, config)
    try:
        first = await client.reach("query_order", idempotency_key="order-1")
        again = await client.reach("query_order", idempotency_key="order-1")
        assert first.ok and again.ok and again.attempts == 0
        assert len(client.transport.calls) == 1  # type: ignore[attr-defined]
        with pytest.raises(RateLimited):
            await client.reach("query_order", idempotency_key="order-2")
    finally:
        await client.aclose()


class Gated(MemoryQuotaStore):
    """A quota store whose answers wait for ``gate`` (a shared store's round trip, held open by the test)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0

    async def acquire(self, layers: Sequence[QuotaLayer], share: float, lease: str, ttl: float) -> Refusal | None:
        self.waiting += 1
        await self.gate.wait()
        return await super().acquire(layers, share, lease, ttl)


def chat_instance(instance_id: str, clock: FakeClock, load: float = 0.0) -> Instance:
    return Instance(
        agent="chat",
        instance_id=instance_id,
        endpoint=f"http://127.0.0.1:{9000 + int(instance_id[1:])}",
        last_heartbeat=clock(),
        load=load,
    )


async def test_relief_does_not_move_a_conversation_whose_turn_is_routed_but_not_sent_yet() -> None:
    """Turn A of s-0 is routed to c1 and waits on the quota store; c1 turns hot and turn B of s-0 is routed:
    A is in flight on c1, so B must stay on c1 too (relief never splits a conversation mid-call)."""
    clock = FakeClock(1_000.0)
    registry = MemoryRegistry(clock=clock)
    await registry.register_agent(AgentDescriptor.model_validate({"name": "chat", "capabilities": ["talk"]}))
    await registry.register_instance(chat_instance("c1", clock))
    store = Gated()
    quotas = Quotas(QuotaConfig.model_validate({"other": {"concurrency": 10}}), store=store)
    relief = ReliefPolicy(hold=0.0, idle=0.0, share=1.0, check_every=0.0)

    def answer(call: Call) -> dict[str, Any]:
        return {"by": call.instance.instance_id}

    async with ReachClient(
        registry, MockTransport(answer), clock=clock, tokens=False, quotas=quotas, relief=relief
    ) as client:
        assert (await client.reach("talk", session_id="s-0")).instance == "c1"
        await registry.register_instance(chat_instance("c2", clock))
        store.gate.clear()
        first = asyncio.create_task(client.reach("talk", session_id="s-0"))
        while store.waiting < 2:
            await asyncio.sleep(0)
        await registry.heartbeat("chat", "c1", 1, load=0.95)
        await registry.heartbeat("chat", "c2", 1, load=0.1)
        second = asyncio.create_task(client.reach("talk", session_id="s-0"))
        while store.waiting < 3:
            await asyncio.sleep(0)
        store.gate.set()
        replies = await asyncio.wait_for(asyncio.gather(first, second), 5.0)
    assert [reply.instance for reply in replies] == ["c1", "c1"]
    assert not any(reply.context_restore for reply in replies)


@given(st.one_of(st.floats(), st.sampled_from(["nan", "inf", "-inf", "-5", "1e400", "0.5", "2"])))
def test_a_hops_retry_after_is_a_finite_non_negative_number_or_none(told: object) -> None:
    """A node (its trailer) or a gateway (its JSON body) telling a hostile ``retry_after`` (nan, inf, negative)
    does not make it into the refusal: a caller sleeping on it, or a gateway writing ``Retry-After``, would fail."""
    text = told if isinstance(told, str) else repr(told)
    trailers = grpc.aio.Metadata((ERROR_TYPE, "rate_limited"), (RETRY_AFTER, text))
    failed = grpc.aio.AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(), trailers, "the quota")
    from_node = node_refusal(failed)
    told_by_gateway = gateway_error({"type": "rate_limited", "message": "q", "retry_after": float(text)}, 429)
    from_gateway = refusal(told_by_gateway.type, told_by_gateway.message, told_by_gateway.retry_after)
    assert isinstance(from_node, RateLimited) and isinstance(from_gateway, RateLimited)
    for retry_after in (from_node.retry_after, from_gateway.retry_after):
        assert retry_after is None or (math.isfinite(retry_after) and retry_after >= 0)


class Ticking(MockTransport):
    """Streams one data event per item put in ``ticks`` (the test paces the agent), ``end`` after six."""

    def __init__(self) -> None:
        super().__init__(echo)
        self.ticks: asyncio.Queue[None] = asyncio.Queue()

    async def stream(self, call: Call) -> EventStream:
        for n in range(6):
            await self.ticks.get()
            yield StreamEvent("data", {"n": n})
        yield StreamEvent("end")


async def test_a_stream_longer_than_its_lease_keeps_its_concurrency_slot() -> None:
    """A stream without an explicit deadline runs as long as events come (only ``stream_idle`` bounds a gap);
    its lease, made for the default deadline, is renewed as it flows: 40 s in, a second call is still refused."""
    clock = FakeClock()
    registry = MemoryRegistry()
    await registry.register_agent(AgentDescriptor.model_validate(ORDERS))
    config = QuotaConfig.model_validate({"tenants": {"demo": {"concurrency": 1}}})
    agent = Ticking()
    client = ReachClient(registry, agent, tenant="demo", quotas=config, clock=clock)
    try:
        events = client.stream("query_order")
        for _ in range(4):
            agent.ticks.put_nowait(None)
            await anext(events)
            clock.advance(10.0)
        with pytest.raises(RateLimited) as refused:
            await client.reach("query_order")
        assert "calls in flight" in refused.value.message
        for _ in range(2):
            agent.ticks.put_nowait(None)
        async for _ in events:
            pass
        assert (await client.reach("query_order")).ok
    finally:
        await client.aclose()
