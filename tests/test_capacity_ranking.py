"""Capacity-aware ranking (seed 001, 3.2): a near tie by meaning goes to the agent with free capacity, if any."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from reach_plugins import AgentDescriptor, Capability, ReachEnhancer
from reach_plugins.config.loader import parse_config
from reach_plugins.errors import ConfigError
from reach_plugins.frameworks.toolcalls import ToolCall, ToolMapper
from reach_plugins.matching import CapabilityMatcher
from reach_plugins.model import Instance
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing.capacity import FreeCapacity
from reach_plugins.transport import Call, MockTransport

TOOL = ("where_is_parcel", "Where is my parcel right now")
SIMILARITY = {"track parcel": 0.90, "find shipment": 0.87, "forecast weather": 0.10, "weather report": 0.10}
"""Cosine of the tool's text with each capability's (the test's embedder makes exactly these)."""
MARGIN = 0.05
CROSSOVER = (SIMILARITY["track parcel"] - SIMILARITY["find shipment"] + MARGIN) * 0.7 / 0.3
"""The load of the more similar agent above which the idle, less similar one wins (weights 0.7 / 0.3)."""


def embed(texts: Sequence[str]) -> list[list[float]]:
    """The tool is (1, 0); a capability sits at its stated cosine from it."""
    vectors = []
    for text in texts:
        cos = next((value for words, value in SIMILARITY.items() if text.startswith(words)), None)
        vectors.append([1.0, 0.0] if cos is None else [cos, math.sqrt(1 - cos * cos)])
    return vectors


def matcher() -> CapabilityMatcher:
    return CapabilityMatcher((), embedder=embed, threshold=0.5, margin=MARGIN)


class Clock:
    """Hand-moved time, shared by the registry (heartbeats) and the capacity table (its ttl)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


async def estate(clock: Clock, parcels: float, shipments: float, meteo: float = 0.0) -> MemoryRegistry:
    """Two agents of 2 instances, each offering one of the two near-equal capabilities, at the given loads."""
    registry = MemoryRegistry(clock=clock)
    offers = {
        "parcels": (Capability(name="track_parcel", description="where a parcel is"), parcels),
        "shipments": (Capability(name="find_shipment", description="where a shipment is"), shipments),
    }
    offers["meteo"] = (Capability(name="forecast_weather", description="weather"), meteo)
    for name, (capability, load) in offers.items():
        await registry.register_agent(AgentDescriptor(name=name, capabilities=[capability]))
        for n in range(2):
            endpoint = f"http://127.0.0.1:{9100 + n}"
            instance = Instance(agent=name, instance_id=f"{name}-{n}", endpoint=endpoint, load=load)
            await registry.register_instance(instance)
    return registry


def mapper(registry: MemoryRegistry, clock: Clock, **options: Any) -> ToolMapper:
    capacity = FreeCapacity(registry, clock=clock, ttl=1.0)
    return ToolMapper(registry, match="semantic", matcher=matcher(), capacity=capacity, **options)


def served(call: Call) -> dict[str, Any]:
    return {"agent": call.agent.name}


@pytest.fixture
def busy_parcels(clock: Clock) -> Iterator[ReachEnhancer]:
    """An enhancer over the estate where the more similar agent is 90 % loaded and the other idle."""
    registry = asyncio.run(estate(clock, parcels=0.9, shipments=0.0))
    with ReachEnhancer(registry=registry, transport=MockTransport(served), match="semantic", matcher=matcher()) as e:
        yield e


def test_equal_capacity_keeps_the_tie(clock: Clock) -> None:
    """With equal free capacity a near tie stays ``ambiguous`` (today's behaviour), both parts recorded."""
    registry = asyncio.run(estate(clock, parcels=0.4, shipments=0.4))
    found = mapper(registry, clock).explain(*TOOL)
    assert (found.capability, found.rule) == (None, "ambiguous")
    assert [(c.capability, round(c.similarity, 3), round(c.capacity, 3)) for c in found.contenders] == [
        ("track_parcel", 0.9, 0.6),
        ("find_shipment", 0.87, 0.6),
    ]


def test_an_idle_less_similar_agent_wins_over_a_busy_one(busy_parcels: ReachEnhancer) -> None:
    """0.7 x similarity + 0.3 x free capacity: the idle agent's capability is chosen, and the call reaches it."""
    found = busy_parcels.explain(*TOOL)
    assert (found.capability, found.rule) == ("find_shipment", "capacity")
    best, other = found.contenders
    assert (best.capability, round(best.similarity, 3), best.capacity) == ("find_shipment", 0.87, 1.0)
    assert best.score == pytest.approx(0.7 * 0.87 + 0.3 * 1.0)
    assert (other.capability, round(other.capacity, 3)) == ("track_parcel", 0.1)
    assert other.score == pytest.approx(0.7 * 0.90 + 0.3 * 0.1)
    assert "free capacity 1.00" in found.detail and "similarity 0.900" in found.detail
    decision = busy_parcels.decide(ToolCall(TOOL[0], description=TOOL[1]))
    assert decision.remote and decision.capability is not None and decision.capability.name == "find_shipment"
    result = busy_parcels.reach(ToolCall(TOOL[0], description=TOOL[1], call_id="c1"))
    assert result.ok and result.route is not None and result.route.agent == "shipments"
    ranking = result.route.as_dict()["ranking"]
    scores = [(r["capability"], round(r["score"], 3)) for r in ranking]
    assert scores == [("find_shipment", 0.909), ("track_parcel", 0.66)]
    assert json.loads(json.dumps(ranking)) == list(ranking)  # the adapters' artifacts carry it as JSON


@pytest.mark.parametrize(
    ("load", "expected"),
    [(CROSSOVER - 0.02, (None, "ambiguous")), (CROSSOVER + 0.02, ("find_shipment", "capacity"))],
)
def test_the_crossover_load(clock: Clock, load: float, expected: tuple[str | None, str]) -> None:
    """Below the crossover load of the more similar agent the tie holds; above it the idle agent wins."""
    registry = asyncio.run(estate(clock, parcels=load, shipments=0.0))
    found = mapper(registry, clock).explain(*TOOL)
    assert (found.capability, found.rule) == expected


def test_a_load_change_moves_the_choice_within_the_ttl(clock: Clock) -> None:
    """Ranked ties are not cached: heartbeats that swap the loads swap the choice once the capacity table expires."""
    registry = asyncio.run(estate(clock, parcels=0.9, shipments=0.0))
    tools = mapper(registry, clock)
    assert tools.explain(*TOOL).capability == "find_shipment"

    async def swap() -> None:
        for n in range(2):
            await registry.heartbeat("parcels", f"parcels-{n}", 1, load=0.0)
            await registry.heartbeat("shipments", f"shipments-{n}", 1, load=0.9)

    asyncio.run(swap())
    assert tools.explain(*TOOL).capability == "find_shipment"  # the table is at most ttl old
    clock.now += 1.0
    found = tools.explain(*TOOL)
    assert (found.capability, found.rule) == ("track_parcel", "capacity")


def test_instances_that_cannot_take_work_have_no_free_capacity(clock: Clock) -> None:
    """Draining and down instances count for nothing; an agent with no ready instance has capacity 0."""
    registry = asyncio.run(estate(clock, parcels=0.0, shipments=0.0))

    async def drain() -> None:
        await registry.heartbeat("parcels", "parcels-0", 1, status="draining")
        await registry.heartbeat("shipments", "shipments-0", 1, status="down")
        await registry.heartbeat("shipments", "shipments-1", 1, status="down")

    asyncio.run(drain())
    capacity = FreeCapacity(registry, clock=clock)
    assert (capacity.agent("parcels"), capacity.agent("shipments")) == (1.0, 0.0)
    assert (capacity("track_parcel"), capacity("find_shipment"), capacity("unknown_thing")) == (1.0, 0.0, 0.0)


def test_no_weights_leave_the_tie_to_the_matcher(clock: Clock) -> None:
    """``capacity_weights=None`` ranks by similarity alone: the busy/idle tie stays ambiguous."""
    registry = asyncio.run(estate(clock, parcels=0.9, shipments=0.0))
    found = mapper(registry, clock, capacity_weights=None).explain(*TOOL)
    assert (found.capability, found.rule, found.contenders) == (None, "ambiguous", ())


def test_weights_come_from_the_enhancer_and_the_config(clock: Clock) -> None:
    """Weights are configurable; weights that do not sum to 1, or give similarity nothing, are refused by name."""
    registry = asyncio.run(estate(clock, parcels=0.9, shipments=0.0))
    transport = MockTransport(served)
    weights = parse_config({"agents": [], "matching": {"capacity_weights": [1.0, 0.0]}}).matching.capacity_weights
    with ReachEnhancer(
        registry=registry, transport=transport, match="semantic", matcher=matcher(), capacity_weights=weights
    ) as e:
        assert e.explain(*TOOL).rule == "ambiguous"  # capacity given no weight: the matcher's tie
    for bad, fix in (((0.6, 0.6), "sum to 1"), ((0.0, 1.0), "similarity no weight"), ((0.7,), "two numbers")):
        with pytest.raises(ConfigError, match=fix):
            ReachEnhancer(
                registry=registry, transport=transport, match="semantic", matcher=matcher(), capacity_weights=bad
            )
    with pytest.raises(ConfigError, match=r"matching\.capacity_weights: .*sum to 1"):
        parse_config({"agents": [], "matching": {"capacity_weights": [0.5, 0.6]}})
    assert parse_config({"agents": []}).matching.capacity_weights == (0.7, 0.3)


def test_a_clear_match_ignores_capacity(clock: Clock) -> None:
    """Outside a tie similarity decides alone: a clearly best capability wins even when its agent is saturated."""
    registry = asyncio.run(estate(clock, parcels=0.0, shipments=0.0, meteo=1.0))
    found = mapper(registry, clock).explain("weather_report", "for my city")
    assert (found.capability, found.rule, found.contenders) == ("forecast_weather", "semantic", ())
