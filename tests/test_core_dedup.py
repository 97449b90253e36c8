"""Idempotency keys and dedup: key resolution, the memory store, and single-flight through the pipeline."""

from __future__ import annotations

import asyncio

import pytest
from core_fakes import FakeAgent, FakeRouter, make_agent
from dedup_store_conformance import DedupStoreConformance, StoreFactory, answer, key

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import ConfigError, IdempotencyConflict, InvalidPayload
from reach_plugins.model import Capability, Idempotency, ReachRequest
from reach_plugins.policy.dedup import payload_hash, render_key, resolve_key
from reach_plugins.stores.budget import DEFAULT_BUDGET, MIB, Budget
from reach_plugins.stores.dedup import MemoryDedupStore
from reach_plugins.testing.clock import FakeClock


class TestMemoryDedupStore(DedupStoreConformance):
    """The in-memory store passes the shared store contract."""

    @pytest.fixture
    def make_store(self) -> StoreFactory:
        return lambda clock: MemoryDedupStore(budget=DEFAULT_BUDGET, clock=clock)


async def test_memory_store_is_bounded_by_size() -> None:
    """Past max_entries the oldest keys are dropped; the store never grows beyond its bound."""
    store = MemoryDedupStore(budget=Budget(max_entries=50, max_bytes=MIB), clock=FakeClock())
    for i in range(500):
        await store.begin(key(f"k{i}"), "h", 300)
        await store.complete(key(f"k{i}"), answer(i))
    assert len(store) == 50
    assert (await store.begin(key("k499"), "h", 300)).state == "done"
    assert (await store.begin(key("k0"), "h", 300)).state == "new"


async def test_memory_store_drops_expired_entries_to_make_room() -> None:
    """Expired keys leave first, so live keys are kept when room is needed."""
    clock = FakeClock()
    store = MemoryDedupStore(budget=Budget(max_entries=10, max_bytes=MIB), clock=clock)
    for i in range(10):
        await store.begin(key(f"old{i}"), "h", 1)
    clock.advance(2)
    await store.begin(key("fresh"), "h", 300)
    assert len(store) == 1


def test_memory_store_refuses_a_zero_bound() -> None:
    """A store that could hold no key is a configuration error."""
    with pytest.raises(ConfigError, match="max_entries"):
        MemoryDedupStore(budget=Budget(max_entries=0, max_bytes=MIB))


# --------------------------------------------------------------------------- key resolution


def test_template_fills_payload_fields() -> None:
    """``${params.x}`` (also nested) takes the payload's field; request fields fill by name."""
    request = ReachRequest(capability="create_ticket", payload={"wo": "W-9", "user": {"id": 4}}, tenant="acme")
    assert render_key("wo-${params.wo}/${params.user.id}@${tenant}", request) == "wo-W-9/4@acme"


def test_template_missing_field_names_it() -> None:
    """A template naming an absent payload field is an InvalidPayload that names the field."""
    request = ReachRequest(capability="create_ticket", payload={})
    with pytest.raises(InvalidPayload, match="'wo_number'"):
        render_key("${params.wo_number}", request)


@pytest.mark.parametrize("template", ["constant", "${body.x}"])
def test_bad_templates_are_config_errors(template: str) -> None:
    """A template without placeholders, or with an unknown one, is refused as configuration."""
    with pytest.raises(ConfigError):
        render_key(template, ReachRequest(capability="c", payload={"x": 1}))


def test_key_precedence_explicit_then_capability_then_agent() -> None:
    """The caller's key wins, then the capability template, then the agent's key_from; else no key."""
    cap = Capability(name="create_ticket", idempotency_key="${params.wo}")
    agent = make_agent("tickets", capability=cap, idempotency=Idempotency(key_from="${params.user}"))
    plain = make_agent("tickets", capability="create_ticket")
    request = ReachRequest(capability="create_ticket", payload={"wo": "W1", "user": "u7"})
    assert resolve_key(request.model_copy(update={"idempotency_key": "mine"}), agent, cap) == "mine"
    assert resolve_key(request, agent, cap) == "W1"
    assert resolve_key(request, agent, Capability(name="create_ticket")) == "u7"
    assert resolve_key(request, plain, plain.capabilities[0]) is None


def test_payload_hash_ignores_key_order_but_not_values() -> None:
    """The digest is canonical: field order does not matter, values do."""
    a = ReachRequest(capability="c", payload={"x": 1, "y": 2})
    b = ReachRequest(capability="c", payload={"y": 2, "x": 1})
    c = ReachRequest(capability="c", payload={"x": 1, "y": 3})
    assert payload_hash(a) == payload_hash(b) != payload_hash(c)


# --------------------------------------------------------------------------- through the pipeline


def ticket_setup(*, latency: float = 0.01, window: float = 300.0) -> tuple[FakeClock, FakeAgent, Pipeline]:
    clock = FakeClock()
    cap = Capability(name="create_ticket", idempotency_key="${params.wo}")
    agent = make_agent("tickets", capability=cap, idempotency=Idempotency(window=window))
    fake = FakeAgent(clock, latency=latency)
    return clock, fake, Pipeline(router=FakeRouter([agent]), transport=fake.transport, clock=clock)


def ticket(wo: str = "W-1", **extra: object) -> ReachRequest:
    return ReachRequest(capability="create_ticket", payload={"wo": wo, "op": wo, **extra})


async def test_repeated_key_returns_the_first_result_without_sending() -> None:
    """Within the window a repeated key is answered from the store; no agent is contacted."""
    _, fake, pipeline = ticket_setup()
    first = await pipeline.run(ticket())
    second = await pipeline.run(ticket(), trace=True)
    assert len(fake.calls) == 1
    assert second.data == first.data and second.ok
    assert second.attempts == 0
    assert second.trace is not None and second.trace.dedup_hit


async def test_hundred_concurrent_duplicates_make_exactly_one_send() -> None:
    """100 concurrent identical calls with one key: one send, everyone gets its answer (single-flight)."""
    _, fake, pipeline = ticket_setup(latency=2.0)
    responses = await asyncio.gather(*(pipeline.run(ticket()) for _ in range(100)))
    assert len(fake.calls) == 1
    assert fake.executions["W-1"] == 1
    assert all(r.ok and r.data == responses[0].data for r in responses)
    assert len({r.request_id for r in responses}) == 100


async def test_same_key_with_another_payload_is_a_conflict() -> None:
    """Reusing a key for a different payload raises IdempotencyConflict and sends nothing."""
    _, fake, pipeline = ticket_setup()
    await pipeline.run(ticket())
    with pytest.raises(IdempotencyConflict):
        await pipeline.run(ticket(priority="high"))
    assert len(fake.calls) == 1


async def test_failed_results_are_not_stored() -> None:
    """A business failure is not kept: a later request with the same key runs again."""
    _, fake, pipeline = ticket_setup()
    fake.script("tickets-0", "business")
    fake.default("ok")
    first = await pipeline.run(ticket())
    second = await pipeline.run(ticket())
    assert (first.status, second.status) == ("fail", "success")
    assert len(fake.calls) == 2


async def test_window_expiry_lets_the_key_run_again() -> None:
    """After the agent's idempotency window the same key is a new operation."""
    clock, fake, pipeline = ticket_setup(window=60)
    await pipeline.run(ticket())
    clock.advance(61)
    await pipeline.run(ticket())
    assert len(fake.calls) == 2


async def test_keys_are_scoped_by_tenant() -> None:
    """One tenant's key never answers another tenant's request."""
    _, fake, pipeline = ticket_setup()
    await pipeline.run(ticket().model_copy(update={"tenant": "a"}))
    await pipeline.run(ticket().model_copy(update={"tenant": "b"}))
    assert len(fake.calls) == 2


async def test_every_attempt_carries_the_same_key_downstream() -> None:
    """Retries send the same Idempotency-Key header as the first attempt."""
    _, fake, pipeline = ticket_setup()
    fake.script("*", "503", "503")
    response = await pipeline.run(ticket("W-42"))
    assert response.ok and len(fake.calls) == 3
    assert {call.headers["Idempotency-Key"] for call in fake.calls} == {"W-42"}


async def test_seed_duplicate_ticket_after_lost_reply() -> None:
    """Seed story: the agent executed, the reply was lost; the retry carries the key, so one ticket exists."""
    _, fake, pipeline = ticket_setup()
    fake.script("*", "lost")
    response = await pipeline.run(ticket("W-7"))
    again = await pipeline.run(ticket("W-7"))
    assert response.ok and again.ok
    assert len(fake.calls) == 2
    assert fake.executions["W-7"] == 1


async def test_not_retryable_capability_without_key_is_not_retried_after_a_lost_reply() -> None:
    """With no key, a capability marked retryable: false is not re-sent after a timeout (it may have run)."""
    clock = FakeClock()
    agent = make_agent("tickets", capability=Capability(name="create_ticket", retryable=False))
    fake = FakeAgent(clock)
    fake.script("*", "lost")
    pipeline = Pipeline(router=FakeRouter([agent]), transport=fake.transport, clock=clock)
    response = await pipeline.run(ReachRequest(capability="create_ticket", payload={"op": "t"}))
    assert response.status == "timeout"
    assert len(fake.calls) == 1 and fake.executions["t"] == 1


async def test_waiting_duplicate_gives_up_at_its_deadline() -> None:
    """A duplicate waiting on a slow twin raises DeadlineExceeded when its own deadline passes; nothing is sent."""
    from reach_plugins.errors import DeadlineExceeded

    _, fake, pipeline = ticket_setup(latency=20.0)
    owner = asyncio.create_task(pipeline.run(ticket()))
    await asyncio.sleep(0)
    with pytest.raises(DeadlineExceeded, match="in flight"):
        await pipeline.run(ticket().model_copy(update={"timeout_ms": 1000}))
    assert (await owner).ok
    assert len(fake.calls) == 1
