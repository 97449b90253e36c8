"""The per-call shortcuts of the client path keep behaviour: timers, credentials, validators, ids, breaker sums."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from typing import Any

import pytest
from core_fakes import FakeRouter, make_agent
from hypothesis import given, settings
from hypothesis import strategies as st

from reach_plugins import ReachClient
from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.config.loader import TenantConfig
from reach_plugins.errors import ConfigError, InvalidPayload
from reach_plugins.ids import new_request_id
from reach_plugins.model import (
    AgentDescriptor,
    Auth,
    Capability,
    CircuitBreakerConfig,
    Hop,
    ReachRequest,
    Timeouts,
)
from reach_plugins.policy.breaker import CircuitBreaker
from reach_plugins.policy.validation import check_payload, compiled
from reach_plugins.registry.memory import MemoryRegistry
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import BaseTransport, Call, MockTransport, Reply


class Hanging(BaseTransport):
    """Never answers: only the core's timer, on the core's clock, ends its sends."""

    async def send(self, call: Call) -> Reply:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_virtual_time_keeps_the_core_timer_even_when_the_transport_has_one() -> None:
    """Under a fake clock the core still cuts a hanging attempt at its deadline: only real time trusts the transport."""
    clock = FakeClock()
    agent = make_agent(instances=1, timeouts=Timeouts(connect=1, response=2))
    pipeline = Pipeline(router=FakeRouter([agent]), transport=Hanging(), clock=clock, rng=random.Random(1))
    start = clock.now()
    response = await pipeline.run(ReachRequest(capability="query_order", timeout_ms=2500))
    assert response.status == "timeout"
    assert clock.now() - start == pytest.approx(2.5)


async def client_with(agent: AgentDescriptor, tenants: dict[str, TenantConfig] | None = None) -> ReachClient:
    registry = MemoryRegistry()
    await registry.register_agent(agent)
    transport = MockTransport(lambda call: {"credential": call.credential.type, "value": call.credential.value})
    return ReachClient(registry=registry, transport=transport, tenants=tenants, environ={"KEY": "s3cret"})


async def test_an_agent_without_auth_gets_no_credential() -> None:
    """An agent with the default auth is reached with an empty credential."""
    client = await client_with(AgentDescriptor(name="plain", endpoints=["http://plain"], capabilities=["ping"]))
    response = await client.reach("ping")
    assert response.data == {"credential": "none", "value": None}


async def test_a_tenant_credential_wins_over_an_agent_without_auth() -> None:
    """A tenant's own credential for an agent is used even when the agent itself declares no auth."""
    own = TenantConfig(agents="*", credentials={"plain": {"type": "bearer", "value_env": "KEY"}})
    agent = AgentDescriptor(name="plain", endpoints=["http://plain"], capabilities=["ping"])
    client = await client_with(agent, {"acme": own, "other": TenantConfig(agents="*")})
    assert (await client.reach("ping", tenant="acme")).data == {"credential": "bearer", "value": "s3cret"}
    assert (await client.reach("ping", tenant="other")).data == {"credential": "none", "value": None}


async def test_an_agent_with_auth_resolves_its_secret() -> None:
    """An agent whose auth names a secret gets it resolved from the environment on each call."""
    agent = AgentDescriptor(
        name="guarded",
        endpoints=["http://guarded"],
        capabilities=["ping"],
        auth=Auth(type="header", key="X-Key", value_env="KEY"),
    )
    client = await client_with(agent)
    assert (await client.reach("ping")).data == {"credential": "header", "value": "s3cret"}


def test_a_schema_is_compiled_once() -> None:
    """The same schema object yields the same compiled validator; a different one its own."""
    schema: dict[str, Any] = {"type": "object", "required": ["a"]}
    twin: dict[str, Any] = {"type": "object", "required": ["a"]}
    assert compiled(schema) is compiled(schema)
    assert compiled(twin) is not compiled(schema)


def test_an_invalid_schema_is_a_config_error() -> None:
    """A params_schema that is not a JSON Schema is a ConfigError naming the capability, not a jsonschema error."""
    capability = Capability(name="broken", params_schema={"type": "no-such-type"})
    with pytest.raises(ConfigError, match="params_schema of 'broken'"):
        check_payload(capability, {})


def test_a_payload_error_names_the_field() -> None:
    """A payload that breaks its schema is refused with the path of the field at fault."""
    capability = Capability(
        name="order",
        params_schema={"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}}},
    )
    with pytest.raises(InvalidPayload, match=r"items\[1\]"):
        check_payload(capability, {"items": [1, "two"]})


def test_request_ids_are_version_4_uuids() -> None:
    """Request ids are 32 hex digits of a random RFC 4122 version 4 UUID, all distinct."""
    ids = [new_request_id() for _ in range(2000)]
    parsed = [uuid.UUID(value) for value in ids]
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 and u.hex == v for u, v in zip(parsed, ids, strict=True))
    assert len(set(ids)) == len(ids)


def test_a_forked_child_makes_request_ids_of_its_own() -> None:
    """Ids are made in batches: a forked child must not hand out the rest of its parent's batch."""
    new_request_id()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(write, ",".join(new_request_id() for _ in range(300)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        theirs = set(pipe.read().split(","))
    os.waitpid(child, 0)
    assert len(theirs) == 300 and not theirs & {new_request_id() for _ in range(300)}


async def test_request_sets_exactly_the_options_given() -> None:
    """``ReachClient.request`` equals a ReachRequest built with every option spelled out."""
    client = await client_with(AgentDescriptor(name="plain", endpoints=["http://plain"], capabilities=["ping"]))
    options: dict[str, Any] = {
        "session_id": "s-1",
        "idempotency_key": "k",
        "timeout_ms": 900,
        "intent": "ask",
        "action": "go",
        "tenant": "acme",
        "hops": ["a/b"],
        "priority": "batch",
        "scope_tags": ["eu"],
        "retried_upstream": True,
    }
    built = client.request("ping", {"x": 1}, **options)
    expected = ReachRequest(
        request_id=built.request_id,
        capability="ping",
        payload={"x": 1},
        **{**options, "hops": [Hop(agent="a", capability="b")]},
    )
    assert built == expected
    bare = client.request("ping")
    assert bare == ReachRequest(request_id=bare.request_id, capability="ping")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 20.0), st.booleans()), min_size=1, max_size=60))
def test_breaker_running_totals_match_a_recount(calls: list[tuple[float, bool]]) -> None:
    """The breaker opens exactly when a recount of the calls still inside its window says it should."""
    config = CircuitBreakerConfig(window=10.0, buckets=5, min_calls=4, error_threshold=0.5)
    breaker = CircuitBreaker(config)
    now, seen = 1000.0, []
    for gap, failure in calls:
        now += gap
        permit = breaker.acquire(now)
        if permit is None or permit.probe:
            return
        breaker.record(permit, now, failure=failure, duration=0.01)
        seen.append((now, failure))
        head = int(now // 2.0)
        inside = [f for at, f in seen if head - int(at // 2.0) < 5]
        should_open = len(inside) >= 4 and sum(inside) / len(inside) >= 0.5
        assert breaker.state(now) == ("open" if should_open else "closed")
        if should_open:
            return


async def test_mock_transport_keeps_recent_calls_only() -> None:
    """MockTransport.calls keeps the last ``record`` calls (at most twice that), none with record=0."""
    agent = make_agent(instances=1)
    kept, silent = MockTransport(lambda call: {"n": call.attempt}, record=3), MockTransport(lambda call: 1, record=0)
    for transport in (kept, silent):
        pipeline = Pipeline(router=FakeRouter([agent]), transport=transport)
        requests = [ReachRequest(capability="query_order", request_id=f"r{n}") for n in range(10)]
        for request in requests:
            assert (await pipeline.run(request)).ok
    assert 3 <= len(kept.calls) <= 6 and [call.request.request_id for call in kept.calls][-3:] == ["r7", "r8", "r9"]
    assert silent.calls == []
    with pytest.raises(ConfigError, match="record="):
        MockTransport(lambda call: 1, record=-1)


async def test_mock_transport_bounds_an_async_handler_by_the_call_timeout() -> None:
    """A slow async handler behind MockTransport is cut at call.timeout by the core's timer."""

    async def slow(call: Call) -> dict[str, int]:
        await asyncio.sleep(5)
        return {}

    agent = make_agent(instances=1, timeouts=Timeouts(connect=0.05, response=0.05))
    pipeline = Pipeline(router=FakeRouter([agent]), transport=MockTransport(slow), rng=random.Random(1))
    started = asyncio.get_running_loop().time()
    response = await pipeline.run(ReachRequest(capability="query_order", timeout_ms=400))
    assert response.status == "timeout" and asyncio.get_running_loop().time() - started < 2
