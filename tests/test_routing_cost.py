"""Cost-based routing: within a priority tier the cheapest healthy offer takes new work (LiteLLM's cost-based
routing); equal costs share by weight; priority comes first; a pinned session stays."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from registry_conformance import FakeClock, agent, tracked

from reach_plugins.model import ReachRequest
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Router


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def registry(clock: FakeClock) -> MemoryRegistry:
    return MemoryRegistry(clock=clock)


def router(registry: MemoryRegistry) -> Router:
    return Router(registry, clock=registry.clock, rng=random.Random(7))


def ask(**fields: Any) -> ReachRequest:
    return ReachRequest.model_validate({"capability": "query_order", **fields})


def picks(r: Router, times: int, **fields: Any) -> Counter[str]:
    return Counter(f"{x.agent.name}/{x.instance.instance_id}" for x in (r.route(ask(**fields)) for _ in range(times)))


def offer(name: str, *, cost: float | None = None, capability_cost: float | None = None, **routing: Any) -> Any:
    """An agent offering query_order at ``routing.cost`` ``cost`` (and the capability's own ``capability_cost``)."""
    capability: dict[str, Any] = {"name": "query_order"}
    if capability_cost is not None:
        capability["cost"] = capability_cost
    if cost is not None:
        routing["cost"] = cost
    return agent(name, endpoints=1, capabilities=[capability], routing=routing)


def test_the_cheapest_agent_of_a_tier_takes_every_new_request(registry: MemoryRegistry) -> None:
    """A cheaper agent wins over a dearer one of the same priority, whatever the dearer one's weight."""
    registry.put_agent(offer("cheap", cost=0.1, weight=1))
    registry.put_agent(offer("dear", cost=1.0, weight=1000))
    r = router(registry)
    assert set(picks(r, 50)) == {"cheap/cheap-0"}
    reason = r.route(ask()).decision.reason
    assert "priority tier 1, cost 0.1: the cheapest with a healthy instance" in reason


def test_capability_cost_overrides_the_agents_routing_cost(registry: MemoryRegistry) -> None:
    """An agent cheap overall but dear for this capability loses to one cheap for it."""
    registry.put_agent(offer("generalist", cost=0.1, capability_cost=5.0))
    registry.put_agent(offer("specialist", cost=1.0))
    assert set(picks(router(registry), 20)) == {"specialist/specialist-0"}


def test_equal_costs_share_by_weight_and_dearer_ones_wait(registry: MemoryRegistry) -> None:
    """Offers of the same priority and cost share by smooth weighted round robin; a dearer one gets nothing."""
    registry.put_agent(offer("big", cost=0.5, weight=300))
    registry.put_agent(offer("small", cost=0.5, weight=100))
    registry.put_agent(offer("dear", cost=0.6, weight=10_000))
    counts = picks(router(registry), 400)
    assert abs(counts["big/big-0"] - 300) <= 2 and abs(counts["small/small-0"] - 100) <= 2
    assert counts["dear/dear-0"] == 0


def test_priority_comes_before_cost(registry: MemoryRegistry) -> None:
    """A dear agent of priority 1 is preferred to a free one of priority 2."""
    registry.put_agent(offer("first", cost=10.0, priority=1))
    registry.put_agent(offer("backup", cost=0.0, priority=2))
    assert set(picks(router(registry), 10)) == {"first/first-0"}


async def test_a_dearer_agent_serves_while_the_cheaper_one_is_down_and_hands_back(
    registry: MemoryRegistry, clock: FakeClock
) -> None:
    """The cheapest *healthy* offer wins: the dearer one serves while the cheap one misses heartbeats, then not."""
    await registry.register_agent(offer("cheap", cost=0.1))
    registry.put_agent(offer("dear", cost=1.0))
    await registry.deregister_instance("cheap", "cheap-0")
    await registry.register_instance(tracked("cheap", "c-1", clock))
    r = router(registry)
    assert set(picks(r, 5)) == {"cheap/c-1"}
    clock.advance(31)
    route = r.route(ask())
    assert route.agent.name == "dear"
    decision = route.decision
    assert "cost 1: the cheapest with a healthy instance" in decision.reason
    assert any(c.instance == "c-1" and c.skipped and "heartbeat" in c.skipped for c in decision.candidates)
    await registry.heartbeat("cheap", "c-1", 1)
    assert picks(r, 10)["cheap/c-1"] >= 8, "the cheap agent must take new work back once it is healthy"


def test_a_pinned_session_stays_when_a_cheaper_agent_appears(registry: MemoryRegistry) -> None:
    """Affinity keeps a conversation where it is; cost orders only new placements."""
    registry.put_agent(offer("dear", cost=1.0))
    r = router(registry)
    assert r.route(ask(session_id="s-1")).agent.name == "dear"
    registry.put_agent(offer("cheap", cost=0.1))
    kept = r.route(ask(session_id="s-1"))
    assert (kept.agent.name, kept.affinity) == ("dear", "pinned")
    placed = r.route(ask(session_id="s-2"))
    assert (placed.agent.name, placed.affinity) == ("cheap", "new")
    assert "cost 0.1: the cheapest" in placed.decision.reason


def test_candidates_list_the_cheapest_first(registry: MemoryRegistry) -> None:
    """Broadcast and failover lists order a tier's offers by cost before weight."""
    registry.put_agent(offer("dear", cost=2.0, weight=1000))
    registry.put_agent(offer("cheap", cost=0.1, weight=1))
    registry.put_agent(offer("middle", cost=1.0, weight=500))
    assert [route.agent.name for route in router(registry).candidates(ask())] == ["cheap", "middle", "dear"]


def test_failover_goes_to_the_next_cheapest(registry: MemoryRegistry) -> None:
    """With the cheapest excluded (it failed), the next cheapest is tried, not the heaviest."""
    registry.put_agent(offer("cheap", cost=0.1))
    registry.put_agent(offer("middle", cost=1.0, weight=1))
    registry.put_agent(offer("dear", cost=2.0, weight=1000))
    r = router(registry)
    assert r.route(ask()).agent.name == "cheap"
    assert r.route(ask(), exclude={("cheap", "cheap-0")}).agent.name == "middle"
