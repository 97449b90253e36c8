"""The router's view of each instance (``reach_plugins.routing.status``): every source folded in, in the router's
order, on a FakeClock; the breaker shown is the worst of the instance's per-tenant breakers."""

from __future__ import annotations

import json
import random

from core_fakes import FakeAgent, FakeRouter

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.model import AgentDescriptor, Capability, HealthCheck, Instance, ReachRequest
from reach_plugins.routing.probes import ProbeBook
from reach_plugins.routing.status import judge
from reach_plugins.testing.clock import FakeClock

NOW = 1_000.0


def _orders() -> AgentDescriptor:
    listed = [
        Instance(agent="orders", instance_id=f"orders-{i}", endpoint=f"http://127.0.0.1:{9100 + i}") for i in range(3)
    ]
    return AgentDescriptor(name="orders", capabilities=[Capability(name="query_order")], instances=listed)


async def test_one_tenants_open_breaker_shows_with_its_reopen_time() -> None:
    """Calls of tenant ``acme`` open orders-0's breaker: the view (acme's, or the worst of all tenants') says
    circuit open and when it reopens, tenant beta's says closed; once the wait is over it reads half-open and
    available again; the healthy peers read closed and available."""
    clock = FakeClock()
    fake = FakeAgent(clock)
    agent = _orders()
    router = FakeRouter([agent])
    pipeline = Pipeline(router=router, transport=fake.transport, clock=clock, rng=random.Random(1))
    router.is_available = pipeline.is_available
    fake.default("503", "orders-0")
    for _ in range(60):
        await pipeline.run(ReachRequest(capability="query_order", payload={"order_id": "A1"}, tenant="acme"))
    inst = agent.instances[0]
    guarded = pipeline.guarded("orders", "orders-0")
    assert guarded.breaker == "open" and guarded.reopens_in is not None
    assert 0 < guarded.reopens_in <= agent.circuit_breaker.open_wait
    assert guarded.window is not None and guarded.window[0] == 0
    assert guarded.window[1] < agent.pool.max_conns, "the failing instance's adaptive window narrowed"
    seen = judge(inst, NOW, alive=True, guarded=guarded)
    assert seen.reason == f"circuit open: reopens in {guarded.reopens_in:.1f}s"
    other = pipeline.guarded("orders", "orders-0", tenant="beta")
    assert other.breaker == "closed" and other.reopens_in is None, "another tenant's calls meet their own breaker"
    assert pipeline.guarded("orders", "orders-0", tenant="acme") == guarded
    peer = judge(agent.instances[1], NOW, alive=True, guarded=pipeline.guarded("orders", "orders-1"))
    assert peer.available and peer.breaker == "closed"
    clock.advance(guarded.reopens_in)
    later = judge(inst, NOW, alive=True, guarded=pipeline.guarded("orders", "orders-0"))
    assert later.breaker == "half_open" and later.available


def test_reasons_come_in_the_routers_order_and_never_name_an_endpoint() -> None:
    """Status, then lease, then probe: the first reason is the one the router acts on; a probe's error message
    (which names the endpoint) is cut to its kind."""
    book = ProbeBook(random.Random(1))
    check = HealthCheck()
    for at in (NOW, NOW + 5):
        book.alive(
            "orders",
            "orders-0",
            ok=False,
            why="ClientConnectorError: Cannot connect to host 127.0.0.1:9100",
            check=check,
            now=at,
        )
    probe = book.last("orders", "orders-0")
    assert probe is not None and probe.down and probe.failures == 2
    inst = _orders().instances[0].model_copy(update={"last_heartbeat": NOW - 40})
    down = judge(inst, NOW + 6, alive=True, probe=probe, probe_now=NOW + 6, pins=3)
    assert down.reason == "liveness probe failed 2 time(s) in a row (ClientConnectorError)"
    shown = down.as_json()
    assert shown["alive"] is False and shown["probe"]["age"] == 1.0 and shown["pins"] == 3
    assert "127.0.0.1" not in json.dumps(shown)
    expired = judge(inst, NOW + 6, alive=False, probe=probe, probe_now=NOW + 6)
    assert expired.reason == "heartbeat missed: last one 46s ago"
    draining = judge(inst.model_copy(update={"status": "draining"}), NOW + 6, alive=False, probe=probe)
    assert draining.reason == "status draining"
    book.alive("orders", "orders-0", ok=True, check=check, now=NOW + 10)
    back = book.last("orders", "orders-0")
    assert back is not None and back.ok and not back.down
    assert judge(inst, NOW + 10, alive=True, probe=back).available
