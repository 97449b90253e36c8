"""DESIGN 11.1/11.2 through the pipeline on virtual time: what follows not_delivered and unknown, and keyed claims."""

from __future__ import annotations

import random
from typing import Any

import pytest
from core_fakes import FakeAgent, FakeRouter, make_agent

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import InvalidToken, OutcomeUnknown
from reach_plugins.model import AgentDescriptor, ErrorInfo, Idempotency, ReachRequest, RetryPolicy
from reach_plugins.policy.deadline import RETRY_ROOM_SAMPLES
from reach_plugins.policy.dedup import payload_hash
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.dedup import MemoryDedupStore, store_key
from reach_plugins.telemetry.spans import EVENT_RETRY
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, MockTransport, Reply


def setup(
    *agents: AgentDescriptor, honours_idempotency: bool = False, owns_retries: bool = False
) -> tuple[FakeClock, FakeAgent, Pipeline, MemoryDedupStore]:
    clock = FakeClock()
    fake = FakeAgent(clock, honours_idempotency=honours_idempotency)
    fake.transport.owns_retries = owns_retries
    router = FakeRouter(list(agents) or [make_agent()])
    store = MemoryDedupStore(budget=DEFAULT_BUDGET, clock=clock)
    pipeline = Pipeline(router=router, transport=fake.transport, store=store, clock=clock, rng=random.Random(3))
    router.is_available = pipeline.is_available
    return clock, fake, pipeline, store


def order(op: str = "op-1", **fields: Any) -> ReachRequest:
    return ReachRequest(capability="query_order", payload={"order_id": "A1", "op": op}, **fields)


def served(fake: FakeAgent) -> list[str]:
    return [call.instance.instance_id for call in fake.calls]


async def test_not_delivered_fails_over_at_once_without_spending_a_retry() -> None:
    """Two refused connects and a backpressure answer: the fourth instance serves, with no backoff and 1 attempt."""
    agent = make_agent(instances=4, retry=RetryPolicy(max_attempts=1))
    clock, fake, pipeline, _ = setup(agent)
    fake.script("orders-0", "connect")
    fake.script("orders-1", "connect")
    fake.script("orders-2", "backpressure:5")
    start = clock.now()
    response = await pipeline.run(order(), trace=True)
    assert response.ok and len(set(served(fake))) == len(served(fake)) == 4
    assert clock.now() - start == pytest.approx(4 * fake.latency)
    assert response.trace is not None
    assert EVENT_RETRY not in [event["event"] for event in response.trace.events]


async def test_keyed_unknown_is_retried_on_the_same_instance_only() -> None:
    """A reset after send: the keyed retry goes back to the instance that may have it, never to another one."""
    _, fake, pipeline, _ = setup(honours_idempotency=True)
    fake.script("orders-0", "reset")
    response = await pipeline.run(order(idempotency_key="k-1"))
    assert response.ok and served(fake) == ["orders-0", "orders-0"]
    assert fake.executions["op-1"] == 1


async def test_keyed_unknown_whose_instance_is_gone_ends_outcome_unknown() -> None:
    """Lost answer, then the instance refuses: OutcomeUnknown carrying the key; no other instance runs it."""
    _, fake, pipeline, _ = setup()
    fake.script("orders-0", "lost", "connect", "connect", "connect")
    response = await pipeline.run(order(idempotency_key="k-2"))
    assert response.status == "fail" and response.error is not None
    assert response.error.type == "outcome_unknown"
    assert set(served(fake)) == {"orders-0"} and fake.executions["op-1"] == 1
    with pytest.raises(OutcomeUnknown, match="k-2"):
        response.raise_for_status()


async def test_unkeyed_unknown_may_run_elsewhere() -> None:
    """Without a key (retryable capability) a lost answer is retried like a failure: the old rule stands."""
    _, fake, pipeline, _ = setup()
    fake.script("orders-0", "reset", "connect", "connect")
    response = await pipeline.run(order())
    assert response.ok and response.instance != "orders-0"


async def test_shared_idempotency_lets_an_unknown_key_move_to_another_instance() -> None:
    """An agent declaring shared idempotency checks the key on every instance: the retry may fail over."""
    agent = make_agent(idempotency=Idempotency(shared=True))
    _, fake, pipeline, _ = setup(agent, honours_idempotency=True)
    fake.script("orders-0", "lost", "connect", "connect", "connect")
    response = await pipeline.run(order(idempotency_key="k-3"))
    assert response.ok and response.instance != "orders-0"
    assert fake.executions["op-1"] == 1


async def test_a_hop_that_owns_retries_turns_a_keyed_unknown_into_outcome_unknown() -> None:
    """Through a gateway or node the client does not retry: a lost answer on a keyed call is OutcomeUnknown."""
    _, fake, pipeline, _ = setup(owns_retries=True)
    fake.script("*", "reset")
    response = await pipeline.run(order(idempotency_key="k-4"))
    assert response.error is not None and response.error.type == "outcome_unknown"
    assert len(fake.calls) == 1


async def test_a_lost_answer_leaves_the_key_unknown_and_a_later_caller_is_pinned() -> None:
    """The next request with the key goes only to the instance that may have run it (not failed over)."""
    _, fake, pipeline, _ = setup(honours_idempotency=True)
    fake.script("orders-0", "lost")
    fake.default("connect", "orders-0")
    first = await pipeline.run(order(idempotency_key="k-5"))
    assert first.error is not None and first.error.type == "outcome_unknown"
    # the instance is still gone: the key is never run elsewhere
    sent = len(fake.calls)
    again = await pipeline.run(order(idempotency_key="k-5"))
    assert again.error is not None and again.error.type == "outcome_unknown"
    assert set(served(fake)[sent:]) <= {"orders-0"}
    fake.default("ok", "orders-0")
    # the instance is back: the retry goes there and its answer (its own replay) is the result
    third = await pipeline.run(order(idempotency_key="k-5"))
    assert third.ok and third.instance == "orders-0" and fake.executions["op-1"] == 1


async def test_a_crashed_owner_blocks_its_key_for_its_lease_only() -> None:
    """An owner that never settles: its twin waits at most deadline + grace, then takes the key over pinned."""
    clock, _, pipeline, store = setup(honours_idempotency=True)
    request = order(idempotency_key="k-6", timeout_ms=3000)
    key = store_key(request, "k-6")
    assert (
        await store.begin(key, payload_hash(request), 3.0 + 2.0, window=300, where="orders/orders-1")
    ).state == "new"
    start = clock.now()
    response = await pipeline.run(order(idempotency_key="k-6", timeout_ms=10_000))
    assert response.ok and response.instance == "orders-1"
    assert clock.now() - start <= 5.0 + 0.1


async def test_replays_are_copies() -> None:
    """Two callers replayed from one stored result never share a mutable object (nor with the first caller)."""
    _, fake, pipeline, _ = setup()
    first = await pipeline.run(order(idempotency_key="k-7"))
    first.data["payload"]["order_id"] = "mutated by the first caller"
    second = await pipeline.run(order(idempotency_key="k-7"))
    second.data["payload"]["order_id"] = "mutated by the second caller"
    third = await pipeline.run(order(idempotency_key="k-7"))
    assert third.data["payload"]["order_id"] == "A1" and fake.executions["op-1"] == 1


async def test_failing_over_a_refused_connect_spends_no_retry_budget() -> None:
    """Refused connects that fail over at once leave the retry budget as it was; retries that fail spend it."""
    agent = make_agent(instances=2)
    _, fake, pipeline, _ = setup(agent)
    budget = pipeline._engine.guards.get(agent, 0.0).budget
    before = budget.tokens
    fake.default("connect", "orders-0")
    for n in range(4):
        assert (await pipeline.run(order(op=f"op-{n}"))).ok
    assert fake.sent["orders-0"] >= 1 and budget.tokens >= before
    fake.default("503")
    await pipeline.run(order(op="x"))
    assert budget.tokens < before


async def test_an_instance_refusing_valid_tokens_is_failed_over_and_counted() -> None:
    """orders-0 answers 401 invalid_token (its clock is off): the call fails over at once, orders-0's breaker
    counts each refusal and opens, and a call refused by every instance still ends with the refusal."""
    clock = FakeClock()
    agent = make_agent(retry=RetryPolicy(max_attempts=1))
    served: list[str] = []
    refusing = {"orders-0"}

    async def handle(call: Call) -> Reply:
        served.append(call.instance.instance_id)
        if call.instance.instance_id in refusing:
            error = ErrorInfo(type="invalid_token", message="the token expired at 1700000000 (unix time)")
            return Reply(status="fail", status_code=401, error=error)
        return Reply(status="success", data={"ok": True}, instance=call.instance.instance_id)

    router = FakeRouter([agent])
    pipeline = Pipeline(router=router, transport=MockTransport(handle), clock=clock, rng=random.Random(1))
    router.is_available = pipeline.is_available
    for n in range(30):
        response = await pipeline.run(order(f"op-{n}"))
        assert response.ok and response.instance != "orders-0"
    assert served.count("orders-0") == agent.circuit_breaker.min_calls  # then its breaker opened
    refusing.update({"orders-1", "orders-2"})
    await clock.sleep(120)
    with pytest.raises(InvalidToken):
        (await pipeline.run(order("op-x"))).raise_for_status()


async def test_a_keyed_attempt_leaves_its_retries_time_once_the_latency_is_known() -> None:
    """A hung attempt takes the whole deadline while the capability's latency is unknown; after 20 answers of
    10 ms it is cut at its share of the deadline (3 s / 3 attempts) and retried there with its key."""
    clock, fake, pipeline, _ = setup(make_agent(instances=1), honours_idempotency=True)
    fake.script("orders-0", "hang")
    cold = await pipeline.run(order("op-cold", idempotency_key="k-cold", timeout_ms=3000))
    assert cold.status == "timeout"
    for n in range(RETRY_ROOM_SAMPLES):
        assert (await pipeline.run(order(f"op-{n}", idempotency_key=f"k-{n}", timeout_ms=3000))).ok
    fake.script("orders-0", "hang")
    start = clock.now()
    response = await pipeline.run(order("op-h", idempotency_key="k-h", timeout_ms=3000), trace=True)
    assert response.ok and response.trace is not None
    first, second = response.trace.attempts
    assert (first.outcome, first.duration_ms) == ("timeout", pytest.approx(1000.0))
    assert second.outcome == "success" and clock.now() - start < 1.5
